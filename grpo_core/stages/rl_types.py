"""The types every RL algorithm of the stage shares (``grpo.algorithm``: GRPO, online RFT, RFT,
PPO): the models a step uses, a step's groups of scored samples (``ScoredGroups``), what an advantage
estimator returns (``Advantages``; the estimators are ``estimators.py``), and which groups carry a
gradient. The step is ``rl_step.py``."""

from __future__ import annotations

from typing import NamedTuple

import torch

from grpo_core.data import Example
from grpo_core.lm.policy import Rollout
from grpo_core.rewards.scorer import Scored


class Models(NamedTuple):
    """The models of a step: the policy (trained), the frozen reference (None where the algorithm
    neither samples it nor weighs a KL to it), PPO's value model and its optimizer."""

    policy: torch.nn.Module
    ref: torch.nn.Module | None = None
    value: torch.nn.Module | None = None
    value_opt: torch.optim.Optimizer | None = None


class ScoredGroups(NamedTuple):
    """Scored samples: N questions, the rollout of their groups (N x G rows, a group's rows
    consecutive), their scores, and the seconds spent sampling and scoring them."""

    questions: list[Example]
    rollout: Rollout
    scored: Scored
    sample_s: float = 0.0
    score_s: float = 0.0

    @property
    def rewards(self) -> torch.Tensor:
        """[N x G] each solution's weighted reward (NaN where none could be given), either supervision."""
        return self.scored.outcome

    def groups(self, index: list[int], g: int) -> "ScoredGroups":
        """Groups ``index`` (of the N, each G rows), in that order: len(index) x G rows."""
        rows = torch.tensor([i * g + j for i in index for j in range(g)], dtype=torch.long)
        return ScoredGroups([self.questions[i] for i in index], self.rollout.select(rows), self.scored.select(rows))

    @staticmethod
    def cat(parts: list["ScoredGroups"], pad_id: int) -> "ScoredGroups":
        """The groups of ``parts`` in order, as one batch (reward statistics: the first part's)."""
        return ScoredGroups(
            [q for p in parts for q in p.questions],
            Rollout.cat([p.rollout for p in parts], pad_id),
            Scored.cat([p.scored for p in parts]),
            sum(p.sample_s for p in parts),
            sum(p.score_s for p in parts),
        )

    def checked(self) -> list[dict]:
        """Every completion with its question and the answer checker's verdict (the rollout log's rows)."""
        g = len(self.rewards) // max(len(self.questions), 1)
        return [
            {"question": q.question, "gold": q.gold, "completion": text, "correct": bool(ok)}
            for q, text, ok in zip(
                (q for q in self.questions for _ in range(g)), self.rollout.texts, self.scored.correct
            )
        ]


class ValueTargets(NamedTuple):
    """What PPO's value model is trained towards after the policy's update: the [B, T] values the
    advantages were computed from (the clipping's anchor) and the [B, T] returns."""

    old_values: torch.Tensor
    returns: torch.Tensor


class Advantages(NamedTuple):
    """An advantage estimator's output: [B, T] advantages, the [B, T] tokens that learn (the
    completions' tokens, less any the estimator leaves out), metrics summed over processes, the
    value model's targets where the algorithm trains one (PPO), and the seconds it took."""

    values: torch.Tensor
    mask: torch.Tensor
    stats: dict[str, float]
    value_targets: ValueTargets | None = None
    seconds: float = 0.0


def with_gradient(advantages: torch.Tensor, g: int) -> torch.Tensor:
    """[N x G, T] advantages -> [N] bool: the groups that carry a policy gradient (any non-zero
    advantage; a group without one has only the KL term)."""
    return advantages.reshape(-1, g * advantages.shape[-1]).ne(0).any(-1)

"""Rewards of GRPO's rollouts: the rule reward, the ORM, the PRM, or a weighted sum of them.

Completions are untrusted model output: the rule reward only parses and compares
(grpo_core.verify), and the reward models only read tokens. Non-finite scores are never passed on
silently: they are counted, and the affected completion gets no advantage (its group's statistics
are taken over the others).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from grpo_core.config import GRPOConfig
from grpo_core.lm.policy import Rollout
from grpo_core.rewards.steps import rollout_step_ends
from grpo_core.verify import is_correct


class RewardError(RuntimeError):
    """The reward is broken (no completion of a step got a finite reward): the stage stops, and
    its last checkpoint stays the resume point."""


def _checked(completion: str, gold: str) -> float:
    try:
        return float(is_correct(completion, gold))
    except Exception:  # noqa: BLE001 - the checker only parses; if it ever fails, no verdict
        return float("nan")


def rule_reward(completions: list[str], golds: list[str]) -> torch.Tensor:
    """[B] 1.0 where the completion's final answer equals the gold answer, else 0.0; NaN (no
    verdict: counted, and no advantage) where the checker raised on a completion: one hostile
    completion must not stop a long run."""
    return torch.tensor([_checked(c, g) for c, g in zip(completions, golds)])


# Scored.stats that are counts: summed over processes (the others are means).
COUNT_STATS = ("reward/rule_errors", "reward/no_step_completions", "reward/nonfinite_completions")


@dataclass
class Scored:
    """What the advantages are computed from. Shapes: B completions, K steps.

    ``outcome`` means the same under either supervision: sum_w w * source, the PRM's source being
    the solution's lowest step probability (``train/reward_mean`` is its mean). Under process
    supervision the advantages come from ``step_rewards`` instead."""

    outcome: torch.Tensor  # [B] weighted reward of each whole solution (NaN: no verdict)
    correct: torch.Tensor  # [B] rule reward, logged whatever drives training
    supervision: Literal["outcome", "process"]  # which of the two the advantages read
    step_rewards: torch.Tensor | None = None  # [B, K] process supervision (NaN where no step)
    step_ends: torch.Tensor | None = None  # [B, K] token where each step's advantage region ends
    step_mask: torch.Tensor | None = None  # [B, K] steps that count (none for dropped completions)
    stats: dict[str, float] | None = None
    # [B] each learned reward model's own score of the solution (``orm``: its probability; ``prm``:
    # the lowest step probability), whatever its weight: staleness is measured on these against
    # ``correct`` (``grpo.step_metrics``).
    learned: dict[str, torch.Tensor] = field(default_factory=dict)

    def select(self, index: torch.Tensor) -> "Scored":
        """The completions ``index`` [U] (long), in that order; ``stats`` stay those of the whole batch."""
        pick = lambda x: None if x is None else x[index]  # noqa: E731
        return Scored(
            self.outcome[index],
            self.correct[index],
            self.supervision,
            pick(self.step_rewards),
            pick(self.step_ends),
            pick(self.step_mask),
            self.stats,
            {k: v[index] for k, v in self.learned.items()},
        )

    @staticmethod
    def cat(parts: list["Scored"]) -> "Scored":
        """The completions of ``parts`` in order (steps padded to the most, as absent steps);
        ``stats`` are the first part's."""
        out = Scored(
            torch.cat([s.outcome for s in parts]),
            torch.cat([s.correct for s in parts]),
            parts[0].supervision,
            stats=parts[0].stats,
            learned={k: torch.cat([s.learned[k] for s in parts]) for k in parts[0].learned},
        )
        if parts[0].supervision == "outcome":
            return out
        k = max(s.step_rewards.shape[1] for s in parts)
        widen = lambda x, fill: torch.nn.functional.pad(x, (0, k - x.shape[1]), value=fill)  # noqa: E731
        out.step_rewards = torch.cat([widen(s.step_rewards, torch.nan) for s in parts])
        out.step_ends = torch.cat([widen(s.step_ends, 0) for s in parts])
        out.step_mask = torch.cat([widen(s.step_mask, False) for s in parts])
        return out


class RewardScorer:
    """Scores rollouts with ``weights`` over ``rule`` / ``orm`` / ``prm``.

    A solution's reward (``Scored.outcome``, both supervisions) = sum_w w * source, with prm = the
    lowest step probability (Math-Shepherd's aggregation). process: step k's reward = w_prm * P(step
    k right), and the outcome sources' (rule, ORM) weighted reward is added to each solution's last
    step. A completion left without a finite reward (no verdict, a NaN score) gets no advantage and
    is counted (``reward/nonfinite_completions``).
    """

    def __init__(
        self, weights: dict[str, float], supervision: str, tokenizer, separator: str = "\n", orm=None, prm=None
    ) -> None:
        self.weights = {k: w for k, w in weights.items() if w > 0}
        self.supervision, self.tokenizer, self.separator = supervision, tokenizer, separator
        self.orm, self.prm = orm, prm
        require_reward_models(self.weights, [k for k in ("orm", "prm") if getattr(self, k) is not None])

    @classmethod
    def for_recipe(
        cls,
        cfg: GRPOConfig,
        tokenizer,
        separator: str = "\n",
        paths: dict[str, str | Path] | None = None,
        device: torch.device | str = "cpu",
    ) -> "RewardScorer":
        """The recipe's reward (``grpo.reward_weights`` under ``grpo.supervision``, read here only).
        ``paths``: the folders of the reward models the weights use (``orm``, ``prm``), placed on
        ``device`` (the policy's); a weighted one missing is an error."""
        from grpo_core.rewards.heads import load_reward_model

        paths = paths or {}
        require_reward_models(cfg.reward_weights, paths)
        models = {
            k: load_reward_model(paths[k], k).to(device).eval().requires_grad_(False) for k in cfg.reward_models_used
        }
        return cls(cfg.reward_weights, cfg.supervision, tokenizer, separator, **models)

    @torch.no_grad()
    def __call__(self, rollout: Rollout, golds: list[str]) -> Scored:
        from grpo_core.rewards.heads import last_token_index, orm_logits, prm_step_logits

        # The reward models read each distinct completion once (a group repeats its likeliest one).
        rows = rollout.distinct()
        once = rollout.select(rows.index) if rows.repeats else rollout
        rule = rule_reward(rollout.texts, golds)
        correct = rule.nan_to_num(0.0)
        stats: dict[str, float] = {"reward/rule_errors": float(rule.isnan().sum())}
        learned: dict[str, torch.Tensor] = {}
        outcome = self.weights["rule"] * rule if "rule" in self.weights else torch.zeros_like(rule)
        if "orm" in self.weights:
            orm = torch.sigmoid(orm_logits(self.orm, once))[rows.inverse]
            stats["reward/orm_mean"] = (
                float(orm[torch.isfinite(orm)].mean()) if torch.isfinite(orm).any() else float("nan")
            )
            outcome = outcome + self.weights["orm"] * orm
            learned["orm"] = orm
        if "prm" not in self.weights:
            return Scored(outcome, correct, "outcome", stats=stats | _nonfinite(outcome), learned=learned)
        ends, mask = rollout_step_ends(self.tokenizer, once, self.separator)
        steps = torch.sigmoid(prm_step_logits(self.prm, once, ends))[rows.inverse]
        ends, mask = ends[rows.inverse.to(ends.device)], mask[rows.inverse.to(mask.device)]
        steps = torch.where(mask, steps, torch.nan)
        no_steps = ~mask.any(dim=1)
        # A completion with no step has no PRM verdict: NaN here, counted and neutralised later.
        lowest = torch.where(no_steps, torch.nan, torch.where(mask, steps, torch.inf).min(dim=1).values)
        finite = torch.isfinite(lowest)
        stats.update(
            {
                "reward/no_step_completions": float(no_steps.sum()),
                "reward/steps_per_completion": float(mask.sum(dim=1).float().mean()),
                # the learned reward beside train/accuracy (the checker's): a widening gap is a hack
                "reward/prm_lowest_mean": float(lowest[finite].mean()) if finite.any() else float("nan"),
            }
        )
        learned["prm"] = lowest
        solution = outcome + self.weights["prm"] * lowest
        if self.supervision == "outcome":
            return Scored(solution, correct, "outcome", stats=stats | _nonfinite(solution), learned=learned)
        rows = torch.arange(len(mask))
        last = (mask.sum(dim=1) - 1).clamp(min=0)
        step_rewards = self.weights["prm"] * steps
        step_rewards[rows, last] += outcome
        # A completion with a non-finite step reward is dropped whole (zero advantage everywhere).
        bad_rows = (mask & ~torch.isfinite(step_rewards)).any(dim=1)
        stats["reward/nonfinite_completions"] = float(bad_rows.sum())
        step_mask = mask & ~bad_rows[:, None]
        # For the advantage the last step extends to the last token (EOS), so the decision to stop
        # is rewarded with the solution; the PRM still read its score at the step's own end.
        adv_ends = ends.clone()
        adv_ends[rows, last] = torch.maximum(ends[rows, last], last_token_index(rollout.completion_mask))
        return Scored(solution, correct, "process", step_rewards, adv_ends, step_mask, stats, learned)


def require_reward_models(weights: dict[str, float], given) -> None:
    """The check that every reward model ``weights`` use (a weight > 0 on ``orm`` / ``prm``) is among
    ``given`` (names): a recipe's GRPO never silently drops a reward source."""
    missing = [k for k in ("orm", "prm") if weights.get(k, 0) > 0 and k not in given]
    if missing:
        raise ValueError(f"grpo.reward_weights uses {', '.join(missing)} but no such model was given")


def _nonfinite(outcome: torch.Tensor) -> dict[str, float]:
    """Outcome supervision's count of completions without a finite reward (no advantage for them)."""
    return {"reward/nonfinite_completions": float((~torch.isfinite(outcome)).sum())}

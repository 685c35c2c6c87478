"""Rewards of GRPO's rollouts: the rule reward, the ORM, the PRM, or a weighted sum of them.

Completions are untrusted model output: the rule reward only parses and compares
(grpo_core.verify), and the reward models only read tokens. Non-finite scores are never passed on
silently: they are counted, and the affected completion gets no advantage (its group's statistics
are taken over the others).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from grpo_core.config import GRPOConfig
from grpo_core.lm.policy import Rollout
from grpo_core.rewards import heads
from grpo_core.rewards.steps import exact_step_labels, rollout_step_ends, step_texts
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
    supervision the advantages come from ``base`` and ``step_scores`` instead."""

    outcome: torch.Tensor  # [B] weighted reward of each whole solution (NaN: no verdict)
    correct: torch.Tensor  # [B] rule reward, logged whatever drives training
    supervision: Literal["outcome", "process"]  # which of the two the advantages read
    # Process supervision (``advantages.PROCESS_CREDIT`` turns these into token advantages):
    step_scores: torch.Tensor | None = None  # [B, K] the PRM's probability of each step (NaN where no step)
    step_ends: torch.Tensor | None = None  # [B, K] token where each step's advantage region ends
    step_mask: torch.Tensor | None = None  # [B, K] steps that count (none for dropped completions)
    stats: dict[str, float] | None = None
    # [B] each learned reward model's own score of the solution (``orm``: its probability; ``prm``:
    # the lowest step probability), whatever its weight: staleness is measured on these against
    # ``correct`` (``grpo.step_metrics``).
    learned: dict[str, torch.Tensor] = field(default_factory=dict)
    base: torch.Tensor | None = None  # [B] the outcome sources' weighted reward (rule, ORM); None: none weighted
    prm_weight: float = 0.0  # the PRM's weight
    by_checker: bool = False  # the checker is weighted: its verdicts are the outcome classes

    def select(self, index: torch.Tensor) -> "Scored":
        """The completions ``index`` [U] (long), in that order; ``stats`` stay those of the whole batch."""
        pick = lambda x: None if x is None else x[index]  # noqa: E731
        return dataclasses.replace(
            self,
            outcome=self.outcome[index],
            correct=self.correct[index],
            step_scores=pick(self.step_scores),
            step_ends=pick(self.step_ends),
            step_mask=pick(self.step_mask),
            learned={k: v[index] for k, v in self.learned.items()},
            base=pick(self.base),
        )

    @staticmethod
    def cat(parts: list["Scored"]) -> "Scored":
        """The completions of ``parts`` in order (steps padded to the most, as absent steps);
        ``stats`` are the first part's."""
        first = parts[0]
        out = dataclasses.replace(
            first,
            outcome=torch.cat([s.outcome for s in parts]),
            correct=torch.cat([s.correct for s in parts]),
            learned={k: torch.cat([s.learned[k] for s in parts]) for k in first.learned},
            base=None if first.base is None else torch.cat([s.base for s in parts]),
        )
        if first.supervision == "outcome":
            return out
        k = max(s.step_scores.shape[1] for s in parts)
        widen = lambda x, fill: torch.nn.functional.pad(x, (0, k - x.shape[1]), value=fill)  # noqa: E731
        out.step_scores = torch.cat([widen(s.step_scores, torch.nan) for s in parts])
        out.step_ends = torch.cat([widen(s.step_ends, 0) for s in parts])
        out.step_mask = torch.cat([widen(s.step_mask, False) for s in parts])
        return out


class RewardScorer:
    """Scores rollouts with ``weights`` over ``rule`` / ``orm`` / ``prm``.

    A solution's reward (``Scored.outcome``, both supervisions) = sum_w w * source, with prm = the
    lowest step probability (Math-Shepherd's aggregation). process: the PRM's step probabilities
    beside the outcome sources' (rule, ORM) weighted reward, combined by ``grpo.process_credit``
    (``advantages.PROCESS_CREDIT``). A completion left without a finite reward (no verdict, a NaN
    score) gets no advantage and is counted (``reward/nonfinite_completions``).
    """

    def __init__(
        self, weights: dict[str, float], supervision: str, tokenizer, separator: str = "\n", orm=None, prm=None
    ) -> None:
        """``prm``: a PRM model, or ``ORACLE``: the arithmetic task's exact step checker."""
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
        paths = paths or {}
        require_reward_models({k: cfg.reward_weights[k] for k in cfg.reward_models_used}, paths)
        models = {
            k: heads.load_reward_model(paths[k], k).to(device).eval().requires_grad_(False)
            for k in cfg.reward_models_used
        }
        if cfg.prm_oracle:
            models["prm"] = ORACLE
        return cls(cfg.reward_weights, cfg.supervision, tokenizer, separator, **models)

    @torch.no_grad()
    def __call__(self, rollout: Rollout, golds: list[str], questions: list[str] | None = None) -> Scored:
        """Scores of ``rollout``'s completions of ``questions`` (one per row; the oracle PRM reads
        them) with gold answers ``golds``."""
        # The reward models read each distinct completion once (a group repeats its likeliest one).
        rows = rollout.distinct()
        once = rollout.select(rows.index) if rows.repeats else rollout
        rule = rule_reward(rollout.texts, golds)
        correct = rule.nan_to_num(0.0)
        stats: dict[str, float] = {"reward/rule_errors": float(rule.isnan().sum())}
        learned: dict[str, torch.Tensor] = {}
        outcome = self.weights["rule"] * rule if "rule" in self.weights else torch.zeros_like(rule)
        if "orm" in self.weights:
            orm = torch.sigmoid(heads.orm_logits(self.orm, once))[rows.inverse]
            stats["reward/orm_mean"] = (
                float(orm[torch.isfinite(orm)].mean()) if torch.isfinite(orm).any() else float("nan")
            )
            outcome = outcome + self.weights["orm"] * orm
            learned["orm"] = orm
        if "prm" not in self.weights:
            return Scored(outcome, correct, "outcome", stats=stats | _nonfinite(outcome), learned=learned)
        steps, ends, mask = self.step_scores(once, rows, golds, questions)
        lowest = _lowest_step(steps, mask, stats)
        if self.prm is not ORACLE:
            learned["prm"] = lowest
        solution = outcome + self.weights["prm"] * lowest
        if self.supervision == "outcome":
            return Scored(solution, correct, "outcome", stats=stats | _nonfinite(solution), learned=learned)
        rows = torch.arange(len(mask))
        last = (mask.sum(dim=1) - 1).clamp(min=0)
        base = outcome if {"rule", "orm"} & set(self.weights) else None
        # A completion with a non-finite step score or outcome reward is dropped whole (zero
        # advantage everywhere).
        bad_rows = (mask & ~torch.isfinite(steps)).any(dim=1) | (mask.any(dim=1) & ~torch.isfinite(outcome))
        stats["reward/nonfinite_completions"] = float(bad_rows.sum())
        step_mask = mask & ~bad_rows[:, None]
        # For the advantage the last step extends to the last token (EOS), so the decision to stop
        # is rewarded with the solution; the PRM still read its score at the step's own end.
        adv_ends = ends.clone()
        adv_ends[rows, last] = torch.maximum(ends[rows, last], heads.last_token_index(rollout.completion_mask))
        return Scored(
            solution,
            correct,
            "process",
            steps,
            adv_ends,
            step_mask,
            stats,
            learned,
            base=base,
            prm_weight=self.weights["prm"],
            by_checker="rule" in self.weights,
        )

    def step_scores(
        self, once: Rollout, rows, golds: list[str], questions: list[str] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each step's score (the PRM's probability, or the oracle's 0/1) of the distinct completions
        ``once`` (``rows``: ``Rollout.distinct``'s), spread back to every row: [B, K] scores (NaN on
        padding), [B, K] step ends and [B, K] mask."""
        ends, mask = rollout_step_ends(self.tokenizer, once, self.separator)
        if self.prm is ORACLE:
            pick = rows.index.tolist()
            steps = oracle_step_scores(
                None if questions is None else [questions[i] for i in pick],
                once.texts,
                [golds[i] for i in pick],
                self.separator,
            )
            steps = torch.nn.functional.pad(steps, (0, mask.shape[1] - steps.shape[1]))[rows.inverse]
        else:
            steps = torch.sigmoid(heads.prm_step_logits(self.prm, once, ends))[rows.inverse]
        ends, mask = ends[rows.inverse.to(ends.device)], mask[rows.inverse.to(mask.device)]
        return torch.where(mask, steps, torch.nan), ends, mask


ORACLE = "oracle"  # the PRM of ``grpo.prm_oracle``: the arithmetic task's exact step checker


def oracle_step_scores(questions: list[str] | None, texts: list[str], golds: list[str], separator: str) -> torch.Tensor:
    """[B, K] 1.0 for each step of each completion that ``steps.exact_step_labels`` calls right
    (every line so far is the reference chain's), else 0.0; K = the most steps (padding 0)."""
    if questions is None:
        raise ValueError("the oracle PRM checks steps against the question: pass the questions")
    labels = [exact_step_labels(q, step_texts(t, separator), g) for q, t, g in zip(questions, texts, golds)]
    if any(lab is None for lab in labels):
        raise ValueError("the oracle PRM checks the arithmetic task's chains; a question is not one")
    out = torch.zeros(len(labels), max(1, max(map(len, labels))))
    for i, lab in enumerate(labels):
        out[i, : len(lab)] = torch.tensor(lab, dtype=torch.float32)
    return out


def require_reward_models(weights: dict[str, float], given) -> None:
    """The check that every reward model ``weights`` use (a weight > 0 on ``orm`` / ``prm``) is among
    ``given`` (names): a recipe's GRPO never silently drops a reward source."""
    missing = [k for k in ("orm", "prm") if weights.get(k, 0) > 0 and k not in given]
    if missing:
        raise ValueError(f"grpo.reward_weights uses {', '.join(missing)} but no such model was given")


def _lowest_step(steps: torch.Tensor, mask: torch.Tensor, stats: dict[str, float]) -> torch.Tensor:
    """[B] each completion's lowest step score of ``steps`` [B, K] (``mask``: its steps); the
    counts of steps and the mean lowest score into ``stats``."""
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
    return lowest


def _nonfinite(outcome: torch.Tensor) -> dict[str, float]:
    """Outcome supervision's count of completions without a finite reward (no advantage for them)."""
    return {"reward/nonfinite_completions": float((~torch.isfinite(outcome)).sum())}

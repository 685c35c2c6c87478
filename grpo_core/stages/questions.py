"""Which questions a GRPO step learns from: the question curriculum and dynamic sampling.

A group whose G rewards are all equal has zero advantage and gives no gradient (only the KL term).
Where the policy rarely solves anything (a small model on GSM8K after SFT: 97% of answers wrong),
most groups are like that. Two remedies, each a recipe setting, both off by default (the paper
draws questions uniformly and keeps every group):

- **Curriculum** (``grpo.curriculum``; open-r1's pass-rate filter, softened): the reward-data
  stage samples the round's policy on RL questions; a question it solved sometimes (0 < right <
  samples) is likely to give a group with spread. That share of each step's questions comes from
  those questions, the rest uniformly from the whole pool. Refreshed each round with the new
  samples.
- **Dynamic sampling** (``grpo.redraws``; DAPO §3.2, OpenRLHF ``dynamic_filtering``): a question
  slot of the step whose group has no spread draws another question and samples its group again,
  up to ``redraws`` times; the first group with spread takes the slot. A slot still without one
  keeps its last group, so the batch keeps its shape (every process trains the same number of
  rows). Extra sampling is bounded by ``redraws`` x the step's groups. Where the answer checker is
  weighted, "spread" means its verdicts differ (``passes_dynamic_sampling``), so a learned reward beside it
  does not change which questions train.

The step draws (``rl_step.explore``); this module says which questions. Exact under resume and under
several processes: slot i's k-th draw is the question ``QuestionSampler.redraw(step, i, k)``
sampled with the seed ``seeds.draw_seed(step seed, k)`` on rows i * G ..., so it depends on (seed,
step, slot, k) only, never on which process draws it or on the other slots. Not a library's: TRL
and verl filter whole generation batches, which is not exact under a change of process count.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import torch

from grpo_core.config import GRPOConfig
from grpo_core.data import Example
from grpo_core.seeds import step_seed
from grpo_core.stages.estimators import group_values
from grpo_core.stages.rl_types import ScoredGroups, with_gradient


def solved_sometimes(rates: dict[str, tuple[int, int]]) -> set[str]:
    """Questions with 0 < right < samples (``rates``: question -> (right, samples))."""
    return {q for q, (right, n) in rates.items() if 0 < right < n}


class QuestionSampler:
    """A step's questions from the RL ``pool``: uniformly (the paper), or ``share`` of them from
    the questions the policy solved sometimes in ``rates`` (question -> (right, samples))."""

    def __init__(
        self, pool: list[Example], seed: int, rates: dict[str, tuple[int, int]] | None = None, share: float = 0.0
    ) -> None:
        self.pool, self.seed, self.share = pool, seed, share
        sometimes = solved_sometimes(rates or {})
        self.sometimes = [e for e in pool if e.question in sometimes]
        if share > 0 and not self.sometimes:  # a policy that now solves all (or none): a later round goes on
            warnings.warn(
                f"grpo.curriculum = {share}: none of the {len(pool)} RL questions was solved sometimes by the "
                f"policy in its reward-data samples ({len(rates or {})} questions measured): questions are "
                f"drawn uniformly; sample more (reward_data.questions, samples_per_question)",
                stacklevel=2,
            )
            self.share = 0.0

    def step(self, step: int, n: int) -> list[Example]:
        """The ``n`` distinct questions of ``step`` (all the pool if it is smaller)."""
        rng = random.Random(step_seed(self.seed, step))
        n = min(n, len(self.pool))
        if not self.share:
            return rng.sample(self.pool, n)  # the uniform draw (the paper's)
        chosen = rng.sample(self.sometimes, min(round(self.share * n), len(self.sometimes)))
        taken = {e.question for e in chosen}
        rest = [e for e in self.pool if e.question not in taken]
        out = chosen + rng.sample(rest, n - len(chosen))
        rng.shuffle(out)  # every process's share gets its part of both
        return out

    def redraw(self, step: int, slot: int, k: int, taken: frozenset[str] = frozenset()) -> Example:
        """The question of ``slot``'s k-th redraw (k >= 1) at ``step``: from the questions solved
        sometimes with probability ``share``, else from the pool; not one of ``taken`` (the step's
        own questions) where another can be found."""
        rng = random.Random(f"{self.seed}-{step}-{slot}-{k}")
        for _ in range(100):
            pick = rng.choice(self.sometimes if self.share and rng.random() < self.share else self.pool)
            if pick.question not in taken:
                break
        return pick


def read_pass_rates(path: str | Path) -> dict[str, tuple[int, int]]:
    """question -> (right, samples) from a reward-data stage's ``pass_rates.jsonl``."""
    rates: dict[str, tuple[int, int]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        right, n = rates.get(row["question"], (0, 0))
        rates[row["question"]] = (right + row["right"], n + row["samples"])
    return rates


def passes_dynamic_sampling(ex: ScoredGroups, grpo: GRPOConfig) -> torch.Tensor:
    """[N] bool: dynamic sampling's test. Where the answer checker is weighted, the groups of ``ex``
    whose verdicts differ (DAPO's accuracy filter): a learned reward gives nearly every group spread,
    so adding one to a recipe with dynamic sampling changes the reward, not which questions train.
    With learned rewards alone (outcome supervision), the groups with spread under GRPO's estimator."""
    if grpo.reward_weights.get("rule"):  # a right and a wrong answer among the rows that got a reward
        verdicts = ex.scored.correct.reshape(-1, grpo.group_size).bool()
        scored = torch.isfinite(ex.rewards).reshape(-1, grpo.group_size)
        return (verdicts & scored).any(-1) & (~verdicts & scored).any(-1)
    return with_gradient(group_values(ex, grpo), grpo.group_size)

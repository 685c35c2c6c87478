"""The seeds RL sampling derives from the recipe's ``seed`` (a round, a step, a redraw, a sampled row,
a reward-data batch), in one place. Each depends on its arguments alone, so a resumed run, or one on
another number of processes, draws the same numbers. (SFT's packing and evaluation seed their own
draws where they make them.)"""

from __future__ import annotations

PRIME_ROW = 1_000_003  # rows (or steps) below it never share a seed across seeds
PRIME_STEP = 7919
PRIME_DRAW = 104_729


def round_seed(seed: int, round_: int) -> int:
    """RL round ``round_``'s seed: round 1 uses the recipe's, later rounds draw other questions and samples."""
    return seed + PRIME_STEP * (round_ - 1)


def step_seed(seed: int, step: int) -> int:
    """A GRPO step's questions and samples: depend only on (seed, step), so a resume redraws them."""
    return (seed * PRIME_ROW + step * PRIME_STEP) % (2**31)


def draw_seed(seed: int, k: int) -> int:
    """The sampling seed of a step's k-th draw of dynamic sampling (k = 0: the step's own seed)."""
    return seed if k == 0 else (seed * PRIME_ROW + k * PRIME_DRAW) % 2**31


def row_seed(seed: int, row: int) -> int:
    """The noise seed of one sampled row (``policy.GumbelSampler``): rows < 1,000,003 of different
    seeds never share one."""
    return (seed * PRIME_ROW + row) % 2**63


def batch_seed(seed: int, batch: int) -> int:
    """The reward-data stage's ``batch``-th sampling call (1, 2, ...)."""
    return seed * PRIME_STEP + batch

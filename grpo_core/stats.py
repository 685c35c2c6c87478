"""Learning results as statistics: mean and spread over seeds, and intervals for differences.

Two intervals, each for the question it answers:
- ``seed_interval``: the mean over seeds of a paired difference (variant seed s minus baseline seed s,
  on the same test questions), Student-t with n-1 degrees of freedom. This is what "variant A beats
  B" means for a training recipe: seeds are the repetitions.
- ``question_interval``: two fixed models on the same N questions (one seed), the paired difference
  of their accuracies with a t interval on the per-question differences (McNemar's setting), or,
  where questions come in clusters of near-duplicates, a cluster-robust one.
"""

from __future__ import annotations

import math
from collections import defaultdict

from scipy.stats import t as student_t


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n-1; 0 for a single value)."""
    n = len(xs)
    mean = sum(xs) / n
    return mean, (math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0)


def seed_interval(a: list[float], b: list[float], confidence: float = 0.95) -> dict[str, float]:
    """Mean of the per-seed differences a[s] - b[s] with its Student-t interval (NaN bounds for one
    seed: a single run says nothing about the spread)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired differences need equal, non-empty lists (got {len(a)} and {len(b)})")
    diffs = [x - y for x, y in zip(a, b)]
    mean, std = mean_std(diffs)
    n = len(diffs)
    half = student_t.ppf((1 + confidence) / 2, n - 1) * std / math.sqrt(n) if n > 1 else math.nan
    return {"mean": mean, "std": std, "low": mean - half, "high": mean + half, "n": n}


def question_interval(
    a: list[float], b: list[float], confidence: float = 0.95, clusters: list | None = None
) -> dict[str, float]:
    """Accuracy of a minus accuracy of b on the same questions, with a t interval on the
    per-question differences d_i = a_i - b_i in {-1, 0, 1} (normal for hundreds of questions; a
    question's score may also be its verdicts' mean over seeds, d_i then in [-1, 1]).
    ``clusters``: each question's cluster (near-duplicates, whose verdicts are not independent); the
    standard error is then cluster-robust: sqrt(G / (G - 1) * sum over the G clusters of (the sum of
    their d_i - mean)^2) / N, t with G - 1 degrees of freedom. Every question its own cluster (the
    default) gives the plain paired interval: sqrt(N / (N - 1) * sum (d_i - mean)^2) / N = std / sqrt(N)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired questions need equal, non-empty lists (got {len(a)} and {len(b)})")
    if clusters is not None and len(clusters) != len(a):
        raise ValueError(f"one cluster per question needed (got {len(clusters)} for {len(a)} questions)")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(diffs)
    mean = sum(diffs) / n
    deviations: dict = defaultdict(float)
    for c, d in zip(range(n) if clusters is None else clusters, diffs):
        deviations[c] += d - mean
    g = len(deviations)
    if g == 1:  # one cluster (or one question) says nothing about the spread
        half = math.nan
    else:
        se = math.sqrt(g / (g - 1) * sum(v * v for v in deviations.values())) / n
        half = student_t.ppf((1 + confidence) / 2, g - 1) * se
    out = {"mean": mean, "low": mean - half, "high": mean + half, "n": n}
    return out if clusters is None else out | {"clusters": g}

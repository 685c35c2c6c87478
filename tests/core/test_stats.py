"""The comparison statistics, by hand."""

from __future__ import annotations

import math

import pytest

from grpo_core.stats import mean_std, question_interval, seed_interval


def test_mean_std_uses_n_minus_1():
    # mean 2; squared deviations 1 + 0 + 1 = 2; / (3 - 1) = 1 -> std 1.
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([0.7]) == (0.7, 0.0)


def test_seed_interval_hand_computed():
    # Differences 0.04, 0.06, 0.08: mean 0.06, std 0.02; t(0.975, 2) = 4.302653;
    # half-width 4.302653 * 0.02 / sqrt(3) = 0.049683.
    out = seed_interval([0.84, 0.86, 0.88], [0.80, 0.80, 0.80])
    assert out["mean"] == pytest.approx(0.06) and out["std"] == pytest.approx(0.02) and out["n"] == 3
    assert (out["low"], out["high"]) == pytest.approx((0.06 - 0.049683, 0.06 + 0.049683), abs=1e-6)


def test_one_seed_has_no_interval():
    out = seed_interval([0.9], [0.8])
    assert out["mean"] == pytest.approx(0.1) and math.isnan(out["low"]) and math.isnan(out["high"])


def test_question_interval_hand_computed():
    # 4 questions: d = [1, 0, 0, -1] + [1] -> 5 questions, d = 1, 0, 0, -1, 1: mean 0.2;
    # deviations 0.8, -0.2, -0.2, -1.2, 0.8: squares sum 0.64 + 0.04 + 0.04 + 1.44 + 0.64 = 2.8;
    # std = sqrt(2.8 / 4) = 0.836660; t(0.975, 4) = 2.776445; half = 2.776445 * 0.836660 / sqrt(5) = 1.038844.
    out = question_interval([True, True, False, False, True], [False, True, False, True, False])
    assert out["mean"] == pytest.approx(0.2)
    assert (out["low"], out["high"]) == pytest.approx((0.2 - 1.038844, 0.2 + 1.038844), abs=1e-5)


def test_clustered_question_interval_hand_computed():
    # d = 1, 0, 0, -1, 1 as above (mean 0.2) in clusters {0, 1}, {2, 3}, {4}: deviation sums
    # 0.8 - 0.2 = 0.6, -0.2 - 1.2 = -1.4, 0.8: squares 0.36 + 1.96 + 0.64 = 2.96; G = 3;
    # se = sqrt(3 / 2 * 2.96) / 5 = 0.421426; t(0.975, 2) = 4.302653; half = 1.813253.
    a, b = [True, True, False, False, True], [False, True, False, True, False]
    out = question_interval(a, b, clusters=["x", "x", "y", "y", "z"])
    assert out["mean"] == pytest.approx(0.2) and (out["n"], out["clusters"]) == (5, 3)
    assert (out["low"], out["high"]) == pytest.approx((0.2 - 1.813253, 0.2 + 1.813253), abs=1e-5)
    # Every question its own cluster is the plain paired interval.
    plain = question_interval(a, b)
    assert question_interval(a, b, clusters=[0, 1, 2, 3, 4]) == pytest.approx(plain | {"clusters": 5})
    one = question_interval(a, b, clusters=[7] * 5)
    assert one["mean"] == pytest.approx(0.2) and math.isnan(one["low"]) and math.isnan(one["high"])
    with pytest.raises(ValueError, match="one cluster per question"):
        question_interval(a, b, clusters=[0, 1])


def test_unpaired_inputs_are_refused():
    with pytest.raises(ValueError, match="equal, non-empty"):
        seed_interval([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="equal, non-empty"):
        question_interval([], [])

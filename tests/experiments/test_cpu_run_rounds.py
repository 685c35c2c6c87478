"""experiments/cpu_run.py's check that the loop's arms of one seed share their round 1."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.cpu_run import check_first_rounds, first_round  # noqa: E402


def _steps(round_1_accuracy: float, seconds: float) -> list[dict]:
    """Two GRPO steps a round, as an experiment's run lists them (``round``, a clock that differs)."""
    return [
        {"step": 1, "round": 1, "accuracy": round_1_accuracy, "elapsed_s": seconds},
        {"step": 2, "round": 1, "accuracy": 0.5, "elapsed_s": 2 * seconds},
        {"step": 3, "round": 2, "accuracy": 0.75, "elapsed_s": 3 * seconds},
    ]


def test_arms_that_share_round_1_pass_and_a_round_1_trained_again_differently_is_refused(tmp_path):
    frozen, retrained = first_round(_steps(0.25, 1.0)), first_round(_steps(0.25, 9.0))
    assert frozen == retrained  # the same steps; only the clock differs
    retrained_round_2 = _steps(0.25, 1.0)
    retrained_round_2[2]["accuracy"] = 0.0  # round 2 is where the arms differ
    assert first_round(retrained_round_2) == frozen
    check_first_rounds({"frozen": frozen, "retrained": retrained, "sft": None}, tmp_path)
    with pytest.raises(ValueError, match="round 1 differs"):
        check_first_rounds({"frozen": frozen, "retrained": first_round(_steps(0.5, 1.0))}, tmp_path)


def test_a_run_of_one_round_has_no_round_1_to_share():
    assert first_round([{"step": 1, "accuracy": 0.5, "elapsed_s": 1.0}]) is None
    assert first_round([{"step": 1, "round": 1, "accuracy": 0.5}]) is None

"""A reward model's staleness on the policy's current samples: its within-question AUC against the
answer checker on a GRPO step's groups, pooled over the steps between two evaluations."""

import math

import pytest
import torch

from grpo_core.rewards.heads import group_auc
from grpo_core.stages.rl_records import staleness


def test_group_auc_by_hand():
    # Three groups of G = 4 (rows 0-3, 4-7, 8-11).
    # Group 0: right = {0.9, 0.2}, wrong = {0.5, 0.1}. Pairs (right > wrong): 0.9>0.5, 0.9>0.1,
    #   0.2<0.5, 0.2>0.1 -> 3 of 4 = 0.75.
    # Group 1: all right: no pair, not counted.
    # Group 2: right = {0.3}, wrong = {0.3, 0.8, nan}: the NaN row is left out; 0.3 = 0.3 is a tie
    #   (half), 0.3 < 0.8 -> 0.5 / 2 = 0.25.
    # Mean over the two mixed groups: (0.75 + 0.25) / 2 = 0.5.
    scores = torch.tensor([0.9, 0.5, 0.2, 0.1, 0.4, 0.4, 0.4, 0.4, 0.3, 0.3, 0.8, math.nan])
    correct = torch.tensor([1, 0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0], dtype=torch.float64)
    auc, mixed = group_auc(scores, correct, 4)
    assert mixed == 2
    assert auc == pytest.approx(0.5)


def test_group_auc_ignores_cues_constant_within_a_group():
    # A score that only says which question is easy (constant inside each group) ranks at chance.
    scores = torch.tensor([0.9, 0.9, 0.1, 0.1])
    correct = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert group_auc(scores, correct, 2) == (0.5, 2)


def test_group_auc_without_a_mixed_group_is_undefined():
    auc, mixed = group_auc(torch.tensor([0.2, 0.7]), torch.tensor([1.0, 1.0]), 2)
    assert math.isnan(auc) and mixed == 0


def test_staleness_pools_steps_by_their_mixed_groups():
    # Step 1: AUC 0.9 on 3 mixed groups; step 2: 0.5 on 1; step 3: none (NaN, 0 groups).
    # Pooled: (0.9 * 3 + 0.5 * 1) / 4 = 3.2 / 4 = 0.8. Means over the 3 steps: ORM score
    # (0.6 + 0.7 + 0.8) / 3 = 0.7; checker (0.5 + 0.4 + 0.3) / 3 = 0.4.
    steps = [
        {"accuracy": 0.5, "orm_mean": 0.6, "orm_within_auc": 0.9, "orm_mixed_groups": 3.0},
        {"accuracy": 0.4, "orm_mean": 0.7, "orm_within_auc": 0.5, "orm_mixed_groups": 1.0},
        {"accuracy": 0.3, "orm_mean": 0.8, "orm_within_auc": math.nan, "orm_mixed_groups": 0.0},
    ]
    out = staleness(steps)
    assert out["staleness/orm_within_auc"] == pytest.approx(0.8)
    assert out["staleness/orm_mean"] == pytest.approx(0.7)
    assert out["staleness/checker_accuracy"] == pytest.approx(0.4)
    assert not any("prm" in k for k in out)


def test_staleness_is_empty_without_a_learned_reward():
    assert staleness([{"accuracy": 0.5}]) == {}

"""Group-relative advantages (DeepSeekMath §4.1.2 outcome, §4.1.3 process supervision).

Hand-computed values with the arithmetic in comments, then properties (zero-sum groups,
permutation equivariance, zero-spread groups) and a naive-loop reference for the vectorised
process-supervision code, as in verl's test_core_algos_on_cpu.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_core.advantages import outcome_advantages, process_advantages

# ---------------------------------------------------------------------------- outcome


def test_outcome_hand_computed_binary():
    # [1, 0, 0, 1]: mean 0.5, population std sqrt(4 * 0.25 / 4) = 0.5 -> (r - 0.5) / 0.5
    adv = outcome_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, -1.0, 1.0]]))


def test_outcome_hand_computed_uneven_and_population_std():
    # [1, 0, 0, 0]: mean 0.25, var (0.75^2 + 3 * 0.25^2) / 4 = 0.1875, std = sqrt(3)/4
    #   -> 0.75 / (sqrt3/4) = sqrt3,  -0.25 / (sqrt3/4) = -1/sqrt3.
    # With the sample std (1/(G-1)) it would be 1.5 and -0.5 instead: this pins 1/G.
    # [0.5, 1, 0, 0.5]: mean 0.5, var (0 + .25 + .25 + 0) / 4 = 1/8, std 1/sqrt8
    #   -> [0, 0.5 * sqrt8, -0.5 * sqrt8, 0] = [0, sqrt2, -sqrt2, 0]
    adv = outcome_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.0, 0.5]]))
    s3, s2 = math.sqrt(3), math.sqrt(2)
    expected = torch.tensor([[s3, -1 / s3, -1 / s3, -1 / s3], [0.0, s2, -s2, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_outcome_groups_are_independent():
    # Row 0 is [1, 0] -> [1, -1]; row 1 is [10, 30] -> mean 20, std 10 -> [-1, 1].
    adv = outcome_advantages(torch.tensor([[1.0, 0.0], [10.0, 30.0]]))
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outcome_sums_to_zero_and_unit_std(seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(5, 8, generator=g, dtype=torch.float64)
    adv = outcome_advantages(rewards)
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(5, dtype=torch.float64))
    torch.testing.assert_close(adv.std(dim=1, unbiased=False), torch.ones(5, dtype=torch.float64))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outcome_permutation_equivariant_within_group(seed):
    # Shuffling the completions of a group shuffles their advantages the same way.
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(3, 6, generator=g, dtype=torch.float64)
    perm = torch.randperm(6, generator=g)
    torch.testing.assert_close(outcome_advantages(rewards[:, perm]), outcome_advantages(rewards)[:, perm])


def test_outcome_zero_spread_and_group_of_one():
    # Identical rewards (all right, all wrong, a large constant) carry no signal: exactly 0, no NaN.
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1e6, 1e6, 1e6]])
    assert torch.equal(outcome_advantages(rewards), torch.zeros(3, 3))
    # G = 1: the std is 0 by definition.
    assert torch.equal(outcome_advantages(torch.tensor([[0.3], [1.0]])), torch.zeros(2, 1))


def test_outcome_integer_rewards_give_float():
    adv = outcome_advantages(torch.tensor([[1, 0, 0, 1]]))
    assert adv.is_floating_point()
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, -1.0, 1.0]]))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_outcome_non_finite_raises(bad):
    with pytest.raises(ValueError):
        outcome_advantages(torch.tensor([[1.0, bad, 0.0]]))


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4)])
def test_outcome_wrong_rank_raises(shape):
    with pytest.raises(ValueError):
        outcome_advantages(torch.zeros(shape))


# ---------------------------------------------------------------------------- process


def test_process_hand_computed():
    # One question, G = 2, K = 2, seq_len = 4.
    #   completion 0: step rewards [1, 0] ending at tokens [1, 3]
    #   completion 1: step reward  [0] ending at token 2 (second step is padding)
    # Valid rewards {1, 0, 0}: mean 1/3, var ((2/3)^2 + 2 (1/3)^2) / 3 = 2/9, std sqrt2/3
    #   normalised: 1 -> (2/3)/(sqrt2/3) = sqrt2;  0 -> (-1/3)/(sqrt2/3) = -1/sqrt2
    # completion 0: t=0,1 see both steps: sqrt2 - 1/sqrt2 = 1/sqrt2; t=2,3 only the second: -1/sqrt2
    # completion 1: t=0..2 see its step: -1/sqrt2; t=3 is after its last step: 0
    r = torch.tensor([[[1.0, 0.0], [0.0, 123.0]]])
    ends = torch.tensor([[[1, 3], [2, 0]]])
    mask = torch.tensor([[[True, True], [True, False]]])
    h = 1 / math.sqrt(2)
    expected = torch.tensor([[[h, h, -h, -h], [-h, -h, -h, 0.0]]])
    torch.testing.assert_close(process_advantages(r, ends, mask, 4), expected)


def test_process_min_credit_hand_computed():
    """PURE's min-form credit against the paper's sum on one group of two completions of 2 steps:
    c0 has rewards [1, 0] (right, then wrong), steps ending at tokens 1 and 3; c1 [0, 1], ending at
    tokens 1 and 2. mean 0.5, population std 0.5 -> normalised c0 [1, -1], c1 [-1, 1].
      sum: c0 tokens 0-1: 1 - 1 = 0, tokens 2-3: -1;  c1 tokens 0-1: -1 + 1 = 0, token 2: 1.
      min: c0 tokens 0-1: min(1, -1) = -1, 2-3: -1;   c1 tokens 0-1: min(-1, 1) = -1, token 2: 1.
    The sum lets c1's wrong first step off (0); the min charges it. c1's token 3 has no step ahead: 0."""
    r = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    ends = torch.tensor([[[1, 3], [1, 2]]])  # c1's second step ends at token 2: token 3 has no step ahead
    mask = torch.ones(1, 2, 2, dtype=torch.bool)
    torch.testing.assert_close(
        process_advantages(r, ends, mask, 4), torch.tensor([[[0.0, 0.0, -1.0, -1.0], [0.0, 0.0, 1.0, 0.0]]])
    )
    torch.testing.assert_close(
        process_advantages(r, ends, mask, 4, credit="min"),
        torch.tensor([[[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, 1.0, 0.0]]]),
    )
    with pytest.raises(ValueError, match="credit"):
        process_advantages(r, ends, mask, 4, credit="max")


def naive_process(step_rewards, step_ends, step_mask, seq_len, credit=sum):
    """Straight transcription of the paper's formula with python loops (the reference); ``credit=min``
    for the min form."""
    n, g, k = step_rewards.shape
    out = torch.zeros(n, g, seq_len, dtype=torch.float64)
    for q in range(n):
        vals = [float(step_rewards[q, i, j]) for i in range(g) for j in range(k) if step_mask[q, i, j]]
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        if std == 0:
            continue
        for i in range(g):
            for t in range(seq_len):
                ahead = [
                    (float(step_rewards[q, i, j]) - mean) / std
                    for j in range(k)
                    # an end >= seq_len covers every token, so no clamping is needed here
                    if step_mask[q, i, j] and int(step_ends[q, i, j]) >= t
                ]
                out[q, i, t] = credit(ahead) if ahead else 0.0
    return out


@pytest.mark.parametrize("credit", ["sum", "min"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_process_matches_naive_loop(seed, credit):
    g = torch.Generator().manual_seed(seed)
    n, grp, k, seq_len = 3, 4, 5, 7
    rewards = torch.randn(n, grp, k, generator=g, dtype=torch.float64)
    # ends up to seq_len + 3: some steps run past the completion and must cover all of it
    ends = torch.randint(0, seq_len + 3, (n, grp, k), generator=g)
    mask = torch.rand(n, grp, k, generator=g) > 0.3
    mask[0, 0] = False  # a completion without any step: all zeros
    # padding values must be ignored entirely: huge for the sum, hugely negative for the minimum
    rewards[~mask] = 1e9 if credit == "sum" else -1e9
    adv = process_advantages(rewards, ends, mask, seq_len, credit=credit)
    assert adv.shape == (n, grp, seq_len)
    torch.testing.assert_close(
        adv, naive_process(rewards, ends, mask, seq_len, credit={"sum": sum, "min": min}[credit])
    )
    assert torch.equal(adv[0, 0], torch.zeros(seq_len, dtype=torch.float64))


def test_process_end_past_seq_len_covers_whole_sequence():
    # Two completions with one step each, rewards 1 and 0 -> normalised +1 and -1.
    # The first step "ends" at 10 with seq_len 3: every token gets +1.
    r = torch.tensor([[[1.0], [0.0]]])
    ends = torch.tensor([[[10], [0]]])
    mask = torch.ones(1, 2, 1, dtype=torch.bool)
    adv = process_advantages(r, ends, mask, 3)
    torch.testing.assert_close(adv, torch.tensor([[[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]]]))


def test_process_tokens_after_last_step_are_zero():
    # Rewards [1, 0] at ends [0, 1] in one completion and [0] at end 0 in the other.
    # Tokens 2.. of completion 0 and 1.. of completion 1 lie after every step.
    r = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    ends = torch.tensor([[[0, 1], [0, 0]]])
    mask = torch.tensor([[[True, True], [True, False]]])
    adv = process_advantages(r, ends, mask, 6)
    assert torch.equal(adv[0, 0, 2:], torch.zeros(4))
    assert torch.equal(adv[0, 1, 1:], torch.zeros(5))
    assert adv[0, 0, 0] != 0


def test_process_zero_spread_gives_zeros():
    r = torch.full((2, 3, 2), 0.7)
    ends = torch.tensor([[[0, 2]] * 3, [[1, 3]] * 3])
    mask = torch.ones(2, 3, 2, dtype=torch.bool)
    assert torch.equal(process_advantages(r, ends, mask, 4), torch.zeros(2, 3, 4))
    # A group whose steps are all padding also gets zeros (not NaN).
    assert torch.equal(process_advantages(r, ends, torch.zeros_like(mask), 4), torch.zeros(2, 3, 4))


def test_process_nan_in_valid_step_raises_but_padding_may_hold_nan():
    r = torch.tensor([[[1.0, float("nan")], [0.0, 0.0]]])
    ends = torch.zeros(1, 2, 2, dtype=torch.long)
    with pytest.raises(ValueError):
        process_advantages(r, ends, torch.ones(1, 2, 2, dtype=torch.bool), 3)
    mask = torch.tensor([[[True, False], [True, False]]])
    assert torch.isfinite(process_advantages(r, ends, mask, 3)).all()


@pytest.mark.parametrize(
    "r_shape, e_shape, m_shape",
    [
        ((2, 3), (2, 3), (2, 3)),  # not [N, G, K]
        ((1, 2, 3), (1, 2, 4), (1, 2, 3)),  # ends disagree
        ((1, 2, 3), (1, 2, 3), (1, 3, 3)),  # mask disagrees
    ],
)
def test_process_wrong_shapes_raise(r_shape, e_shape, m_shape):
    with pytest.raises(ValueError):
        process_advantages(
            torch.zeros(r_shape), torch.zeros(e_shape, dtype=torch.long), torch.ones(m_shape, dtype=torch.bool), 4
        )

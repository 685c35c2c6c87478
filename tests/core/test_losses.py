"""The GRPO objective (DeepSeekMath eq. 3) and the k3 KL estimator.

Hand-computed loss values for every aggregation, arithmetic in comments (the habit of torchtune's
test_ppo_loss.py); clipping checked through its gradient; the paper's 1/G * 1/|o_i| weighting
checked through autograd at ratio 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_core.losses import aggregate, grpo_loss, kl_k3

LN2 = math.log(2)


# ---------------------------------------------------------------------------- kl_k3


def test_kl_k3_zero_when_equal_and_hand_value():
    x = torch.randn(3, 5, dtype=torch.float64)
    assert torch.equal(kl_k3(x, x), torch.zeros(3, 5, dtype=torch.float64))
    # ref - logp = ln2: exp(ln2) - ln2 - 1 = 1 - ln2 ~ 0.3069
    # ref - logp = -ln2: 0.5 + ln2 - 1 = ln2 - 0.5 ~ 0.1931
    kl = kl_k3(torch.tensor([0.0, 0.0]), torch.tensor([LN2, -LN2]))
    torch.testing.assert_close(kl, torch.tensor([1 - LN2, LN2 - 0.5]))


@pytest.mark.parametrize("seed", [0, 1])
def test_kl_k3_non_negative(seed):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(4, 50, generator=g, dtype=torch.float64) * 3
    ref = torch.randn(4, 50, generator=g, dtype=torch.float64) * 3
    assert (kl_k3(logp, ref) >= 0).all()


# ---------------------------------------------------------------------------- hand example
#
# B = 2 rows, T = 2 tokens; row 1's second token is padding.
#   ratio = exp(logp - old_logp) = [[1.1, 1.0], [1.5, (1.0)]],  advantages all +1
#   pg per token = -min(r A, clip(r, 0.8, 1.2) A) = [[-1.1, -1.0], [-1.2, pad]]   (1.5 clipped to 1.2)
#   ref - logp = [[0, ln2], [0, 0]]  ->  k3 = [[0, 1 - ln2], [0, 0]]
#   with beta = 0.04: per token = [[-1.1, -1 + 0.04 (1 - ln2)], [-1.2, pad]]
#                                = [[-1.1, -0.98772591], [-1.2, pad]]
#   seq-mean-token-mean:   row0 (-1.1 - 0.98772591) / 2 = -1.04386296, row1 -1.2 / 1
#                          mean = (-1.04386296 - 1.2) / 2 = -1.12193148
#   token-mean:            (-1.1 - 0.98772591 - 1.2) / 3 = -1.09590864
#   seq-mean-token-sum-norm (divide by T = 2): row0 -1.04386296, row1 -1.2 / 2 = -0.6
#                          mean = -0.82193148
BETA = 0.04  # the paper's
KL_TERM = BETA * (1 - LN2)
ROW0 = -1.1 + (-1.0 + KL_TERM)
EXPECTED = {
    "seq-mean-token-mean": (ROW0 / 2 + -1.2 / 1) / 2,
    "token-mean": (ROW0 + -1.2) / 3,
    "seq-mean-token-sum-norm": (ROW0 / 2 + -1.2 / 2) / 2,
}


def _hand_inputs():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=torch.float64)
    old_logp = logp - torch.tensor([[math.log(1.1), 0.0], [math.log(1.5), 0.0]], dtype=torch.float64)
    ref_logp = logp + torch.tensor([[0.0, LN2], [0.0, 0.0]], dtype=torch.float64)
    adv = torch.ones(2, 2, dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    return logp, old_logp, ref_logp, adv, mask


@pytest.mark.parametrize("agg", sorted(EXPECTED))
def test_grpo_loss_hand_computed(agg):
    loss, _ = grpo_loss(*_hand_inputs(), beta=BETA, agg=agg)
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(EXPECTED[agg], abs=1e-9)


def test_grpo_loss_hand_computed_metrics():
    _, m = grpo_loss(*_hand_inputs(), beta=BETA)  # the paper's: seq-mean-token-mean, beta 0.04
    assert m["kl"] == pytest.approx((1 - LN2) / 3)  # token mean over the 3 real tokens
    assert m["pg_loss"] == pytest.approx((-2.1 / 2 + -1.2) / 2)  # same aggregation, no KL
    assert m["clip_ratio"] == pytest.approx(1 / 3)  # only the 1.5 token is clipped
    assert m["ratio_mean"] == pytest.approx((1.1 + 1.0 + 1.5) / 3)
    for v in m.values():
        assert isinstance(v, float)


def test_default_aggregation_is_paper():
    inputs = _hand_inputs()
    assert grpo_loss(*inputs, beta=BETA)[0].item() == pytest.approx(EXPECTED["seq-mean-token-mean"], abs=1e-9)


def test_aggregate_unknown_raises():
    with pytest.raises(ValueError):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), "sum")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- clipping


def _one_token(ratio: float, adv: float, **kw):
    """Loss and d loss / d logp for a single token with the given ratio and advantage."""
    logp = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 1), -math.log(ratio), dtype=torch.float64)
    loss, m = grpo_loss(logp, old, None, torch.full((1, 1), adv, dtype=torch.float64), torch.ones(1, 1), beta=0.0, **kw)
    loss.backward()
    return loss.item(), logp.grad.item(), m


def test_positive_advantage_clipped_above():
    # ratio 1.5, A = 2: min(1.5 * 2, 1.2 * 2) = 2.4 -> loss -2.4, and the clamp cuts the gradient.
    loss, grad, m = _one_token(1.5, 2.0)
    assert loss == pytest.approx(-2.4)
    assert grad == 0.0
    assert m["clip_ratio"] == 1.0


def test_negative_advantage_clipped_below_not_above():
    # ratio 0.5, A = -1: min(-0.5, 0.8 * -1 = -0.8) = -0.8 -> loss 0.8, gradient 0.
    loss, grad, _ = _one_token(0.5, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0
    # ratio 1.5, A = -1: min(-1.5, -1.2) = -1.5: pessimistic side, not clipped;
    # d(-r A)/d logp = -A r = 1.5.
    loss, grad, m = _one_token(1.5, -1.0)
    assert loss == pytest.approx(1.5) and grad == pytest.approx(1.5)
    assert m["clip_ratio"] == 0.0


def test_clip_eps_high_moves_upper_bound_only():
    # clip_eps_high = 0.6: upper bound 1.6, so ratio 1.5 with A = 2 is not clipped: loss -3,
    # gradient -A r = -3.
    loss, grad, _ = _one_token(1.5, 2.0, clip_eps_high=0.6)
    assert loss == pytest.approx(-3.0) and grad == pytest.approx(-3.0)
    # ratio 1.7 is clipped at 1.6: loss -3.2.
    loss, grad, _ = _one_token(1.7, 2.0, clip_eps_high=0.6)
    assert loss == pytest.approx(-3.2) and grad == 0.0
    # The lower bound is still 1 - clip_eps = 0.8.
    loss, _, _ = _one_token(0.5, -1.0, clip_eps_high=0.6)
    assert loss == pytest.approx(0.8)


# ---------------------------------------------------------------------------- reference model


def test_beta_zero_allows_no_reference():
    logp, old, _, adv, mask = _hand_inputs()
    loss, _ = grpo_loss(logp, old, None, adv, mask, beta=0.0)
    # Without KL the loss is the pg part alone: (-2.1 / 2 - 1.2) / 2
    assert loss.item() == pytest.approx((-2.1 / 2 - 1.2) / 2)


def test_beta_positive_without_reference_raises():
    logp, old, _, adv, mask = _hand_inputs()
    with pytest.raises(ValueError):
        grpo_loss(logp, old, None, adv, mask, beta=0.04)


# ---------------------------------------------------------------------------- masking


@pytest.mark.parametrize("agg", sorted(EXPECTED))
def test_all_masked_rows_contribute_zero(agg):
    logp, old, ref, adv, mask = _hand_inputs()
    # Append a fully padded row holding arbitrary (finite) garbage.
    garbage = torch.tensor([[7.0, -9.0]], dtype=torch.float64)
    logp2 = torch.cat([logp, garbage]).requires_grad_(True)
    loss2, m = grpo_loss(
        logp2,
        torch.cat([old, -garbage]),
        torch.cat([ref, garbage * 3]),
        torch.cat([adv, garbage * 5]),
        torch.cat([mask, torch.zeros(1, 2, dtype=mask.dtype)]),
        beta=BETA,
        agg=agg,
    )
    assert torch.isfinite(loss2)
    loss2.backward()
    assert torch.equal(logp2.grad[2], torch.zeros(2, dtype=torch.float64))
    # The empty row adds 0 to the numerator; per-row means count it in B, token-mean does not.
    base = EXPECTED[agg]
    expected = base if agg == "token-mean" else base * 2 / 3
    assert loss2.item() == pytest.approx(expected, abs=1e-9)
    assert all(math.isfinite(v) for v in m.values())


@pytest.mark.parametrize("agg", sorted(EXPECTED))
def test_fully_masked_batch_is_finite_zero(agg):
    logp = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    loss, m = grpo_loss(
        logp, logp.detach() - 0.3, logp.detach() + 0.2, torch.randn(4, 3), torch.zeros(4, 3), beta=BETA, agg=agg
    )
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(4, 3, dtype=torch.float64))
    assert all(math.isfinite(v) for v in m.values())


# ---------------------------------------------------------------------------- gradient


@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_at_ratio_one_is_paper_weighting(seed):
    # At ratio 1 (logp == old_logp) and pi == pi_ref the KL gradient vanishes
    # (d k3 / d logp = 1 - exp(ref - logp) = 0), and d(-r A)/d logp = -A, so with
    # seq-mean-token-mean each real token of row i gets -A_i / (|o_i| * B); padding gets 0.
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 5
    logp = torch.randn(b, t, generator=g, dtype=torch.float64).requires_grad_(True)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t)
    loss, _ = grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, beta=0.04)
    loss.backward()
    expected = -adv / (lengths[:, None].double() * b) * mask
    torch.testing.assert_close(logp.grad, expected)


# ---------------------------------------------------------------------------- repeated rows


@pytest.mark.parametrize("agg", sorted(EXPECTED))
def test_weighted_rows_equal_the_rows_repeated(agg):
    """A row passed once with weight 2 is the row passed twice: the loss, its gradient (per distinct
    row, summed over the copies) and the metrics. Hand example: row 0 twice, row 1 once:
    seq-mean-token-mean = (2 * ROW0 / 2 - 1.2) / 3; token-mean = (2 * ROW0 - 1.2) / 5."""
    logp, old, ref, adv, mask = _hand_inputs()
    repeat = torch.tensor([0, 0, 1])
    full = logp[repeat].clone().requires_grad_(True)
    loss_full, m_full = grpo_loss(full, old[repeat], ref[repeat], adv[repeat], mask[repeat], beta=BETA, agg=agg)
    once = logp.clone().requires_grad_(True)
    loss_once, m_once = grpo_loss(once, old, ref, adv, mask, beta=BETA, agg=agg, weights=torch.tensor([2.0, 1.0]))
    hand = {
        "seq-mean-token-mean": (2 * ROW0 / 2 - 1.2) / 3,
        "token-mean": (2 * ROW0 - 1.2) / 5,
        "seq-mean-token-sum-norm": (2 * ROW0 / 2 - 1.2 / 2) / 3,
    }
    assert loss_once.item() == pytest.approx(hand[agg], abs=1e-9)
    assert loss_full.item() == pytest.approx(hand[agg], abs=1e-9)
    loss_full.backward()
    loss_once.backward()
    torch.testing.assert_close(once.grad, torch.stack([full.grad[0] + full.grad[1], full.grad[2]]))
    assert m_once == pytest.approx(m_full)

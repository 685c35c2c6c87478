"""PPO's pieces (the §5 study's baseline), on hand-computed examples: the per-token KL-penalised
rewards, GAE and the clipped value loss."""

from __future__ import annotations

import pytest
import torch

from grpo_core.advantages import gae, kl_penalised_rewards
from grpo_core.losses import value_loss


def test_gae_on_three_tokens():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    # gamma = lambda = 1: delta = (0 + 0.6 - 0.5, 0 + 0.7 - 0.6, 1 + 0 - 0.7) = (0.1, 0.1, 0.3);
    # A_t sums the deltas ahead: (0.5, 0.4, 0.3) = the final reward minus each value.
    adv, ret = gae(rewards, values, mask)
    assert adv[0].tolist() == pytest.approx([0.5, 0.4, 0.3])
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 1.0])
    # gamma 0.9, lambda 0.5: delta = (0.9 * 0.6 - 0.5, 0.9 * 0.7 - 0.6, 1 - 0.7) = (0.04, 0.03, 0.3);
    # A_2 = 0.3, A_1 = 0.03 + 0.45 * 0.3 = 0.165, A_0 = 0.04 + 0.45 * 0.165 = 0.11425.
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    assert adv[0].tolist() == pytest.approx([0.11425, 0.165, 0.3])
    assert ret[0].tolist() == pytest.approx([0.61425, 0.765, 1.0])


def test_gae_padding_ends_the_episode_and_stays_zero():
    # Row 0 has two real tokens: the value after token 1 is 0, whatever the padded position holds.
    rewards = torch.tensor([[0.0, 1.0, 5.0], [0.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 9.0], [0.5, 0.6, 0.7]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv, ret = gae(rewards, values, mask)
    assert adv[0].tolist() == pytest.approx([0.8, 0.6, 0.0])  # (1 - 0.2, 1 - 0.4, padding)
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 0.0])
    assert adv[1].tolist() == pytest.approx([0.5, 0.4, 0.3])  # the other row is untouched


def test_kl_penalised_rewards_put_the_score_on_the_last_real_token():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    scores = torch.tensor([1.0, 0.0])
    r = kl_penalised_rewards(scores, logp, ref, mask, beta=0.1)
    # row 0: -0.1 * (0.5, 0, -1) = (-0.05, 0, 0.1), plus the score 1 on token 2;
    # row 1: no KL, score 0 on token 1, nothing on the padding.
    assert r[0].tolist() == pytest.approx([-0.05, 0.0, 1.1]) and r[1].tolist() == [0.0, 0.0, 0.0]
    empty = kl_penalised_rewards(torch.tensor([1.0]), logp[:1], ref[:1], torch.zeros(1, 3), beta=0.1)
    assert empty.tolist() == [[0.0, 0.0, 0.0]]


def test_value_loss_clips_a_value_that_moved_too_far():
    returns = torch.tensor([[1.0, 1.0]])
    old = torch.tensor([[0.5, 0.5]])
    new = torch.tensor([[0.9, 0.6]], requires_grad=True)
    loss, metrics = value_loss(new, old, returns, torch.ones(1, 2), clip=0.2)
    # token 0: V 0.9 moved 0.4 > 0.2, V_clip = 0.7: max((0.9-1)^2, (0.7-1)^2) = 0.09 -> 0.045;
    # token 1: V 0.6 within the clip: 0.5 * (0.6-1)^2 = 0.08. Token mean: 0.0625.
    assert loss.item() == pytest.approx(0.0625)
    assert metrics["value_clip_ratio"] == pytest.approx(0.5)
    loss.backward()
    # The clipped term does not depend on V: token 0 gets no gradient; token 1: (0.6 - 1) / 2 tokens.
    assert new.grad[0].tolist() == pytest.approx([0.0, -0.2])


def test_whiten_over_the_real_tokens():
    from grpo_core.advantages import whiten

    x = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    # Over the three real tokens: mean 2, population std sqrt(2/3) = 0.8165; padding stays 0.
    out = whiten(x, torch.tensor([[1, 1, 1, 0]]))
    assert out[0].tolist() == pytest.approx([-1.2247449, 0.0, 1.2247449, 0.0], abs=1e-6)
    assert whiten(x, torch.zeros(1, 4)).tolist() == [[0.0, 0.0, 0.0, 0.0]]

"""PPO for LLMs (DeepSeekMath §4.1.1, eq. 1-2), the baseline GRPO replaces: ``grpo.algorithm: ppo``.

PPO shares GRPO's step (``grpo.rl_step``: exploration, the clipped policy update, the metrics) and
differs in its advantage estimator (``gae_advantages``): a value model, initialised from the policy
with a fresh one-output head at every token, estimates each state's value; the per-token reward is
the KL penalty to the reference on every token plus the solution's reward on its last
(``advantages.kl_penalised_rewards``, the InstructGPT form); GAE with ``grpo.ppo.gae_gamma`` /
``gae_lambda`` turns them into advantages (whitened over the batch's tokens) and returns; the value
model then takes the clipped value loss (``losses.value_loss``) with the optimizer the trainer built
for it. The KL lives in the reward (``algorithms.ALGORITHMS``), so the policy loss has none. One
process only: the value model has no data-parallel wrapper.
"""

from __future__ import annotations

import contextlib

import torch

from grpo_core.advantages import gae, kl_penalised_rewards, whiten
from grpo_core.config import GRPOConfig
from grpo_core.lm.policy import Rollout, token_logprobs
from grpo_core.losses import kl_k3, value_loss
from grpo_core.rewards.heads import reward_model_from, state_values
from grpo_core.stages.rl import Advantages, ScoredGroups, Models, ValueTargets
from grpo_core.training.trainer import optimizer_step


def value_model_from(policy, seed: int):
    """A value model: the policy's body with a fresh one-output head at every token (a token
    classifier, the PRM's shape), drawn from ``seed`` (the same on every run of a recipe; the global
    random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return reward_model_from(policy, "prm")


def gae_advantages(ex: ScoredGroups, models: Models, cfg: GRPOConfig, amp=contextlib.nullcontext) -> Advantages:
    """PPO's estimator (``Estimator.GAE``): per-token KL-penalised rewards, the value model's
    estimates, GAE, whitened; the value model's mu passes of the clipped value loss come after the
    policy's update (``value_updates``, on the returned ``ValueTargets``). A completion without a
    finite reward is left out of both losses. Metrics: ``train/kl``, ``train/value_mean``,
    ``train/return_mean`` and the value loss's."""
    pc, rollout = cfg.ppo, ex.rollout
    if cfg.kl.reward > 0 and models.ref is None:
        raise ValueError(
            f"grpo.beta = {cfg.kl.reward} puts a KL to the reference in PPO's reward, but no reference model was given"
        )
    valid = torch.isfinite(ex.rewards)
    mask = rollout.completion_mask * valid[:, None].to(rollout.completion_mask.dtype)
    with torch.no_grad(), amp():
        old_logp = token_logprobs(models.policy, rollout)
        ref_logp = token_logprobs(models.ref, rollout) if cfg.kl.reward else old_logp  # no KL weight: no reference
        old_values = state_values(models.value, rollout)
    rewards = kl_penalised_rewards(torch.where(valid, ex.rewards, 0.0), old_logp, ref_logp, mask, cfg.kl.reward)
    advantages, returns = gae(rewards, old_values, mask, pc.gae_gamma, pc.gae_lambda)
    m = mask.bool()
    stats = {
        "train/kl": float(kl_k3(old_logp, ref_logp)[m].mean()) if m.any() else 0.0,
        "train/value_mean": float(old_values[m].mean()) if m.any() else 0.0,
        "train/return_mean": float(returns[m].mean()) if m.any() else 0.0,
    }
    return Advantages(whiten(advantages, mask), mask, stats, ValueTargets(old_values, returns))


def value_updates(
    models: Models,
    rollout: Rollout,
    mask: torch.Tensor,
    targets: ValueTargets,
    cfg: GRPOConfig,
    amp=contextlib.nullcontext,
) -> dict[str, float]:
    """PPO's value model after the policy's update: mu passes of minibatch updates of the clipped
    value loss towards ``targets`` on ``mask``'s tokens; the mean loss and clip ratio."""
    value_model, value_opt, (old_values, returns) = models.value, models.value_opt, targets
    batch = mask.shape[0]
    mb = cfg.minibatch_size or batch
    sums = {"value_loss": 0.0, "value_clip_ratio": 0.0}
    n = 0
    for _ in range(cfg.inner_updates):
        for s in range(0, batch, mb):
            part = rollout.rows(s, s + mb)
            with amp():
                values = state_values(value_model, part)
            loss, m = value_loss(
                values, old_values[s : s + mb], returns[s : s + mb], mask[s : s + mb], clip=cfg.ppo.value_clip
            )
            optimizer_step(value_model, value_opt, loss, 1.0, cfg.max_grad_norm)
            for k in sums:
                sums[k] += m[k]
            n += 1
    return {f"train/{k}": v / max(n, 1) for k, v in sums.items()}

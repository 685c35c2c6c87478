"""PPO for LLMs (DeepSeekMath §4.1.1, eq. 1-2), the baseline GRPO replaces: ``grpo.algorithm: ppo``.

PPO shares GRPO's step (``rl_step.rl_step``: exploration, the clipped policy update, the metrics) and
differs in its advantage estimator (``estimators.gae_advantages``): a value model, initialised from the policy
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

from grpo_core.config import GRPOConfig
from grpo_core.lm.policy import Rollout
from grpo_core.losses import value_loss
from grpo_core.rewards.heads import reward_model_from, state_values
from grpo_core.stages.rl_types import Models, ValueTargets
from grpo_core.training.trainer import optimizer_step


def value_model_from(policy, seed: int):
    """A value model: the policy's body with a fresh one-output head at every token (a token
    classifier, the PRM's shape), drawn from ``seed`` (the same on every run of a recipe; the global
    random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return reward_model_from(policy, "prm")


def value_updates(
    models: Models,
    rollout: Rollout,
    mask: torch.Tensor,
    targets: ValueTargets,
    grpo: GRPOConfig,
    amp=contextlib.nullcontext,
) -> dict[str, float]:
    """PPO's value model after the policy's update: mu passes of minibatch updates of the clipped
    value loss towards ``targets`` on ``mask``'s tokens; the mean loss and clip ratio."""
    value_model, value_opt, (old_values, returns) = models.value, models.value_opt, targets
    batch = mask.shape[0]
    mb = grpo.minibatch_size or batch
    sums = {"value_loss": 0.0, "value_clip_ratio": 0.0}
    n = 0
    for _ in range(grpo.inner_updates):
        for s in range(0, batch, mb):
            part = rollout.rows(s, s + mb)
            with amp():
                values = state_values(value_model, part)
            loss, m = value_loss(
                values, old_values[s : s + mb], returns[s : s + mb], mask[s : s + mb], clip=grpo.ppo.value_clip
            )
            optimizer_step(value_model, value_opt, loss, 1.0, grpo.max_grad_norm)
            for k in sums:
                sums[k] += m[k]
            n += 1
    return {f"train/{k}": v / max(n, 1) for k, v in sums.items()}

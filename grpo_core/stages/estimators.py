"""Every advantage estimator of the RL step, one table (verl's ``core_algos`` keeps its estimators
in one file): ``ESTIMATORS`` maps ``algorithms.Estimator`` to a function (a step's ``ScoredGroups``,
its ``Models``, the recipe's ``grpo`` section, the forward passes' precision context) ->
``rl_types.Advantages``. The math they run is ``advantages.py``'s pure functions.

- ``group_advantages``: GRPO (§4.1.2-4.1.3): group z-scores of the rewards (outcome supervision) or
  the process credit of the steps' scores (process supervision, ``grpo.process_credit``);
- ``correct_advantages``: RFT and online RFT (§5.2.1): 1[correct];
- ``gae_advantages``: PPO (§4.1.1): GAE on the value model's estimates of KL-penalised rewards (the
  value model and its updates: ``ppo.py``).
"""

from __future__ import annotations

import contextlib

import torch

from grpo_core.advantages import gae, kl_penalised_rewards, rollout_advantages, whiten
from grpo_core.algorithms import Estimator
from grpo_core.config import GRPOConfig
from grpo_core.lm.policy import token_logprobs
from grpo_core.losses import kl_k3
from grpo_core.rewards.heads import state_values
from grpo_core.stages.rl_types import Advantages, Models, ScoredGroups, ValueTargets


def group_advantages(ex: ScoredGroups, models: Models, grpo: GRPOConfig, amp=None) -> Advantages:
    """GRPO's estimator (§4.1.2-4.1.3): ``advantages.rollout_advantages`` of the groups' scores."""
    mask = ex.rollout.completion_mask
    return Advantages(group_values(ex, grpo), mask, {})


def group_values(ex: ScoredGroups, grpo: GRPOConfig) -> torch.Tensor:
    """[N x G, T] GRPO's advantages of ``ex``'s groups (outcome or process supervision)."""
    return rollout_advantages(
        ex.scored, len(ex.questions), grpo.group_size, ex.rollout.completion_mask.shape[1], grpo.process_credit
    )


def correct_advantages(ex: ScoredGroups, models: Models, grpo: GRPOConfig, amp=None) -> Advantages:
    """RFT's and online RFT's gradient coefficient (§5.2.1): 1 on a correct solution's tokens, else 0."""
    mask = ex.rollout.completion_mask
    return Advantages(ex.scored.correct.float()[:, None].expand(-1, mask.shape[1]), mask, {})


def gae_advantages(ex: ScoredGroups, models: Models, grpo: GRPOConfig, amp=contextlib.nullcontext) -> Advantages:
    """PPO's estimator (``Estimator.GAE``): per-token KL-penalised rewards, the value model's
    estimates, GAE, whitened; the value model's mu passes of the clipped value loss come after the
    policy's update (``ppo.value_updates``, on the returned ``ValueTargets``). A completion without a
    finite reward is left out of both losses. Metrics: ``train/kl``, ``train/value_mean``,
    ``train/return_mean`` and the value loss's."""
    pc, rollout = grpo.ppo, ex.rollout
    if grpo.kl.reward > 0 and models.ref is None:
        raise ValueError(
            f"grpo.beta = {grpo.kl.reward} puts a KL to the reference in PPO's reward, but no reference model was given"
        )
    valid = torch.isfinite(ex.rewards)
    mask = rollout.completion_mask * valid[:, None].to(rollout.completion_mask.dtype)
    with torch.no_grad(), amp():
        old_logp = token_logprobs(models.policy, rollout)
        ref_logp = token_logprobs(models.ref, rollout) if grpo.kl.reward else old_logp  # no KL weight: no reference
        old_values = state_values(models.value, rollout)
    rewards = kl_penalised_rewards(torch.where(valid, ex.rewards, 0.0), old_logp, ref_logp, mask, grpo.kl.reward)
    advantages, returns = gae(rewards, old_values, mask, pc.gae_gamma, pc.gae_lambda)
    m = mask.bool()
    stats = {
        "train/kl": float(kl_k3(old_logp, ref_logp)[m].mean()) if m.any() else 0.0,
        "train/value_mean": float(old_values[m].mean()) if m.any() else 0.0,
        "train/return_mean": float(returns[m].mean()) if m.any() else 0.0,
    }
    return Advantages(whiten(advantages, mask), mask, stats, ValueTargets(old_values, returns))


ESTIMATORS = {Estimator.GROUP: group_advantages, Estimator.CORRECT: correct_advantages, Estimator.GAE: gae_advantages}

"""PPO for LLMs (DeepSeekMath §4.1.1, eq. 1-2), the baseline GRPO replaces: ``grpo.algorithm: ppo``.

Each step (``ppo_step``) shares GRPO's exploration (rollout + reward: ``rl.explore``) and its
clipped policy update (``rl.update``), and differs in the advantage: a value model, initialised
from the policy with a fresh one-output head, estimates each state's value; the per-token reward is
the KL penalty to the reference on every token plus the solution's reward on its last
(``advantages.kl_penalised_rewards``, the InstructGPT form); GAE with ``grpo.gae_gamma`` /
``grpo.gae_lambda`` turns them into advantages (whitened over the batch's tokens) and returns;
the value model then takes the clipped value loss (``losses.value_loss``). The KL lives in the
reward, so the policy loss has none (beta 0 there). One process only: the value model has no
data-parallel wrapper.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from grpo_core.advantages import gae, kl_penalised_rewards, whiten
from grpo_core.config import GRPOConfig
from grpo_core.data import Example
from grpo_core.losses import kl_k3, value_loss
from grpo_core.lm.policy import Rollout, token_logprobs
from grpo_core.rewards.heads import ScoreHead, reward_model_from
from grpo_core.rewards.scorer import RewardScorer
from grpo_core.stages.common import SINGLE
from grpo_core.stages.rl import explore, step_metrics, update
from grpo_core.training.distributed import Dist
from grpo_core.training.trainer import optimizer_step


def value_model_from(policy, seed: int):
    """A value model: the policy's body with a fresh one-output head at every token, drawn from
    ``seed`` (the same on every run of a recipe; the global random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return reward_model_from(policy, "prm")


def state_values(value_model, rollout: Rollout) -> torch.Tensor:
    """[B, T] value of the state in which each completion token was chosen: the head read at the
    position before the token (the last prompt token for the first)."""
    head = ScoreHead(value_model)
    return head(rollout.input_ids, rollout.attention_mask, rollout.prompt_len - 1)[:, :-1]


def ppo_step(policy, ref, value_model, value_opt, tokenizer, opt, questions: list[Example], gc: GRPOConfig,
             seed: int, scorer: RewardScorer | None = None, d: Dist = SINGLE, trained=None,
             amp=contextlib.nullcontext, record: list[dict] | None = None) -> dict[str, float]:
    """One exploration stage, its mu policy updates and its mu value updates; returns the step's
    metrics (GRPO's, plus ``train/value_loss``, ``train/value_clip_ratio``, ``train/value_mean``,
    ``train/return_mean``). ``trained``: the policy's log-prob reader, as in ``grpo_step``."""
    if d.world > 1:
        raise ValueError("grpo.algorithm=ppo runs in one process (its value model has no data-parallel wrapper)")
    clock = [time.perf_counter()]

    # Rollout and score, as GRPO.
    ex = explore(policy, tokenizer, questions, gc, seed, scorer, d, amp, record)
    clock.append(ex.sampled_at)
    rollout = ex.rollout

    # Advantages: per-token KL-penalised rewards, the value model's estimates, GAE. A completion
    # without a finite reward is left out of both losses.
    valid = torch.isfinite(ex.rewards)
    mask = rollout.completion_mask * valid[:, None].to(rollout.completion_mask.dtype)
    with torch.no_grad(), amp():
        old_logp = token_logprobs(policy, rollout)
        ref_logp = token_logprobs(ref, rollout)
        old_values = state_values(value_model, rollout)
    rewards = kl_penalised_rewards(torch.where(valid, ex.rewards, 0.0), old_logp, ref_logp, mask, gc.beta)
    advantages, returns = gae(rewards, old_values, mask, gc.gae_gamma, gc.gae_lambda)
    advantages = whiten(advantages, mask)
    clock.append(time.perf_counter())

    # Update: the policy with GRPO's clipped objective (the KL is in the reward), then the values.
    policy_gc = gc.model_copy(update={"beta": 0.0})
    sums, n_updates = update(policy, None, trained or policy, opt, dataclasses.replace(rollout, completion_mask=mask),
                             advantages, policy_gc, len(questions), d, amp, clock)
    value_metrics = value_updates(value_model, value_opt, rollout, mask, old_values, returns, gc, amp)

    metrics = step_metrics(sums, n_updates, ex.scored, ex.rewards, advantages, {}, rollout, len(ex.questions),
                           gc.group_size, opt, d, clock)
    m = mask.bool()
    return metrics | value_metrics | {"train/kl": float(kl_k3(old_logp, ref_logp)[m].mean()) if m.any() else 0.0,
                                      "train/value_mean": float(old_values[m].mean()) if m.any() else 0.0,
                                      "train/return_mean": float(returns[m].mean()) if m.any() else 0.0}


def value_updates(value_model, value_opt, rollout: Rollout, mask: torch.Tensor, old_values: torch.Tensor,
                  returns: torch.Tensor, gc: GRPOConfig, amp=contextlib.nullcontext) -> dict[str, float]:
    """mu passes of minibatch updates of the clipped value loss; the mean loss and clip ratio."""
    batch = mask.shape[0]
    mb = gc.minibatch_size or batch
    sums = {"value_loss": 0.0, "value_clip_ratio": 0.0}
    n = 0
    for _ in range(gc.inner_updates):
        for s in range(0, batch, mb):
            part = rollout.rows(s, s + mb)
            with amp():
                values = state_values(value_model, part)
            loss, m = value_loss(values, old_values[s : s + mb], returns[s : s + mb], mask[s : s + mb], clip=gc.value_clip)
            optimizer_step(value_model, value_opt, loss, 1.0, gc.max_grad_norm)
            for k in sums:
                sums[k] += m[k]
            n += 1
    return {f"train/{k}": v / max(n, 1) for k, v in sums.items()}

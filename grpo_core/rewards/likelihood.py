"""The zero-training verifier: a causal LM read through the probabilities it gives the tokens of a
solution (issue 28). A step is as sure as its least likely token: a miscopied operand or a wrong
sum is a token the model that learnt the task finds improbable. Measured on the demo's SFT model
(2026-11-24): right above wrong solutions of the same question 0.99 on hand-built solutions, 0.87
within groups of its own samples, where the trained ORM and PRM scored at chance. Every trained
reward model must beat this baseline, read from the model it was initialised from.
"""
from __future__ import annotations

import torch

from grpo_core.lm.policy import Rollout, token_logprobs


def step_lowest_logprobs(logp: torch.Tensor, ends: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, K] the lowest log-probability of any token of each step.

    logp: [B, T] log-probability of each completion token; ends: [B, K] long, the token where each
    step ends (0-based, inclusive; ``scorer.rollout_step_ends``); mask: [B, K] bool, real steps.
    Step k holds tokens ``ends[k-1] + 1 .. ends[k]`` (step 0 from token 0), so the separator before
    a step counts with it. Padding steps (mask False) are 0 (log 1).
    """
    t = torch.arange(logp.shape[1], device=logp.device)
    starts = torch.cat([torch.full_like(ends[:, :1], -1), ends[:, :-1]], dim=1)  # [B, K] previous end
    inside = (t[None, None, :] > starts[:, :, None]) & (t[None, None, :] <= ends[:, :, None])  # [B, K, T]
    lowest = torch.where(inside, logp[:, None, :], torch.inf).amin(dim=-1)
    return torch.where(mask & torch.isfinite(lowest), lowest, 0.0)


def lowest_logprob(logp: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """[B] the lowest log-probability of any token of each completion (EOS included: ending there is
    part of the solution); logp and completion_mask [B, T]. 0 (log 1) for a row with no token."""
    lowest = torch.where(completion_mask.bool(), logp, torch.inf).amin(dim=1)
    return torch.where(torch.isfinite(lowest), lowest, 0.0)


@torch.no_grad()
def likelihood_scores(model, tokenizer, rollout: Rollout, separator: str):
    """The causal LM ``model`` as a verifier of ``rollout``'s completions: [B] solution scores (the
    lowest token probability of the completion), [B, K] step scores (of each step) and the [B, K]
    bool mask of real steps."""
    from grpo_core.rewards.scorer import rollout_step_ends

    ends, mask = rollout_step_ends(tokenizer, rollout, separator)
    logp = token_logprobs(model, rollout).float()
    return (lowest_logprob(logp, rollout.completion_mask).exp(), step_lowest_logprobs(logp, ends, mask).exp(),
            mask)

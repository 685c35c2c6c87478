"""The GRPO objective (DeepSeekMath eq. 3) and its KL estimator, as pure tensor functions.

All tensors are [B, T]: B = N*G completions (groups consecutive), T completion tokens; ``mask`` is 1
on real completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Unbiased, non-negative estimator of KL(pi || pi_ref) per token (Schulman's k3).

    exp(ref - logp) - (ref - logp) - 1, elementwise, same shape as the inputs.
    """
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    agg: Aggregation,
    batch: BatchSize | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    seq-mean-token-mean (paper):  mean_i  1/|o_i| sum_t    (a completion with no tokens adds 0)
    token-mean (DAPO):            sum_{i,t} / sum_i |o_i|
    seq-mean-token-sum-norm (Dr. GRPO): mean_i sum_t / T   (T = padded length, a constant)

    ``batch``: the sizes of the global batch when these rows are one process's share of it (rows,
    loss tokens, padded length); the result is then this share's part of the global aggregate, and
    the parts of all processes sum to it. Default: the rows given are the whole batch.
    ``weights`` [B]: how many rows of the batch each row stands for, where repeated rows were
    passed once (``Rollout.distinct``'s counts); ``batch`` then counts every row. Default 1 each.
    """
    mask = mask.to(per_token.dtype)
    if weights is None:
        weights = torch.ones(per_token.shape[0], dtype=per_token.dtype, device=per_token.device)
    weights = weights.to(per_token.dtype)
    batch = batch or BatchSize(float(weights.sum()), float((mask * weights[:, None]).sum()), per_token.shape[1])
    # where, not multiply: padding may hold -inf log-probs, and nan * 0 is nan.
    masked = torch.where(mask > 0, per_token, 0.0)
    if agg == "seq-mean-token-mean":
        return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1) * weights).sum() / batch.rows
    if agg == "token-mean":
        return (masked * weights[:, None]).sum() / max(batch.tokens, 1.0)
    if agg == "seq-mean-token-sum-norm":
        return (masked.sum(dim=1) / batch.width * weights).sum() / batch.rows
    raise ValueError(f"unknown aggregation {agg!r}")


@dataclass(frozen=True)
class BatchSize:
    """The global batch an aggregate normalises by: completions, completion tokens, padded length."""

    rows: float
    tokens: float
    width: int


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    beta: float = 0.04,
    agg: Aggregation = "seq-mean-token-mean",
    batch: BatchSize | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate with the k3 KL penalty inside the loss (not in the reward).

    logp, old_logp, ref_logp, advantages, mask: [B, T]. ``clip_eps_high`` (DAPO clip-higher) sets the
    upper clip bound 1 + clip_eps_high; ``beta = 0`` ignores ``ref_logp`` (may be None). ``batch``:
    the global batch's sizes when these rows are one process's share; ``weights`` [B]: the rows each
    row stands for (see ``aggregate``). Returns the scalar loss to minimise and detached metrics
    (token means over the mask).
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    pg_loss = aggregate(per_token, mask, agg, batch, weights)
    # The metrics' token means count a row's tokens once per row it stands for.
    counted = mask if weights is None else mask * weights.to(mask.dtype)[:, None]
    metrics: dict[str, float] = {}
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        kl = kl_k3(logp, ref_logp)
        per_token = per_token + beta * kl
        metrics["kl"] = _masked_mean(kl, counted)
    loss = aggregate(per_token, mask, agg, batch, weights)
    metrics["pg_loss"] = float(pg_loss.detach())
    metrics["clip_ratio"] = _masked_mean((clipped < unclipped).to(logp.dtype), counted)
    metrics["ratio_mean"] = _masked_mean(ratio, counted)
    return loss, metrics


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``x`` over the mask, each token weighted by its mask value (0/1, or a row's count)."""
    m = mask.to(x.dtype)
    return float((torch.where(m > 0, x.detach(), 0.0) * m).sum() / m.sum().clamp(min=1))


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float = 0.2,
    agg: Aggregation = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss: 1/2 max((V - R)^2, (V_clip - R)^2) with V_clip = V_old + clip(V - V_old,
    -clip, clip), so that one update cannot move a value estimate far from the one the advantages used.

    values (trainable), old_values, returns, mask: [B, T]. Returns the scalar loss and detached metrics.
    """
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    loss = aggregate(per_token, mask, agg)
    return loss, {
        "value_loss": loss.item(),
        "value_clip_ratio": _masked_mean(((clipped - returns) ** 2 > (values - returns) ** 2).to(values.dtype), mask),
    }

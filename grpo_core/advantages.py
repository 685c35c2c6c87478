"""Group-relative advantages of GRPO (DeepSeekMath §4.1.2 outcome, §4.1.3 process supervision).

Pure tensor functions. Shapes: N questions, G completions per question, K steps per completion
(padded, see ``step_mask``), T tokens per completion.
"""

from __future__ import annotations

from typing import Literal

import torch


def _check_finite(name: str, x: torch.Tensor) -> None:
    # NaN/inf must be handled (counted, zeroed) by the caller; silently normalising them would
    # poison every advantage of the group.
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf; filter or replace them before normalising")


def outcome_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Outcome supervision: every token of completion i gets (r_i - mean(r)) / std(r).

    rewards: [N, G] one scalar reward per completion. Returns [N, G].
    std is the population std (1/G) as in the paper's z-score; a group with no spread (all equal,
    or G = 1) gets zero advantage, so it contributes no policy gradient.
    valid: optional [N, G] bool; invalid completions (e.g. a NaN reward) get zero advantage and
    the group's mean and std are taken over the valid ones only.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    _check_finite("rewards (valid)", rewards[valid])
    r = torch.where(valid, rewards.double(), 0.0)
    count = valid.sum(dim=1, keepdim=True).clamp(min=1)
    mean = r.sum(dim=1, keepdim=True) / count
    centred = torch.where(valid, r - mean, 0.0)
    std = (centred.pow(2).sum(dim=1, keepdim=True) / count).sqrt()
    spread = std > 1e-12 * (1 + mean.abs())
    adv = torch.where(spread & valid, centred / torch.where(spread, std, torch.ones_like(std)), 0.0)
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def process_advantages(
    step_rewards: torch.Tensor,
    step_ends: torch.Tensor,
    step_mask: torch.Tensor,
    seq_len: int,
    credit: Literal["sum", "min"] = "sum",
) -> torch.Tensor:
    """Process supervision: normalise step rewards over the group, then credit each token with
    those still ahead.

    step_rewards: [N, G, K] reward of step k of completion i (padding ignored).
    step_ends:    [N, G, K] long, 0-based inclusive token index where step k ends in the completion.
    step_mask:    [N, G, K] bool, True for real steps.
    credit: ``sum`` (the paper, DeepSeekMath §4.1.3: A_hat_{i,t} = sum_{index(j) >= t} r_tilde^{index(j)})
    or ``min`` (PURE, arXiv 2504.15275: the minimum instead of the sum, so that a token's credit is
    that of the worst step still ahead, and adding steps cannot raise it).
    Returns [N, G, seq_len]: token t gets the sum (or min) of the normalised rewards of the steps
    with end >= t; 0 where no step is ahead.
    Normalisation uses mean and population std over *all* valid steps of a question's group; a group
    with no spread gets zero. A step ending past seq_len covers the whole sequence.
    """
    if step_rewards.dim() != 3 or not (step_rewards.shape == step_ends.shape == step_mask.shape):
        raise ValueError("step_rewards, step_ends and step_mask must all be [N, G, K]")
    mask = step_mask.bool()
    _check_finite("step_rewards (valid steps)", step_rewards[mask])
    r = torch.where(mask, step_rewards.double(), 0.0)
    n, g, k = r.shape
    count = mask.flatten(1).sum(dim=1).clamp(min=1).double()  # [N]
    mean = r.flatten(1).sum(dim=1) / count
    centred = torch.where(mask, r - mean[:, None, None], 0.0)
    std = (centred.pow(2).flatten(1).sum(dim=1) / count).sqrt()
    spread = std > 1e-12 * (1 + mean.abs())
    normed = torch.where(spread[:, None, None], centred / torch.where(spread, std, 1.0)[:, None, None], 0.0)
    # Scatter each step's reward onto its end token, then a reverse cumulative sum (min) gives every
    # token the sum (min) over steps ending at or after it: O(N*G*(K+T)), not an [N, G, K, T] comparison.
    ends = step_ends.long().clamp(0, seq_len - 1)
    if credit == "sum":
        per_token = torch.zeros(n, g, seq_len, dtype=torch.float64)
        per_token.scatter_add_(2, torch.where(mask, ends, 0), normed)
        adv = per_token.flip(-1).cumsum(-1).flip(-1)
    elif credit == "min":
        per_token = torch.full((n, g, seq_len), torch.inf, dtype=torch.float64)
        per_token.scatter_reduce_(2, torch.where(mask, ends, 0), torch.where(mask, normed, torch.inf), reduce="amin")
        adv = per_token.flip(-1).cummin(-1).values.flip(-1)
        adv = torch.where(torch.isinf(adv), 0.0, adv)  # no step ahead
    else:
        raise ValueError(f"credit must be 'sum' or 'min', got {credit!r}")
    return adv.to(step_rewards.dtype if step_rewards.is_floating_point() else torch.float32)


def kl_penalised_rewards(
    scores: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """PPO's per-token rewards (DeepSeekMath eq. 2, the InstructGPT form): r_t = -beta * (log pi(o_t) -
    log pi_ref(o_t)) on every completion token, plus the completion's score on its last token.

    scores: [B] one reward per completion; logp, ref_logp, mask: [B, T] (right-padded). Returns [B, T],
    zero on padding. A completion with no tokens gets nothing (its score has nowhere to go).
    """
    m = mask.bool()
    rewards = torch.where(m, -beta * (logp - ref_logp), 0.0)
    length = m.sum(dim=1)
    rows = torch.nonzero(length > 0).squeeze(1)
    rewards[rows, length[rows] - 1] += scores[rows].to(rewards.dtype)
    return rewards


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), PPO's advantage (DeepSeekMath §4.1.1).

    rewards, values, mask: [B, T], right-padded; the value after a completion's last token is 0 (the
    episode ends there). delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}.
    Returns (advantages, returns = advantages + values), both [B, T] and zero on padding.
    """
    m = mask.to(values.dtype)
    r, v = rewards * m, values * m
    advantages = torch.zeros_like(v)
    running = torch.zeros_like(v[:, 0])
    next_value = torch.zeros_like(v[:, 0])
    for t in reversed(range(v.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        running = (delta + gamma * lam * running) * m[:, t]
        advantages[:, t] = running
        next_value = v[:, t]
    return advantages, (advantages + v) * m


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] values standardised over the batch's real tokens (mean 0, population std 1), zero on
    padding: PPO's advantage normalisation (one scale for the whole batch, unlike GRPO's per group)."""
    m = mask.bool()
    if not m.any():
        return torch.zeros_like(x)
    mean = x[m].mean()
    std = x[m].std(unbiased=False)
    return torch.where(m, (x - mean) / (std + 1e-8), 0.0)


def token_steps(step_ends: torch.Tensor, step_mask: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[N, G, K] step ends and mask -> [N, G, seq_len] long: each token's step, the first whose end
    >= the token (K where no step is ahead). Padding steps end beyond every token; the ends are made
    non-decreasing, as the search needs: a step ending before the one ahead of it gets no token."""
    n, g, k = step_mask.shape
    ends = torch.where(step_mask.bool(), step_ends.long().clamp(max=seq_len - 1), seq_len).reshape(n * g, k)
    ends = ends.cummax(dim=1).values.contiguous()
    tokens = torch.arange(seq_len).expand(n * g, seq_len).contiguous()
    return torch.searchsorted(ends, tokens).view(n, g, seq_len).clamp(max=k)


def centred_process_advantages(
    step_scores: torch.Tensor,
    step_ends: torch.Tensor,
    step_mask: torch.Tensor,
    seq_len: int,
    outcome: torch.Tensor | None = None,
    classes: torch.Tensor | None = None,
    weight: float = 1.0,
) -> torch.Tensor:
    """Process supervision that rewards steps, not positions (ours; the paper's form is
    ``process_advantages``): outcome GRPO's advantage on every token, plus the PRM's score of the
    token's own step centred among the completions of the same outcome class that reach that step.

        A_{i,t} = z_i + weight * (p_{i,k} - mean_{j in C(i), j has step k} p_{j,k}),  k = the step of t

    step_scores: [N, G, K] the PRM's probability that step k is right (padding ignored).
    step_ends:   [N, G, K] long, 0-based inclusive token index where step k ends; token t belongs to
                 the first step whose end >= t (a step ending past seq_len covers the rest).
    step_mask:   [N, G, K] bool, True for real steps (a completion without one gets zero everywhere).
    outcome:     [N, G] the outcome sources' reward (the checker, the ORM), z-scored per group as
                 ``outcome_advantages`` over the completions with at least one step (a step-less one
                 takes no part and gets 0, as under the paper's form): z_i. None: no outcome source;
                 the PRM term is then the whole advantage, divided by its group's population std.
    classes:     [N, G] the outcome class of each completion (the checker's verdict, where it is
                 weighted), or None: one class per group (PROGRS, arXiv 2604.02341, centres within
                 outcome classes).
    Returns [N, G, seq_len].

    Why this form (docs/reward-models.md, "The process advantage"): centring at each step position
    means a PRM that gives every completion the same profile over positions (constant, falling like a
    running minimum, anything) adds exactly 0, so a checker-silent group gets no push toward or away
    from any position; centring within outcome classes leaves each class's mean advantage at outcome
    GRPO's; the term is a probability difference, |term| < weight, so with a 0/1 checker (z gap >= 2)
    and weight <= 1 every token of a right completion keeps a higher advantage than every token of a
    wrong one; a token is credited with its own step, so an early token's credit does not grow with
    the number of steps ahead (PURE, arXiv 2504.15275).
    """
    if step_scores.dim() != 3 or not (step_scores.shape == step_ends.shape == step_mask.shape):
        raise ValueError("step_scores, step_ends and step_mask must all be [N, G, K]")
    mask = step_mask.bool()
    _check_finite("step_scores (valid steps)", step_scores[mask])
    n, g, k = mask.shape
    valid = mask.any(dim=2)  # [N, G] completions with at least one step
    p = torch.where(mask, step_scores.double(), 0.0)
    cls = torch.zeros(n, g) if classes is None else classes.double()
    same = (cls[:, :, None] == cls[:, None, :]) & valid[:, :, None] & valid[:, None, :]  # [N, G, G]
    reach = same.double() @ mask.double()  # [N, G, K] completions of i's class with a step k
    mean = (same.double() @ p) / reach.clamp(min=1)
    centred = torch.where(mask, p - mean, 0.0)
    if outcome is None:
        count = mask.flatten(1).sum(1).clamp(min=1)
        std = (centred.pow(2).flatten(1).sum(1) / count).sqrt()
        scale = torch.where(std > 1e-12, 1.0 / std.clamp(min=1e-12), 0.0)[:, None, None]
        z = torch.zeros(n, g, dtype=torch.float64)
    else:
        scale, z = weight, outcome_advantages(torch.where(valid, outcome.double(), 0.0), valid).double()
    own = token_steps(step_ends, mask, seq_len)
    term = torch.cat([centred * scale, torch.zeros(n, g, 1, dtype=torch.float64)], dim=2).gather(2, own)
    adv = torch.where(valid[:, :, None], z[:, :, None] + term, 0.0)
    return adv.to(step_scores.dtype if step_scores.is_floating_point() else torch.float32)


def position_profile(advantages: torch.Tensor, step_ends: torch.Tensor, step_mask: torch.Tensor) -> dict:
    """Where the advantage goes, by step position: each completion's advantage at the token where
    each of its steps ends (the value of that step's tokens under every form here), summed by the
    step's place in its completion: ``first``, ``middle``, ``last`` (the step before the final one)
    and ``answer`` (the final line). A completion of one step has only ``answer``.

    advantages: [B, T]; step_ends: [B, K] long; step_mask: [B, K] bool (a prefix of real steps).
    Returns {place: (sum, count)} as two floats each: a diagnostic to pool over processes and steps,
    whose mean in checker-silent groups is 0 for an unbiased estimator whatever the PRM says.
    """
    mask = step_mask.bool()
    at_end = advantages.double().gather(1, step_ends.long().clamp(0, advantages.shape[1] - 1))
    k = torch.arange(mask.shape[1])[None, :]
    steps = mask.sum(dim=1, keepdim=True)
    places = {
        "first": (k == 0) & (steps > 1),
        "middle": (k > 0) & (k < steps - 2),
        "last": (k == steps - 2) & (k > 0),
        "answer": k == steps - 1,
    }
    return {name: (float(at_end[where & mask].sum()), float((where & mask).sum())) for name, where in places.items()}


def paper_step_rewards(scored) -> torch.Tensor:
    """[B, K] the paper's step rewards (§4.1.3, as ``process_advantages`` takes them): the PRM's
    weighted step score, the outcome sources' reward added to each completion's last step."""
    rewards = scored.prm_weight * scored.step_scores
    if scored.base is not None:
        rows = torch.arange(len(rewards))
        last = (scored.step_mask.sum(dim=1) - 1).clamp(min=0)
        rewards[rows, last] += scored.base
    return rewards


# ``grpo.process_credit``: how a process-supervised batch's scores become token advantages,
# (scored, N, G, T) -> [N, G, T].
def _centred(scored, n: int, g: int, seq_len: int) -> torch.Tensor:
    view = lambda x: None if x is None else x.reshape(n, g, *x.shape[1:])  # noqa: E731
    return centred_process_advantages(
        view(scored.step_scores),
        view(scored.step_ends),
        view(scored.step_mask),
        seq_len,
        outcome=view(scored.base),
        classes=view(scored.correct) if scored.by_checker else None,
        weight=scored.prm_weight,
    )


def _paper(credit: str):
    def advantages(scored, n: int, g: int, seq_len: int) -> torch.Tensor:
        k = scored.step_mask.shape[1]
        view = lambda x: x.reshape(n, g, k)  # noqa: E731
        return process_advantages(
            view(paper_step_rewards(scored)), view(scored.step_ends), view(scored.step_mask), seq_len, credit
        )

    return advantages


PROCESS_CREDIT = {"centred": _centred, "sum": _paper("sum"), "min": _paper("min")}


def rollout_advantages(scored, n_questions: int, g: int, seq_len: int, credit: str = "centred") -> torch.Tensor:
    """GRPO's [N x G, T] advantages from a batch's scores (a ``rewards.scorer.Scored``), by their
    supervision: every token of a completion gets its solution reward's group z-score (outcome,
    §4.1.2); or, process supervision, by ``credit`` (``grpo.process_credit``, ``PROCESS_CREDIT``):
    ``centred`` (``centred_process_advantages``, the default), or the paper's normalised step
    rewards of the steps at or after the token, summed (``sum``, §4.1.3) or their minimum (``min``,
    PURE). A completion without a finite reward gets none (the scorer counts it)."""
    if scored.supervision == "outcome":
        rewards = scored.outcome.view(n_questions, g)
        return outcome_advantages(rewards, torch.isfinite(rewards)).view(-1, 1).expand(-1, seq_len)
    if credit not in PROCESS_CREDIT:
        raise ValueError(f"credit must be one of {sorted(PROCESS_CREDIT)}, got {credit!r}")
    return PROCESS_CREDIT[credit](scored, n_questions, g, seq_len).reshape(n_questions * g, seq_len)

"""What every RL algorithm of the GRPO stage shares (``grpo.algorithm``: GRPO, online RFT, RFT, PPO;
``algorithms.ALGORITHMS``): the models a step uses, the step's questions and sampling seed, the
exploration stage (rollout + reward), what an advantage estimator returns, the clipped policy update
and the step's metrics. ``grpo.py`` runs the step and ``ppo.py`` adds PPO's estimator, both from
these, so no algorithm imports another."""
from __future__ import annotations

import contextlib
import time
from typing import Callable, NamedTuple

import torch

from grpo_core.advantages import rollout_advantages
from grpo_core.config import GRPOConfig
from grpo_core.data import Example, prompt_text
from grpo_core.losses import BatchSize, grpo_loss
from grpo_core.lm import adapters
from grpo_core.lm.policy import Rollout, generate, token_logprobs
from grpo_core.rewards.heads import group_auc
from grpo_core.rewards.scorer import COUNT_STATS, RewardError, RewardScorer, Scored
from grpo_core.stages.common import SINGLE
from grpo_core.training.distributed import Dist
from grpo_core.training.trainer import optimizer_step


class Models(NamedTuple):
    """The models of a step: the policy (trained), the frozen reference (None where the algorithm
    neither samples it nor weighs a KL to it), PPO's value model and its optimizer."""

    policy: torch.nn.Module
    ref: torch.nn.Module | None = None
    value: torch.nn.Module | None = None
    value_opt: torch.optim.Optimizer | None = None


class ValueTargets(NamedTuple):
    """What PPO's value model is trained towards after the policy's update: the [B, T] values the
    advantages were computed from (the clipping's anchor) and the [B, T] returns."""

    old_values: torch.Tensor
    returns: torch.Tensor


class Advantages(NamedTuple):
    """An advantage estimator's output: [B, T] advantages, the [B, T] tokens that learn (the
    completions' tokens, less any the estimator leaves out), metrics summed over processes, and the
    value model's targets where the algorithm trains one (PPO)."""

    values: torch.Tensor
    mask: torch.Tensor
    stats: dict[str, float]
    value_targets: ValueTargets | None = None


# The advantage estimators by name (``algorithms.ALGORITHMS``' ``advantage`` column; verl's
# ``core_algos`` registry shape): each registers where it is defined, GRPO's and RFT's below, PPO's
# GAE in ``ppo.py``. Signature: (a step's ``Exploration``, its ``Models``, ``GRPOConfig``, the forward
# passes' precision context) -> ``Advantages``.
ADVANTAGES: dict[str, Callable[..., Advantages]] = {}


def advantage_estimator(name: str):
    """Register the decorated function as the estimator ``name``."""
    def register(fn):
        ADVANTAGES[name] = fn
        return fn
    return register


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of a step: rollouts depend only on (seed, step), so a resume redraws them."""
    return (seed * 1_000_003 + step * 7919) % (2**31)


def row_temperatures(gc: GRPOConfig, n_questions: int) -> list[float]:
    """Sample i of every group uses temperatures[i % len] (or the single temperature)."""
    temps = gc.temperatures or (gc.temperature,)
    return [temps[i % len(temps)] for _ in range(n_questions) for i in range(gc.group_size)]


class Exploration(NamedTuple):
    """A step's samples, scored: this process's share of the questions (N), the rollout of their
    groups (N x G rows, a group's rows consecutive), the scores and when sampling ended."""

    questions: list[Example]
    rollout: Rollout
    scored: Scored
    sampled_at: float

    @property
    def rewards(self) -> torch.Tensor:
        """[N x G] each solution's weighted reward (NaN where none could be given), either supervision."""
        return self.scored.outcome

    def groups(self, index: list[int], g: int) -> "Exploration":
        """Groups ``index`` (of the N, each G rows), in that order: len(index) x G rows."""
        rows = torch.tensor([i * g + j for i in index for j in range(g)], dtype=torch.long)
        return Exploration([self.questions[i] for i in index], self.rollout.select(rows), self.scored.select(rows),
                           self.sampled_at)

    @staticmethod
    def cat(parts: list["Exploration"], pad_id: int) -> "Exploration":
        """The groups of ``parts`` in order, as one batch (reward statistics: the first part's)."""
        return Exploration([q for p in parts for q in p.questions], Rollout.cat([p.rollout for p in parts], pad_id),
                           Scored.cat([p.scored for p in parts]), max(p.sampled_at for p in parts))

    def checked(self) -> list[dict]:
        """Every completion with its question and the answer checker's verdict (the rollout log's rows)."""
        g = len(self.rewards) // max(len(self.questions), 1)
        return [{"question": q.question, "gold": q.gold, "completion": text, "correct": bool(ok)}
                for q, text, ok in zip((q for q in self.questions for _ in range(g)), self.rollout.texts,
                                       self.scored.correct)]


def with_gradient(advantages: torch.Tensor, g: int) -> torch.Tensor:
    """[N x G, T] advantages -> [N] bool: the groups with any non-zero advantage, i.e. that carry a
    policy gradient (a group whose rewards have no spread has none: only the KL term)."""
    return advantages.reshape(-1, g * advantages.shape[-1]).ne(0).any(-1)


@advantage_estimator("group")
def group_advantages(ex: Exploration, models: Models, gc: GRPOConfig, amp=None) -> Advantages:
    """GRPO's estimator (§4.1.2-4.1.3): ``advantages.rollout_advantages`` of the groups' scores."""
    mask = ex.rollout.completion_mask
    values = rollout_advantages(ex.scored, len(ex.questions), gc.group_size, mask.shape[1], gc.process_credit)
    return Advantages(values, mask, {})


@advantage_estimator("correct")
def correct_advantages(ex: Exploration, models: Models, gc: GRPOConfig, amp=None) -> Advantages:
    """RFT's and online RFT's gradient coefficient (§5.2.1): 1 on a correct solution's tokens, else 0."""
    mask = ex.rollout.completion_mask
    return Advantages(ex.scored.correct.float()[:, None].expand(-1, mask.shape[1]), mask, {})


def has_spread(ex: Exploration, gc: GRPOConfig) -> torch.Tensor:
    """[N] bool: the groups whose GRPO advantages are not all zero (those that carry a gradient)."""
    n, width = len(ex.questions), ex.rollout.completion_mask.shape[1]
    return with_gradient(rollout_advantages(ex.scored, n, gc.group_size, width, gc.process_credit), gc.group_size)


def sample_groups(policy, tokenizer, questions: list[Example], slots: list[int], gc: GRPOConfig, seed: int,
                  scorer: RewardScorer, amp=contextlib.nullcontext) -> Exploration:
    """G completions of each of ``questions``, scored. ``slots``: each question's row of the step's
    global batch; sample j of slot i is seeded by (``seed``, i * G + j), whichever process draws it."""
    g = gc.group_size
    prompts = [prompt_text(q.question) for q in questions for _ in range(g)]
    temperatures = row_temperatures(gc, len(questions))
    with amp():
        rollout = generate(policy, tokenizer, prompts, max_new_tokens=gc.max_new_tokens, temperatures=temperatures,
                           seed=seed, row_ids=[i * g + j for i in slots for j in range(g)])
    sampled_at = time.perf_counter()
    scored = scorer(rollout, [q.gold for q in questions for _ in range(g)])
    return Exploration(questions, rollout, scored, sampled_at)


def explore(policy, tokenizer, questions: list[Example], mine: slice, gc: GRPOConfig, seed: int,
            scorer: RewardScorer, d: Dist = SINGLE, amp=contextlib.nullcontext) -> Exploration:
    """Sample G completions of this process's share ``mine`` of the step's ``questions`` (whole
    groups: ``Dist.shard``) and score them: GRPO's and PPO's exploration stage. Raises
    ``RewardError`` when no completion of the step got a finite reward."""
    ex = sample_groups(policy, tokenizer, questions[mine], list(range(mine.start, mine.stop)), gc, seed, scorer, amp)
    if float(d.sum(torch.isfinite(ex.rewards).sum())) == 0:  # before any update: nothing to learn from
        errors = float(d.sum((ex.scored.stats or {}).get("reward/rule_errors", 0.0)))
        raise RewardError(f"none of the step's {len(questions) * gc.group_size} completions got a finite reward (rule "
                          f"checker errors: {errors:.0f}; the others had NaN or inf scores): the reward is broken")
    return ex


def update(policy, ref, trained, opt, rollout: Rollout, advantages: torch.Tensor, gc: GRPOConfig,
           n_global: int, d: Dist, amp, clock: list[float]) -> tuple[dict[str, float], int]:
    """The step's optimizer updates; returns this process's summed loss terms and the update count.
    The loss has the k3 KL to ``ref`` weighted by ``gc.kl.loss`` (GRPO's beta; 0 where the algorithm
    puts the KL in the reward, PPO, or has none, RFT). Appends to ``clock`` when pi_old's and the
    reference's log-probs are ready and when it is done."""
    beta = gc.kl.loss
    if beta > 0 and ref is None:
        raise ValueError(f"grpo.beta = {beta} weighs a KL to the reference in the loss, but no reference model was given")
    batch = rollout.completion_mask.shape[0]
    # A minibatch is minibatch_size rows of the global batch: each process's share of it.
    if gc.minibatch_size and gc.minibatch_size % d.world:
        raise ValueError(f"grpo.minibatch_size = {gc.minibatch_size} does not split evenly over {d.world} processes")
    mb = (gc.minibatch_size or n_global * gc.group_size) // d.world
    starts = range(0, batch, mb)
    # With a single update on the whole batch pi_old is the current policy: its log-probs are the
    # update's own (detached), which saves a forward pass. Otherwise they are fixed up front.
    single_update = gc.inner_updates == 1 and mb == batch
    # A minibatch's repeated rows (a group's solutions sampled alike, with equal advantages) are
    # passed once, weighted by their count: every pass below costs its distinct rows only, and the
    # loss and its gradient are those of all the rows.
    parts = []
    for s in starts:
        part, adv = rollout.rows(s, s + mb), advantages[s : s + mb]
        rows = part.distinct(adv, part.completion_mask)
        parts.append((part.select(rows.index), adv[rows.index], rows.counts))
    # The global minibatches' sizes (the loss's normalisers): the widest completion and every
    # minibatch's token count over the processes, in two reductions.
    width = d.max(rollout.completion_mask.shape[1])
    tokens = d.sum(torch.stack([rollout.completion_mask[s : s + mb].sum() for s in starts])).tolist()
    sizes = [BatchSize(mb * d.world, n, width) for n in tokens]
    with d.gathered(trained), torch.no_grad(), amp():  # FSDP: on the whole policy, as many passes as a process has
        old_logp = None if single_update else [token_logprobs(policy, part) for part, *_ in parts]
        with adapters.off(ref):  # a LoRA policy is its own reference, its adapter off
            ref_logp = [token_logprobs(ref, part) for part, *_ in parts] if beta > 0 else None
    clock.append(time.perf_counter())
    sums: dict[str, float] = {}
    n_updates = 0
    for _ in range(gc.inner_updates):
        for i, ((part, adv, counts), global_mb) in enumerate(zip(parts, sizes)):
            with amp():
                logp, entropy = token_logprobs(trained, part, with_entropy=True)
            old = logp.detach() if old_logp is None else old_logp[i]
            loss, m = grpo_loss(logp, old, None if ref_logp is None else ref_logp[i], adv, part.completion_mask,
                                clip_eps=gc.clip_eps, clip_eps_high=gc.clip_eps_high, beta=beta, agg=gc.loss_agg,
                                batch=global_mb, weights=counts)
            # This process's share of the global loss, times the world size: DDP averages.
            grad_norm = optimizer_step(policy, opt, loss, d.world, gc.max_grad_norm)
            mask = part.completion_mask * counts[:, None]  # each distinct row's tokens, once per row it stands for
            m.update(entropy=float((entropy * mask).sum() / mask.sum().clamp(min=1)))
            # Token means (kl, clip_ratio, ratio_mean, entropy) weighted by this process's share of
            # the minibatch's tokens: summed over the processes they are the global token means,
            # as the loss terms (already shares) sum to the global loss.
            share = float(mask.sum()) / max(global_mb.tokens, 1.0)
            m = {k: v if k == "pg_loss" else v * share for k, v in m.items()} | {"loss": loss.item()}
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm  # the same on every process
            n_updates += 1
    clock.append(time.perf_counter())
    return sums, n_updates


def step_metrics(sums: dict[str, float], n_updates: int, first: Exploration, batch: Exploration,
                 advantages: torch.Tensor, reward_stats: dict[str, float], g: int, opt, d: Dist,
                 clock: list[float], drawn: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """The step's metrics over the global batch: loss terms summed over processes, timings and
    rates averaged, counts summed, per-completion statistics gathered. The rewards are those of
    ``first``, the step's questions as drawn (before dynamic sampling's filter: comparable with and
    without it); lengths and zero-advantage groups those of ``batch``, what trained. ``drawn``:
    dynamic sampling's counts (``questions.fill``). ``clock``: the times at the step's start, after
    the first draw's sampling, scoring (and any redraws), log-probs and updates."""
    t0, t1, t2, t3, t4 = clock
    no_gradient = ~with_gradient(advantages, g)  # [n] this process's groups without a gradient
    metrics = {f"train/{k}": (v if k == "grad_norm" else float(d.sum(v))) / n_updates for k, v in sums.items()}
    stats = first.scored.stats or {}
    metrics |= d.mean({k: v for k, v in stats.items() if k not in COUNT_STATS}
                      | {"time/rollout_s": t1 - t0, "time/reward_s": t2 - t1, "time/logprob_s": t3 - t2,
                         "time/update_s": t4 - t3} | ({} if drawn is None else {"time/redraw_s": drawn["seconds"]}))
    metrics |= {k: float(d.sum(v)) for k, v in stats.items() if k in COUNT_STATS}
    # Per-completion statistics over the global batch.
    rewards, correct = d.gather(first.rewards.double()), d.gather(first.scored.correct.double())
    lengths, truncated = d.gather(batch.rollout.completion_mask.sum(1).double()), d.gather(batch.rollout.truncated.double())
    n = len(batch.questions)
    batch_zero = d.gather(no_gradient.double())
    first_zero = batch_zero if drawn is None else d.gather((~drawn["first_spread"]).double())
    tokens = float(lengths.sum()) if drawn is None else float(d.sum(drawn["tokens"]))  # every draw's
    sampling_s = (t1 - t0) + (0.0 if drawn is None else drawn["seconds"])
    finite = torch.isfinite(rewards)
    metrics.update({k: float(d.sum(v)) for k, v in reward_stats.items()})
    metrics.update({
        "train/accuracy": float(correct.mean()),
        "train/reward_mean": float(rewards.nanmean()),
        "train/reward_std": float(rewards[finite].std(unbiased=False)) if finite.sum() > 1 else 0.0,
        "train/frac_reward_zero_std": float(first_zero.mean()),  # before any filter
        "train/frac_batch_zero_std": float(batch_zero.mean()),   # what trained: groups without a gradient
        "train/completion_len": float(lengths.mean()),
        "train/frac_truncated": float(truncated.mean()),
        "train/lr": opt.param_groups[0]["lr"],
        "perf/tokens_per_s": tokens / sampling_s,
    })
    # Staleness: each learned reward model's ranking of a group's solutions against the checker, on
    # the samples the policy draws now (what GRPO's group z-score sees; a frozen one goes stale as
    # the policy moves away from the samples it was trained on). Logged whatever its weight.
    for name, scores in first.scored.learned.items():
        auc, mixed = group_auc(d.gather(scores.double()), correct, g)
        metrics |= {f"reward/{name}_within_auc": auc, f"reward/{name}_mixed_groups": float(mixed)}
    if drawn is not None:
        draws = d.gather(drawn["draws"].double())
        # Groups sampled in all; in the batch with spread; sampled and left out (the bound: redraws x batch).
        metrics |= {"sampling/groups_drawn": float(draws.sum()),
                    "sampling/groups_kept": float(d.gather(drawn["spread"].double()).sum()),
                    "sampling/groups_dropped": float(draws.sum()) - len(draws)}
    return metrics

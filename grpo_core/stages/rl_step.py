"""The RL step, read top to bottom (the shape of nanochat's ``chat_rl.py``): one exploration stage
and its updates for ``grpo.algorithm`` (GRPO, DeepSeekMath §4.1, and its §5 peers: PPO, RFT, online
RFT; ``algorithms.ALGORITHMS``). The stage that runs it step after step is ``stages/grpo.py``.

``rl_step`` runs four phases, each a section below, in the order they run, each returning what it made and
its seconds (``time/*`` metrics: the first draw's sampling and scoring, the redraws, the estimator, the
log-prob passes and the updates):

1. ``explore``: G completions of each question from pi_old (RFT: the frozen starting model), scored by the answer
   checker and the reward models (``rewards/scorer.py``; process supervision scores every step); with dynamic
   sampling (``grpo.redraws``) a slot whose group fails dynamic sampling's test
   (``questions.passes_dynamic_sampling``) samples another question's group instead, up to ``redraws`` times.
2. ``estimate``: the algorithm's advantage estimator (``estimators.ESTIMATORS``: group z-scores or
   process credit for GRPO, 1[correct] for RFT and online RFT, GAE for PPO), over the pure math of
   ``advantages.py``.
3. ``update``: mu passes of the clipped-ratio objective (``losses.grpo_loss``) on minibatches,
   with the k3 KL to the frozen reference where the algorithm puts it in the loss; after it
   ``rl_step`` trains PPO's value model (``ppo.value_updates``).
4. ``step_metrics``: every cross-process reduction of the step.

Where this GRPO differs from the paper's (§4.1, §4.2), by default or by a setting:

- the reward may add the answer checker to the learned ORM / PRM (``grpo.reward_weights``); the
  paper's RL reads its reward model alone;
- the process advantage is centred (``grpo.process_credit``: ``advantages.centred_process_advantages``;
  the paper's sum is an option);
- keep-best (``grpo.keep_best``, on by default) publishes the step with the best validation
  accuracy, the last one beside it; the paper's policy is the last;
- a completion without a finite reward (no verdict, a NaN score) gets no advantage;
- options the paper has not, each off by default: dynamic sampling and the pass-rate curriculum
  (``questions.py``), PURE's min-form process credit, DAPO's clip-higher and token-mean and Dr.
  GRPO's aggregations (``losses.py``), LoRA adapters, a calculator the model calls (``model.calculator``:
  ``lm/tool.py``), whose tokens are not the policy's: ``update`` leaves them out of the loss, ratio, KL and entropy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import NamedTuple

import torch

from grpo_core.advantages import position_profile
from grpo_core.algorithms import ALGORITHMS
from grpo_core.config import GRPOConfig
from grpo_core.data import Example, prompt_text
from grpo_core.lm import adapters
from grpo_core.lm.policy import Rollout, generate, token_logprobs
from grpo_core.losses import BatchSize, grpo_loss
from grpo_core.rewards.heads import group_auc
from grpo_core.rewards.scorer import COUNT_STATS, RewardError, RewardScorer
from grpo_core.rewards.steps import rollout_step_ends
from grpo_core.seeds import draw_seed, step_seed
from grpo_core.stages.estimators import ESTIMATORS
from grpo_core.stages.ppo import value_updates
from grpo_core.stages.questions import QuestionSampler, passes_dynamic_sampling
from grpo_core.stages.rl_types import Advantages, Models, ScoredGroups, with_gradient
from grpo_core.training.distributed import SINGLE, Dist
from grpo_core.training.trainer import apply_gradients


@dataclasses.dataclass
class Learner:
    """What every step of a run uses: the models, the tokenizer, the policy's optimizer, the recipe's
    ``grpo`` section, the reward, the questions a redraw takes from (``grpo.redraws``), the round's
    seed, the processes, the module whose forward gives the policy's log-probs as trained
    (``wrapped``: DDP/FSDP's wrapper; None in one process: the policy) and the forward passes'
    precision context (``runtime.autocast``)."""

    models: Models
    tokenizer: object
    opt: torch.optim.Optimizer
    grpo: GRPOConfig
    scorer: RewardScorer
    seed: int
    question_sampler: QuestionSampler | None = None
    d: Dist = SINGLE
    wrapped: torch.nn.Module | None = None
    amp: object = contextlib.nullcontext

    @property
    def sampling_model(self) -> torch.nn.Module:
        """The model the rollouts come from: pi_old, or the frozen starting model (RFT)."""
        return self.models.ref if ALGORITHMS[self.grpo.algorithm].samples == "reference" else self.models.policy


def rl_step(
    learner: Learner, questions: list[Example], step: int, record: list[dict] | None = None
) -> dict[str, float]:
    """One exploration stage and its mu updates on the step's ``questions`` (the global batch) by
    ``grpo.algorithm``'s row of ``ALGORITHMS``; returns the step's metrics. ``record``: this
    process's checked completions are appended to it (reward-model data for the next round).

    Under torchrun each process samples, scores and trains on a contiguous share of the questions,
    whole groups, so advantages need no communication; the loss is normalised by the global batch
    (``BatchSize``) and DDP averages the gradients. Samples are seeded by (step, global row), so N
    processes draw the rollouts one process would."""
    samples = explore(learner, questions, step)
    if record is not None:
        record += samples.batch.checked()  # what trained (with dynamic sampling: the kept groups, not those dropped)
    advantages = estimate(learner, samples.batch)
    updated = update(learner, samples.batch.rollout, advantages, len(questions))
    alg = ALGORITHMS[learner.grpo.algorithm]
    after = (
        value_updates(
            learner.models,
            dataclasses.replace(samples.batch.rollout, completion_mask=advantages.mask),
            advantages.mask,
            advantages.value_targets,
            learner.grpo,
            learner.amp,
        )
        if "value" in alg.trains
        else {}
    )
    return step_metrics(learner, samples, advantages, updated) | after


# ---------------------------------------------------------------------------------------- 1. explore


class Redraws(NamedTuple):
    """Dynamic sampling's counts for this process's n slots: groups sampled per slot [n], whether
    the first group and the kept one pass its test (``questions.passes_dynamic_sampling``) [n] bool,
    the tokens every draw sampled, and the seconds the redraws took (sampling and scoring)."""

    groups_per_slot: torch.Tensor
    first_passes: torch.Tensor
    passes: torch.Tensor
    tokens: torch.Tensor
    seconds: float


class StepSamples(NamedTuple):
    """What a step sampled: ``first``, the groups of its questions as drawn; ``batch``, what trains
    (the same, or with dynamic sampling each slot's first group with spread); ``redraws``, dynamic
    sampling's counts (None without it)."""

    first: ScoredGroups
    batch: ScoredGroups
    redraws: Redraws | None = None


def row_temperatures(grpo: GRPOConfig, n_questions: int) -> list[float]:
    """Sample i of every group uses temperatures[i % len] (or the single temperature)."""
    temps = grpo.temperatures or (grpo.temperature,)
    return [temps[i % len(temps)] for _ in range(n_questions) for i in range(grpo.group_size)]


def sample_groups(learner: Learner, questions: list[Example], slots: list[int], seed: int) -> ScoredGroups:
    """G completions of each of ``questions`` from the learner's sampling model, scored. ``slots``: each
    question's row of the step's global batch; sample j of slot i is seeded by (``seed``, i * G + j),
    whichever process draws it."""
    g, grpo = learner.grpo.group_size, learner.grpo
    started = time.perf_counter()
    with learner.amp():
        rollout = generate(
            learner.sampling_model,
            learner.tokenizer,
            [prompt_text(q.question) for q in questions for _ in range(g)],
            max_new_tokens=grpo.max_new_tokens,
            temperatures=row_temperatures(grpo, len(questions)),
            seed=seed,
            row_ids=[i * g + j for i in slots for j in range(g)],
        )
    sampled = time.perf_counter()
    scored = learner.scorer(
        rollout, [q.gold for q in questions for _ in range(g)], [q.question for q in questions for _ in range(g)]
    )
    return ScoredGroups(questions, rollout, scored, sampled - started, time.perf_counter() - sampled)


def explore(learner: Learner, questions: list[Example], step: int) -> StepSamples:
    """Sample and score this process's share of the step's ``questions`` (whole groups:
    ``Dist.shard``), then, with ``grpo.redraws``, redraw the groups without reward spread
    (``redraw``). Raises ``RewardError`` when no completion of the step got a finite reward."""
    grpo, d, seed = learner.grpo, learner.d, step_seed(learner.seed, step)
    mine = d.shard(len(questions), "grpo.questions_per_step")  # whole groups: advantages need no communication
    slots = list(range(mine.start, mine.stop))
    with d.gathered(learner.wrapped):  # FSDP: each process samples its share on the whole policy
        first = sample_groups(learner, questions[mine], slots, seed)
        if float(d.sum(torch.isfinite(first.rewards).sum())) == 0:  # before any update: nothing to learn from
            errors = float(d.sum((first.scored.stats or {}).get("reward/rule_errors", 0.0)))
            raise RewardError(
                f"none of the step's {len(questions) * grpo.group_size} completions got a finite reward "
                f"(rule checker errors: {errors:.0f}; the others had NaN or inf scores): the reward is broken"
            )
        if not grpo.redraws:
            return StepSamples(first, first)
        kept, redraws = redraw(learner, first, frozenset(q.question for q in questions), slots, step)
    if all(groups is first for groups, _ in kept):
        return StepSamples(first, first, redraws)
    batch = ScoredGroups.cat(
        [groups.groups([j], grpo.group_size) for groups, j in kept], learner.tokenizer.pad_token_id
    )
    batch.scored.stats = first.scored.stats  # reward statistics: of the step's questions as first drawn
    return StepSamples(first, batch, redraws)


def redraw(
    learner: Learner, first: ScoredGroups, taken: frozenset[str], slots: list[int], step: int
) -> tuple[list[tuple[ScoredGroups, int]], Redraws]:
    """Dynamic sampling (why: ``questions.py``): each slot whose group in ``first`` has no reward
    spread draws ``QuestionSampler.redraw(step, slot, k)`` (never one of the step's questions,
    ``taken``) and its group for k = 1..redraws until one has spread; a slot still without keeps its
    last group, so the batch keeps its shape. Returns each slot's group (the groups it is in, its
    index there) and the counts."""
    grpo, seed = learner.grpo, step_seed(learner.seed, step)
    if learner.question_sampler is None:
        raise ValueError("grpo.redraws > 0 needs the questions to redraw from (Learner.question_sampler)")
    kept = [(first, i) for i in range(len(slots))]
    first_passes = passes_dynamic_sampling(first, grpo)
    passes, per_slot, tokens = (
        first_passes.clone(),
        torch.ones(len(slots), dtype=torch.long),
        first.rollout.completion_mask.sum(),
    )
    started = time.perf_counter()
    for k in range(1, grpo.redraws + 1):
        empty = [i for i in range(len(slots)) if not passes[i]]
        if not empty:
            break
        groups = sample_groups(
            learner,
            [learner.question_sampler.redraw(step, slots[i], k, taken) for i in empty],
            [slots[i] for i in empty],
            draw_seed(seed, k),
        )
        ok, tokens = passes_dynamic_sampling(groups, grpo), tokens + groups.rollout.completion_mask.sum()
        for j, i in enumerate(empty):
            kept[i], passes[i], per_slot[i] = (groups, j), ok[j], per_slot[i] + 1
    return kept, Redraws(per_slot, first_passes, passes, tokens, time.perf_counter() - started)


# --------------------------------------------------------------------------------------- 2. estimate


def estimate(learner: Learner, batch: ScoredGroups) -> Advantages:
    """The algorithm's advantage estimator (``estimators.ESTIMATORS``) on what trains, timed."""
    started = time.perf_counter()
    adv = ESTIMATORS[ALGORITHMS[learner.grpo.algorithm].advantage](batch, learner.models, learner.grpo, learner.amp)
    return adv._replace(seconds=time.perf_counter() - started)


# ----------------------------------------------------------------------------------------- 3. update


class Updated(NamedTuple):
    """The policy's updates: this process's summed loss terms, how many updates, and the seconds
    of the log-prob passes before them and of the updates."""

    sums: dict[str, float]
    n_updates: int
    logprob_s: float
    update_s: float


def update(learner: Learner, rollout: Rollout, advantages: Advantages, n_global: int) -> Updated:
    """The step's optimizer updates: ``grpo.inner_updates`` passes over minibatches of
    ``grpo.minibatch_size`` rows of the global batch (``n_global`` questions) of the clipped-ratio
    loss, with the k3 KL to the reference weighted by ``kl.loss`` (GRPO's beta; 0 where the
    algorithm puts the KL in the reward, PPO, or has none, RFT)."""
    grpo, policy = learner.grpo, learner.models.policy
    wrapped = learner.wrapped or policy
    if grpo.kl.loss > 0 and learner.models.ref is None:
        raise ValueError(
            f"grpo.beta = {grpo.kl.loss} weighs a KL to the reference in the loss, but no reference model was given"
        )
    started = time.perf_counter()
    rollout = dataclasses.replace(rollout, completion_mask=advantages.mask * (1 - rollout.written()))  # what learns
    rows = minibatch_rows(learner, n_global)
    parts, sizes = minibatches(learner, rollout, advantages, rows)
    # With a single update on the whole batch pi_old is the current policy: its log-probs are the
    # update's own (detached), which saves a forward pass. Otherwise they are fixed up front.
    single_update = grpo.inner_updates == 1 and rows == rollout.completion_mask.shape[0]
    old_logp, ref_logp = fixed_logprobs(learner, wrapped, parts, single_update)
    logprobs_done = time.perf_counter()
    sums: dict[str, float] = {}
    n_updates = 0
    for _ in range(grpo.inner_updates):
        for i, (part, size) in enumerate(zip(parts, sizes)):
            old = None if old_logp is None else old_logp[i]
            m = minibatch_update(learner, wrapped, part, size, old, None if ref_logp is None else ref_logp[i])
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
            n_updates += 1
    return Updated(sums, n_updates, logprobs_done - started, time.perf_counter() - logprobs_done)


class Minibatch(NamedTuple):
    """A minibatch's distinct rows: a group's solutions sampled alike (with equal advantages) are
    one row, weighted by ``counts``, so every pass costs the distinct rows only while the loss and
    its gradient are those of all the rows."""

    rollout: Rollout
    advantages: torch.Tensor
    counts: torch.Tensor


def minibatch_rows(learner: Learner, n_global: int) -> int:
    """This process's rows in a minibatch: its share of ``grpo.minibatch_size`` rows of the global
    batch (default: the whole batch, ``n_global`` questions x G)."""
    grpo, d = learner.grpo, learner.d
    if grpo.minibatch_size and grpo.minibatch_size % d.world:
        raise ValueError(f"grpo.minibatch_size = {grpo.minibatch_size} does not split evenly over {d.world} processes")
    return (grpo.minibatch_size or n_global * grpo.group_size) // d.world


def minibatches(
    learner: Learner, rollout: Rollout, advantages: Advantages, rows: int
) -> tuple[list[Minibatch], list[BatchSize]]:
    """This process's minibatches of ``rows`` rows, and the global minibatches' sizes (the loss's
    normalisers: the widest completion and every minibatch's token count over the processes, in
    two reductions)."""
    d, mask = learner.d, rollout.completion_mask
    starts = range(0, mask.shape[0], rows)
    parts = []
    for s in starts:
        part, adv = rollout.rows(s, s + rows), advantages.values[s : s + rows]
        distinct = part.distinct(adv, part.completion_mask)
        parts.append(Minibatch(part.select(distinct.index), adv[distinct.index], distinct.counts))
    width = d.max(mask.shape[1])
    tokens = d.sum(torch.stack([mask[s : s + rows].sum() for s in starts])).tolist()
    return parts, [BatchSize(rows * d.world, n, width) for n in tokens]


def fixed_logprobs(
    learner: Learner, wrapped: torch.nn.Module, parts: list[Minibatch], single_update: bool
) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
    """The log-probs that stay fixed during the updates, per minibatch: pi_old's (None with a single
    update: the update's own, detached) and the reference's (None without a KL in the loss)."""
    d, policy, ref = learner.d, learner.models.policy, learner.models.ref
    with (
        d.gathered(wrapped),
        torch.no_grad(),
        learner.amp(),
    ):  # FSDP: on the whole policy, as many passes as a process has
        old_logp = None if single_update else [token_logprobs(policy, part.rollout) for part in parts]
        with adapters.off(ref):  # a LoRA policy is its own reference, its adapter off
            ref_logp = [token_logprobs(ref, part.rollout) for part in parts] if learner.grpo.kl.loss > 0 else None
    return old_logp, ref_logp


def minibatch_update(
    learner: Learner,
    wrapped: torch.nn.Module,
    part: Minibatch,
    size: BatchSize,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
) -> dict[str, float]:
    """One optimizer update on ``part`` (``size``: its global minibatch's): this process's share of
    its loss terms, and the gradient norm (the same on every process). The loss is a sum over rows
    normalised by the global minibatch, so ``grpo.micro_batch_rows`` passes of a few rows each,
    their gradients summed, make the same update as one pass over all of them, holding a share
    of the activations (each pass's backward frees its own)."""
    grpo, n = learner.grpo, len(part.counts)
    step = grpo.micro_batch_rows or n
    learner.opt.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    for s in range(0, n, step):
        rows = slice(s, s + step)
        rollout, counts = part.rollout.rows(s, s + step), part.counts[rows]
        with learner.amp():
            logp, entropy = token_logprobs(wrapped, rollout, with_entropy=True)
        loss, m = grpo_loss(
            logp,
            logp.detach() if old_logp is None else old_logp[rows],
            None if ref_logp is None else ref_logp[rows],
            part.advantages[rows],
            rollout.completion_mask,
            clip_eps=grpo.clip_eps,
            clip_eps_high=grpo.clip_eps_high,
            beta=grpo.kl.loss,
            agg=grpo.loss_agg,
            batch=size,
            weights=counts,
        )
        # This process's share of the global loss, times the world size: DDP averages.
        (loss * learner.d.world).backward()
        mask = rollout.completion_mask * counts[:, None]  # each distinct row's tokens, once per row it stands for
        m.update(entropy=float((entropy * mask).sum() / mask.sum().clamp(min=1)), loss=loss.item())
        # Token means (kl, clip_ratio, ratio_mean, entropy) weighted by these rows' share of the
        # minibatch's tokens: summed over passes and processes they are the global token means, as
        # the loss terms (already shares) sum to the global loss.
        share = float(mask.sum()) / max(size.tokens, 1.0)
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + (v if k in ("pg_loss", "loss") else v * share)
    grad_norm = apply_gradients(learner.models.policy, learner.opt, grpo.max_grad_norm, torch.tensor(sums["loss"]))
    return sums | {"grad_norm": grad_norm}


# ---------------------------------------------------------------------------------------- 4. metrics


def step_metrics(learner: Learner, samples: StepSamples, advantages: Advantages, updated: Updated) -> dict[str, float]:
    """The step's metrics over the global batch: loss terms summed over processes, timings and
    rates averaged, counts summed, per-completion statistics gathered. The rewards are those of
    ``samples.first``, the step's questions as drawn (before dynamic sampling's filter: comparable
    with and without it); lengths and groups without spread those of ``samples.batch``, what trained."""
    d, first, redraws = learner.d, samples.first, samples.redraws
    metrics = {
        f"train/{k}": (v if k == "grad_norm" else float(d.sum(v))) / updated.n_updates for k, v in updated.sums.items()
    }
    stats = first.scored.stats or {}
    metrics |= d.mean(
        {k: v for k, v in stats.items() if k not in COUNT_STATS}
        | {
            "time/rollout_s": first.sample_s,
            "time/reward_s": first.score_s,
            "time/advantage_s": advantages.seconds,
            "time/logprob_s": updated.logprob_s,
            "time/update_s": updated.update_s,
        }
        | ({} if redraws is None else {"time/redraw_s": redraws.seconds})
    )
    metrics |= {k: float(d.sum(v)) for k, v in stats.items() if k in COUNT_STATS}
    correct = d.gather(first.scored.correct.double())
    metrics |= completion_metrics(learner, samples, advantages, correct)
    metrics |= reward_ranking_metrics(learner, first, correct)
    metrics |= position_metrics(learner, samples.batch, advantages)
    return metrics | ({} if redraws is None else redraw_metrics(d, redraws))


def position_metrics(learner: Learner, batch: ScoredGroups, advantages: Advantages) -> dict[str, float]:
    """The mean advantage by step place (``advantages.position_profile``: first, middle, last, answer
    line) over what trained, in the groups where the answer checker is silent (its verdicts all
    alike): nothing there says one completion is better, so an estimator without position bias gives
    each place 0 on average whatever the PRM says; a place no such step was trained on is left out
    (not NaN: a step's metrics compare equal when they are)."""
    d, g, scored = learner.d, learner.grpo.group_size, batch.scored
    verdicts = scored.correct.reshape(-1, g)
    silent = (verdicts == verdicts[:, :1]).all(dim=1).repeat_interleave(g).nonzero().squeeze(1)
    if scored.step_ends is not None:  # process supervision: the steps its advantages were built on
        ends, mask = scored.step_ends[silent], scored.step_mask[silent]
    else:
        ends, mask = rollout_step_ends(learner.tokenizer, batch.rollout.select(silent), learner.scorer.separator)
    profile = position_profile(advantages.values[silent], ends, mask)
    sums = d.sum(torch.tensor([v for pair in profile.values() for v in pair], dtype=torch.float64))  # one reduction
    return {
        f"adv/silent_{where}": float(sums[2 * i] / sums[2 * i + 1])
        for i, where in enumerate(profile)
        if sums[2 * i + 1] > 0
    }


def completion_metrics(
    learner: Learner, samples: StepSamples, advantages: Advantages, correct: torch.Tensor
) -> dict[str, float]:
    """Per-completion statistics over the global batch (``correct``: the first draw's, gathered):
    accuracy, rewards and their spread, lengths, the sampling rate."""
    d, g, (first, batch, redraws) = learner.d, learner.grpo.group_size, samples
    no_spread = ~with_gradient(advantages.values, g)  # [n] this process's groups without a gradient
    rewards = d.gather(first.rewards.double())
    lengths, truncated = (
        d.gather(batch.rollout.completion_mask.sum(1).double()),
        d.gather(batch.rollout.truncated.double()),
    )
    batch_no_spread = d.gather(no_spread.double())
    # The first draw's groups without spread by dynamic sampling's test (the checker's verdicts where it
    # is weighted), with or without the redraws: one meaning across arms.
    first_passes = passes_dynamic_sampling(first, learner.grpo) if redraws is None else redraws.first_passes
    first_no_spread = d.gather((~first_passes).double())
    tokens = float(lengths.sum()) if redraws is None else float(d.sum(redraws.tokens))  # every draw's
    finite = torch.isfinite(rewards)
    redraw_s = 0.0 if redraws is None else redraws.seconds
    return {k: float(d.sum(v)) for k, v in advantages.stats.items()} | {
        "train/accuracy": float(correct.mean()),
        "train/reward_mean": float(rewards.nanmean()),
        "train/reward_std": float(rewards[finite].std(unbiased=False)) if finite.sum() > 1 else 0.0,
        "train/frac_reward_zero_std": float(first_no_spread.mean()),  # before any filter
        "train/frac_batch_zero_std": float(batch_no_spread.mean()),  # what trained: groups without a gradient
        "train/completion_len": float(lengths.mean()),
        "train/frac_truncated": float(truncated.mean()),
        "train/lr": learner.opt.param_groups[0]["lr"],
        "perf/tokens_per_s": tokens / (first.sample_s + redraw_s),
    }


def reward_ranking_metrics(learner: Learner, first: ScoredGroups, correct: torch.Tensor) -> dict[str, float]:
    """Each learned reward model's ranking of a group's solutions against the checker, on the
    samples the policy draws now (what GRPO's group z-score sees; a frozen one goes stale as the
    policy moves away from the samples it was trained on). Logged whatever its weight."""
    out = {}
    for name, scores in first.scored.learned.items():
        auc, mixed = group_auc(learner.d.gather(scores.double()), correct, learner.grpo.group_size)
        out |= {f"reward/{name}_within_auc": auc, f"reward/{name}_mixed_groups": float(mixed)}
    return out


def redraw_metrics(d: Dist, redraws: Redraws) -> dict[str, float]:
    """Groups sampled in all; in the batch with spread; sampled and left out (the bound: redraws x batch)."""
    per_slot = d.gather(redraws.groups_per_slot.double())
    return {
        "sampling/groups_drawn": float(per_slot.sum()),
        "sampling/groups_kept": float(d.gather(redraws.passes.double()).sum()),
        "sampling/groups_dropped": float(per_slot.sum()) - len(per_slot),
    }

"""The RL stage: GRPO (DeepSeekMath §4.1) and its §5 peers, one step read top to bottom (the shape
of nanochat's ``chat_rl.py``).

A step (``rl_step``) runs four phases, each a function below, in the order they run, returning
what it made and its seconds (``time/*`` metrics: the first draw's sampling and scoring, the
redraws, the estimator, the log-prob passes and the updates):

1. ``explore``: G completions of each question from pi_old (RFT: the frozen starting model), scored
   by the answer checker and the reward models (process supervision scores every step); with
   dynamic sampling (``grpo.redraws``) a slot whose group has no reward spread samples another
   question's group instead, up to ``redraws`` times.
2. ``estimate``: the algorithm's advantage estimator (``ESTIMATORS``: group z-scores or
   process credit for GRPO, 1[correct] for RFT and online RFT, GAE for PPO in ``ppo.py``).
3. ``update``: mu passes of the clipped-ratio objective (``losses.grpo_loss``) on minibatches,
   with the k3 KL to the frozen reference where the algorithm puts it in the loss; after it
   ``rl_step`` trains PPO's value model (``ppo.value_updates``).
4. ``step_metrics``: every cross-process reduction of the step.

Which model samples, which estimator, where ``grpo.beta`` goes and which models are loaded come
from the algorithm's row of ``algorithms.ALGORITHMS``. ``run_grpo`` (the stage) runs the step on the
shared training loop (``trainer.py``: log, validate with keep-best, checkpoint, resume).

Where this GRPO differs from the paper's (§4.1, §4.2), by default or by a setting:

- the reward may add the answer checker to the learned ORM / PRM (``grpo.reward_weights``); the
  paper's RL reads its reward model alone;
- keep-best (``grpo.keep_best``, on by default) publishes the step with the best validation
  accuracy, the last one beside it; the paper's policy is the last;
- a completion without a finite reward (no verdict, a NaN score) gets no advantage;
- options the paper has not, each off by default: dynamic sampling and the pass-rate curriculum
  (``questions.py``), PURE's min-form process credit, DAPO's clip-higher and token-mean and Dr.
  GRPO's aggregations (``losses.py``), LoRA adapters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from pathlib import Path
from typing import NamedTuple

import torch

from grpo_core.algorithms import ALGORITHMS, Estimator
from grpo_core.config import GRPOConfig, PipelineConfig
from grpo_core.data import Example, prompt_text, read_split
from grpo_core.digests import digest_dir
from grpo_core.evaluation import greedy_accuracy
from grpo_core.lm import adapters
from grpo_core.lm.modeling import load_model, load_tokenizer, load_trainable
from grpo_core.lm.policy import CompletionLogprobs, Rollout, generate, token_logprobs
from grpo_core.lm.runtime import autocast, device_for, place, set_compute
from grpo_core.losses import BatchSize, grpo_loss
from grpo_core.manifests import write_manifest
from grpo_core.rewards import rollout_log
from grpo_core.rewards.heads import group_auc
from grpo_core.rewards.scorer import COUNT_STATS, RewardError, RewardScorer
from grpo_core.seeds import draw_seed, round_seed, step_seed
from grpo_core.stages.identity import run_identity
from grpo_core.stages.ppo import gae_advantages, value_model_from, value_updates
from grpo_core.stages.questions import QuestionSampler, read_pass_rates
from grpo_core.stages.rl import (
    Advantages,
    Exploration,
    Models,
    correct_advantages,
    group_advantages,
    has_spread,
    spread,
)
from grpo_core.stages.rl_records import RECORDED, SUMMARY_METRICS, SUMMARY_WINDOW, recorded, staleness
from grpo_core.tracking import MetricLogger, NullLogger
from grpo_core.training import distributed
from grpo_core.training.distributed import Dist, SINGLE
from grpo_core.training.trainer import Plan, TrainState, Trainer, optimizer_step


@dataclasses.dataclass
class Learner:
    """What every step of a run uses: the models, the tokenizer, the policy's optimizer, the recipe's
    ``grpo`` section, the reward, the questions a redraw takes from (``grpo.redraws``), the round's
    seed, the processes, the policy as trained (DDP/FSDP's wrapper; the policy itself in one
    process) and the forward passes' precision context (``runtime.autocast``)."""

    models: Models
    tokenizer: object
    opt: torch.optim.Optimizer
    cfg: GRPOConfig
    scorer: RewardScorer
    seed: int
    question_sampler: QuestionSampler | None = None
    d: Dist = SINGLE
    trained: torch.nn.Module | None = None
    amp: object = contextlib.nullcontext

    @property
    def sampling_model(self) -> torch.nn.Module:
        """The model the rollouts come from: pi_old, or the frozen starting model (RFT)."""
        return self.models.ref if ALGORITHMS[self.cfg.algorithm].samples == "reference" else self.models.policy


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
    explored = explore(learner, questions, step)
    if record is not None:
        record += explored.batch.checked()  # what trained (with dynamic sampling: the kept groups, not those dropped)
    advantages = estimate(learner, explored.batch)
    updated = update(learner, explored.batch.rollout, advantages, len(questions))
    alg = ALGORITHMS[learner.cfg.algorithm]
    after = (
        value_updates(
            learner.models,
            dataclasses.replace(explored.batch.rollout, completion_mask=advantages.mask),
            advantages.mask,
            advantages.value_targets,
            learner.cfg,
            learner.amp,
        )
        if "value" in alg.trains
        else {}
    )
    return step_metrics(learner, explored, advantages, updated) | after


# ---------------------------------------------------------------------------------------- 1. explore


class Explored(NamedTuple):
    """A step's exploration: ``first``, the step's questions as drawn; ``batch``, what trains (the
    same, or with dynamic sampling each slot's first group with spread); ``drawn``, dynamic
    sampling's counts (None without it): ``draws`` [n] groups sampled per slot, ``first_spread`` and
    ``spread`` [n] bool, ``tokens`` (every draw's), ``seconds`` (the redraws' sampling and scoring)."""

    first: Exploration
    batch: Exploration
    drawn: dict[str, torch.Tensor] | None = None


def row_temperatures(cfg: GRPOConfig, n_questions: int) -> list[float]:
    """Sample i of every group uses temperatures[i % len] (or the single temperature)."""
    temps = cfg.temperatures or (cfg.temperature,)
    return [temps[i % len(temps)] for _ in range(n_questions) for i in range(cfg.group_size)]


def sample_groups(learner: Learner, questions: list[Example], slots: list[int], seed: int) -> Exploration:
    """G completions of each of ``questions`` from the learner's sampling model, scored. ``slots``: each
    question's row of the step's global batch; sample j of slot i is seeded by (``seed``, i * G + j),
    whichever process draws it."""
    g, cfg = learner.cfg.group_size, learner.cfg
    started = time.perf_counter()
    with learner.amp():
        rollout = generate(
            learner.sampling_model,
            learner.tokenizer,
            [prompt_text(q.question) for q in questions for _ in range(g)],
            max_new_tokens=cfg.max_new_tokens,
            temperatures=row_temperatures(cfg, len(questions)),
            seed=seed,
            row_ids=[i * g + j for i in slots for j in range(g)],
        )
    sampled = time.perf_counter()
    scored = learner.scorer(rollout, [q.gold for q in questions for _ in range(g)])
    return Exploration(questions, rollout, scored, sampled - started, time.perf_counter() - sampled)


def explore(learner: Learner, questions: list[Example], step: int) -> Explored:
    """Sample and score this process's share of the step's ``questions`` (whole groups:
    ``Dist.shard``); with ``grpo.redraws``, dynamic sampling (why: ``questions.py``): each slot whose
    group has no reward spread draws ``QuestionSampler.redraw(step, slot, k)`` and its group for
    k = 1..redraws until one has spread; a slot still without keeps its last group, so the batch
    keeps its shape. Raises ``RewardError`` when no completion of the step got a finite reward."""
    cfg, d, seed = learner.cfg, learner.d, step_seed(learner.seed, step)
    mine = d.shard(len(questions), "grpo.questions_per_step")  # whole groups: advantages need no communication
    slots = list(range(mine.start, mine.stop))
    with d.gathered(learner.trained):  # FSDP: each process samples its share on the whole policy
        first = sample_groups(learner, questions[mine], slots, seed)
        if float(d.sum(torch.isfinite(first.rewards).sum())) == 0:  # before any update: nothing to learn from
            errors = float(d.sum((first.scored.stats or {}).get("reward/rule_errors", 0.0)))
            raise RewardError(
                f"none of the step's {len(questions) * cfg.group_size} completions got a finite reward "
                f"(rule checker errors: {errors:.0f}; the others had NaN or inf scores): the reward is broken"
            )
        if not cfg.redraws:
            return Explored(first, first)
        if learner.question_sampler is None:
            raise ValueError("grpo.redraws > 0 needs the questions to redraw from (Learner.question_sampler)")
        taken = frozenset(q.question for q in questions)
        kept = [(first, i) for i in range(len(slots))]  # each slot's group: (its exploration, its index there)
        first_spread = has_spread(first, cfg)
        has, draws, tokens = (
            first_spread.clone(),
            torch.ones(len(slots), dtype=torch.long),
            first.rollout.completion_mask.sum(),
        )
        started = time.perf_counter()
        for k in range(1, cfg.redraws + 1):
            empty = [i for i in range(len(slots)) if not has[i]]
            if not empty:
                break
            ex = sample_groups(
                learner,
                [learner.question_sampler.redraw(step, slots[i], k, taken) for i in empty],
                [slots[i] for i in empty],
                draw_seed(seed, k),
            )
            ok, tokens = has_spread(ex, cfg), tokens + ex.rollout.completion_mask.sum()
            for j, i in enumerate(empty):
                kept[i], has[i], draws[i] = (ex, j), ok[j], draws[i] + 1
        drawn = {
            "draws": draws,
            "first_spread": first_spread,
            "spread": has,
            "tokens": tokens,
            "seconds": time.perf_counter() - started,
        }
    if all(ex is first for ex, _ in kept):
        return Explored(first, first, drawn)
    batch = Exploration.cat([ex.groups([j], cfg.group_size) for ex, j in kept], learner.tokenizer.pad_token_id)
    batch.scored.stats = first.scored.stats  # reward statistics: of the step's questions as first drawn
    return Explored(first, batch, drawn)


# --------------------------------------------------------------------------------------- 2. estimate


# Every advantage estimator, by ``algorithms.Estimator`` name: (a step's ``Exploration``, its
# ``Models``, ``GRPOConfig``, the forward passes' precision context) -> ``rl.Advantages``.
ESTIMATORS = {Estimator.GROUP: group_advantages, Estimator.CORRECT: correct_advantages, Estimator.GAE: gae_advantages}


def estimate(learner: Learner, batch: Exploration) -> Advantages:
    """The algorithm's advantage estimator (``ESTIMATORS``) on what trains, timed."""
    started = time.perf_counter()
    adv = ESTIMATORS[ALGORITHMS[learner.cfg.algorithm].advantage](batch, learner.models, learner.cfg, learner.amp)
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
    cfg, d, policy, ref = learner.cfg, learner.d, learner.models.policy, learner.models.ref
    trained = learner.trained or policy
    rollout = dataclasses.replace(rollout, completion_mask=advantages.mask)  # the tokens that learn
    beta = cfg.kl.loss
    if beta > 0 and ref is None:
        raise ValueError(
            f"grpo.beta = {beta} weighs a KL to the reference in the loss, but no reference model was given"
        )
    started = time.perf_counter()
    batch = rollout.completion_mask.shape[0]
    # A minibatch is minibatch_size rows of the global batch: each process's share of it.
    if cfg.minibatch_size and cfg.minibatch_size % d.world:
        raise ValueError(f"grpo.minibatch_size = {cfg.minibatch_size} does not split evenly over {d.world} processes")
    mb = (cfg.minibatch_size or n_global * cfg.group_size) // d.world
    starts = range(0, batch, mb)
    # With a single update on the whole batch pi_old is the current policy: its log-probs are the
    # update's own (detached), which saves a forward pass. Otherwise they are fixed up front.
    single_update = cfg.inner_updates == 1 and mb == batch
    # A minibatch's repeated rows (a group's solutions sampled alike, with equal advantages) are
    # passed once, weighted by their count: every pass below costs its distinct rows only, and the
    # loss and its gradient are those of all the rows.
    parts = []
    for s in starts:
        part, adv = rollout.rows(s, s + mb), advantages.values[s : s + mb]
        rows = part.distinct(adv, part.completion_mask)
        parts.append((part.select(rows.index), adv[rows.index], rows.counts))
    # The global minibatches' sizes (the loss's normalisers): the widest completion and every
    # minibatch's token count over the processes, in two reductions.
    width = d.max(rollout.completion_mask.shape[1])
    tokens = d.sum(torch.stack([rollout.completion_mask[s : s + mb].sum() for s in starts])).tolist()
    sizes = [BatchSize(mb * d.world, n, width) for n in tokens]
    with (
        d.gathered(trained),
        torch.no_grad(),
        learner.amp(),
    ):  # FSDP: on the whole policy, as many passes as a process has
        old_logp = None if single_update else [token_logprobs(policy, part) for part, *_ in parts]
        with adapters.off(ref):  # a LoRA policy is its own reference, its adapter off
            ref_logp = [token_logprobs(ref, part) for part, *_ in parts] if beta > 0 else None
    logprobs_done = time.perf_counter()
    sums: dict[str, float] = {}
    n_updates = 0
    for _ in range(cfg.inner_updates):
        for i, ((part, adv, counts), global_mb) in enumerate(zip(parts, sizes)):
            with learner.amp():
                logp, entropy = token_logprobs(trained, part, with_entropy=True)
            old = logp.detach() if old_logp is None else old_logp[i]
            loss, m = grpo_loss(
                logp,
                old,
                None if ref_logp is None else ref_logp[i],
                adv,
                part.completion_mask,
                clip_eps=cfg.clip_eps,
                clip_eps_high=cfg.clip_eps_high,
                beta=beta,
                agg=cfg.loss_agg,
                batch=global_mb,
                weights=counts,
            )
            # This process's share of the global loss, times the world size: DDP averages.
            grad_norm = optimizer_step(policy, learner.opt, loss, d.world, cfg.max_grad_norm)
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
    return Updated(sums, n_updates, logprobs_done - started, time.perf_counter() - logprobs_done)


# ---------------------------------------------------------------------------------------- 4. metrics


def step_metrics(learner: Learner, explored: Explored, advantages: Advantages, updated: Updated) -> dict[str, float]:
    """The step's metrics over the global batch: loss terms summed over processes, timings and
    rates averaged, counts summed, per-completion statistics gathered. The rewards are those of
    ``explored.first``, the step's questions as drawn (before dynamic sampling's filter: comparable
    with and without it); lengths and groups without spread those of ``explored.batch``, what trained."""
    d, g, (first, batch, drawn) = learner.d, learner.cfg.group_size, explored
    no_spread = ~spread(advantages.values, g)  # [n] this process's groups without a gradient
    metrics = {
        f"train/{k}": (v if k == "grad_norm" else float(d.sum(v))) / updated.n_updates for k, v in updated.sums.items()
    }
    stats = first.scored.stats or {}
    redraw_s = 0.0 if drawn is None else drawn["seconds"]
    metrics |= d.mean(
        {k: v for k, v in stats.items() if k not in COUNT_STATS}
        | {
            "time/rollout_s": first.sample_s,
            "time/reward_s": first.score_s,
            "time/advantage_s": advantages.seconds,
            "time/logprob_s": updated.logprob_s,
            "time/update_s": updated.update_s,
        }
        | ({} if drawn is None else {"time/redraw_s": redraw_s})
    )
    metrics |= {k: float(d.sum(v)) for k, v in stats.items() if k in COUNT_STATS}
    # Per-completion statistics over the global batch.
    rewards, correct = d.gather(first.rewards.double()), d.gather(first.scored.correct.double())
    lengths, truncated = (
        d.gather(batch.rollout.completion_mask.sum(1).double()),
        d.gather(batch.rollout.truncated.double()),
    )
    batch_no_spread = d.gather(no_spread.double())
    # The first draw's groups without spread by dynamic sampling's test (the checker's verdicts where it
    # is weighted), with or without the redraws: one meaning across arms.
    first_spread = has_spread(first, learner.cfg) if drawn is None else drawn["first_spread"]
    first_no_spread = d.gather((~first_spread).double())
    tokens = float(lengths.sum()) if drawn is None else float(d.sum(drawn["tokens"]))  # every draw's
    finite = torch.isfinite(rewards)
    metrics.update({k: float(d.sum(v)) for k, v in advantages.stats.items()})
    metrics.update(
        {
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
    )
    # Staleness: each learned reward model's ranking of a group's solutions against the checker, on
    # the samples the policy draws now (what GRPO's group z-score sees; a frozen one goes stale as
    # the policy moves away from the samples it was trained on). Logged whatever its weight.
    for name, scores in first.scored.learned.items():
        auc, mixed = group_auc(d.gather(scores.double()), correct, g)
        metrics |= {f"reward/{name}_within_auc": auc, f"reward/{name}_mixed_groups": float(mixed)}
    if drawn is not None:
        draws = d.gather(drawn["draws"].double())
        # Groups sampled in all; in the batch with spread; sampled and left out (the bound: redraws x batch).
        metrics |= {
            "sampling/groups_drawn": float(draws.sum()),
            "sampling/groups_kept": float(d.gather(drawn["spread"].double()).sum()),
            "sampling/groups_dropped": float(draws.sum()) - len(draws),
        }
    return metrics


# -------------------------------------------------------------------------------------- the stage


def run_grpo(
    cfg: PipelineConfig,
    data_dir: Path,
    init_dir: str | Path,
    out_dir: Path,
    logger: MetricLogger | None = None,
    reward_models: dict[str, str] | None = None,
    round_: int = 1,
    pass_rates: str | Path | None = None,
    adapter: str | Path | None = None,
) -> dict:
    """Train from ``init_dir`` (the SFT policy in round 1, the previous round's policy later; also
    the frozen reference), resuming if possible.

    ``reward_models`` maps ``orm`` / ``prm`` to model folders, needed when ``grpo.reward_weights``
    uses them. ``round_`` seeds the questions and rollouts, so each RL round sees other ones.
    ``pass_rates``: the round's reward-data pass rates (a folder), which ``grpo.curriculum`` draws by.
    ``adapter`` (``grpo.lora``): an adapter trained on ``init_dir`` to start from instead of a fresh one
    (its optimizer state starts afresh); the reference stays ``init_dir``.
    Under torchrun rank 0 validates, logs, checkpoints and returns the manifest (others: None)."""
    grpo = cfg.grpo
    if grpo.curriculum and pass_rates is None:
        raise ValueError(
            f"grpo.curriculum = {grpo.curriculum} draws questions by the policy's pass rates, but no "
            f"reward-data pass rates were given"
        )
    d = distributed.init(cfg.launch)
    device = device_for(cfg.launch)  # this process's
    logger = (logger or NullLogger()) if d.main else NullLogger()
    set_compute(cfg.threads)
    # The reward (the answer checker and the reward models the recipe weighs): a weighted model that
    # was not given is an error here, before any checkpoint is looked at.
    reward_models = reward_models or {}
    scorer = RewardScorer.for_recipe(
        grpo, load_tokenizer(init_dir), cfg.reward_data.step_separator, reward_models, device=device
    )
    used = {k: reward_models[k] for k in grpo.reward_models_used}
    seed = round_seed(cfg.seed, round_)
    identity = run_identity(
        cfg,
        "grpo",
        init=digest_dir(Path(init_dir)),
        round=round_,
        reward_models={k: digest_dir(Path(p)) for k, p in used.items()},
        separator=cfg.reward_data.step_separator if "prm" in used else None,
        **({"pass_rates": digest_dir(Path(pass_rates))} if grpo.curriculum else {}),
        **({"adapter": digest_dir(Path(adapter))} if adapter else {}),
    )
    if adapter is not None and grpo.lora is None:
        raise ValueError(f"an adapter to continue ({adapter}) needs grpo.lora: the adapter's rank and layers")
    trainer = Trainer(cfg, "grpo", out_dir, identity, d, logger)
    policy, tokenizer = load_trainable(init_dir, grpo.lora, trainer.resume or adapter, seed)
    place(policy, cfg.launch, train=True)
    amp = functools.partial(autocast, cfg.launch, device)
    # The models the algorithm uses: the frozen reference where it samples it or weighs a KL to it;
    # PPO's value model from the policy (on resume its weights come from the checkpoint).
    alg = ALGORITHMS[grpo.algorithm]
    ref = None
    if grpo.loads_reference and grpo.lora is not None:
        ref = policy  # with its adapter off (adapters.off): the starting model, no second copy
    elif grpo.loads_reference:
        ref, _ = load_model(init_dir)
        place(ref, cfg.launch).eval().requires_grad_(False)
    companions = {}
    if "value" in alg.trains:
        if d.world > 1:
            raise ValueError(
                f"grpo.algorithm={grpo.algorithm} runs in one process (its value model has no data-parallel wrapper)"
            )
        value = place(value_model_from(policy, seed), cfg.launch, train=True)
        companions["value"] = (value, (grpo.ppo.value_lr or grpo.lr) / grpo.lr)
    pool = read_split(data_dir, "rl")
    rates = read_pass_rates(Path(pass_rates) / "pass_rates.jsonl") if grpo.curriculum else None
    draws = QuestionSampler(pool, seed, rates, grpo.curriculum)
    val = read_split(data_dir, "val")
    policy.train()
    trained = trainer.wrap(CompletionLogprobs(policy))
    st = trainer.start(
        policy,
        tokenizer,
        Plan(
            max_steps=grpo.max_steps,
            eval_every=grpo.eval_every,
            eval_first=True,
            eval_last=True,
            keep_best="val/accuracy" if grpo.keep_best else None,
            record=RECORDED,
        ),
        companions,
    )
    rollouts = rollout_log.log_path(out_dir, d.rank)
    if grpo.save_rollouts:
        out_dir.mkdir(parents=True, exist_ok=True)
        rollout_log.truncate_after(rollouts, st.step)  # steps past the checkpoint are sampled again
    resumed_from = st.step

    value, value_opt = trainer.companions.get("value", (None, None))
    learner = Learner(
        Models(policy, ref, value, value_opt), tokenizer, trainer.opt, grpo, scorer, seed, draws, d, trained, amp
    )

    def step(st: TrainState) -> dict:
        record: list[dict] = []
        try:
            metrics = rl_step(learner, draws.step(st.step, grpo.questions_per_step), st.step, record)
        except RewardError as e:
            raise RewardError(
                f"{grpo.algorithm.upper()} step {st.step + 1} of {out_dir}: {e}; the stage stops, and "
                f"its last checkpoint is where a re-run resumes"
            ) from None
        if grpo.save_rollouts:
            rollout_log.append(rollouts, st.step + 1, record)
        recent = st.extra.get("recent", []) + [{k: metrics[k] for k in SUMMARY_METRICS if k in metrics}]
        st.extra["recent"] = recent[-SUMMARY_WINDOW:]
        return metrics

    def evaluate(st: TrainState) -> dict:
        # Beside validation accuracy: the reward models' staleness on the rollouts since the last evaluation.
        since = st.curve[-1]["step"] if st.curve else 0
        return {
            "val/accuracy": greedy_accuracy(policy, tokenizer, val, cfg.eval.max_new_tokens),
            **staleness([recorded(h) for h in st.history if h["step"] > since]),
        }

    # The loop: [validate the start] -> (RL step -> log -> [validate -> keep best] -> checkpoint)*.
    st = trainer.fit(step, evaluate)
    final_dir = trainer.publish(keep_last=True)
    if not d.main:
        return None
    recent = st.extra.get("recent", [])
    last = {
        k.removeprefix("train/"): sum(m[k] for m in recent) / len(recent)
        for k in SUMMARY_METRICS
        if recent and all(k in m for m in recent)
    }
    published = (st.best_acc, st.best_step) if grpo.keep_best else (st.curve[-1]["val/accuracy"], st.step)  # the last
    summary = {
        "best_val_accuracy": published[0],
        "best_step": published[1],
        "steps": st.step,
        "wall_s": round(st.elapsed, 2),
        "train_s": round(st.train_s, 2),
        "stopped": trainer.stop_reason(),
        "resumed_from_step": resumed_from,
        "round": round_,
        f"last_{SUMMARY_WINDOW}_steps": last,
        "curve": st.curve,
        "rewards": [recorded(h) for h in st.history],
    }
    logger.log_metrics({"val/best_accuracy": published[0], "time/wall_s": st.elapsed}, step=st.step)
    # The staleness curve at its start, middle and end (the evaluations that measured it).
    measured = [p for p in st.curve if any(k.startswith("staleness/") for k in p)]
    summary["staleness"] = {
        k.removeprefix("staleness/"): [
            p.get(k, float("nan")) for p in (measured[0], measured[len(measured) // 2], measured[-1])
        ]
        for k in (measured[-1] if measured else {})
        if k.startswith("staleness/")
    }
    summary["curriculum_questions"] = len(draws.sometimes) if draws.share else None  # solved sometimes: drawn from
    kept_another = grpo.keep_best and st.best_step != st.step
    return write_manifest(
        out_dir,
        {
            "stage": "grpo",
            "algorithm": grpo.algorithm,
            "model": str(final_dir),
            "last_model": str(out_dir / "last") if kept_another else None,
            "init": str(init_dir),
            **summary,
            "rollouts": str(out_dir) if grpo.save_rollouts else None,
        },
    )

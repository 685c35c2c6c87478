"""The RL stage: GRPO (DeepSeekMath §4.1) and its §5 peers (the nanochat ``chat_rl.py`` loop shape).

Each step (``rl_step``): rollout (B questions x G samples from pi_old) -> score (rule reward, ORM,
PRM) -> advantages (the algorithm's estimator, registered in ``rl.ADVANTAGES``: group z-score or
process credit for GRPO, 1[correct] for RFT and online RFT in ``rl.py``, GAE for PPO in ``ppo.py``)
-> update (mu passes of the clipped objective, with the k3 KL to the frozen reference where the
algorithm has it in the loss) -> PPO's value model on its GAE returns -> metrics. Which model
samples, which estimator, where ``grpo.beta`` goes and which models are loaded all come from the
algorithm's row of ``algorithms.ALGORITHMS``. ``run_grpo`` runs the step
on the shared training loop (``trainer.py``: log, validate with keep-best, checkpoint, resume).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from pathlib import Path
from typing import Callable

from grpo_core.training import distributed
from grpo_core.rewards import rollout_log
from grpo_core.algorithms import ALGORITHMS
from grpo_core.training.distributed import Dist
from grpo_core.config import GRPOConfig, PipelineConfig
from grpo_core.data import Example
from grpo_core.evaluation import greedy_accuracy
from grpo_core.lm.modeling import load_model, load_tokenizer, load_trainable
from grpo_core.lm.policy import CompletionLogprobs
from grpo_core.lm.runtime import autocast, device_for, place
from grpo_core.rewards.scorer import RewardError, RewardScorer
from grpo_core.stages.common import SINGLE, digest_dir, read_split, round_seed, run_identity, set_compute, write_manifest
from grpo_core.stages.ppo import value_model_from, value_updates  # (also registers PPO's estimator, "gae")
from grpo_core.stages.questions import QuestionSampler, draw_seed, fill, read_pass_rates
from grpo_core.stages.rl import ADVANTAGES, Models, explore, has_spread, sample_groups, step_metrics, step_seed, update
from grpo_core.training.trainer import Plan, Trainer, TrainState
from grpo_core.tracking import MetricLogger, NullLogger


def rl_step(models: Models, tokenizer, opt, questions: list[Example], gc: GRPOConfig, seed: int,
            scorer: RewardScorer, d: Dist = SINGLE, trained=None,
            amp=contextlib.nullcontext, record: list[dict] | None = None,
            redraw: Callable[[int, int], Example] | None = None) -> dict[str, float]:
    """One exploration stage and its mu updates on the step's ``questions`` (the global batch) by
    ``grpo.algorithm``'s row of ``ALGORITHMS``; returns the step's metrics. ``scorer``: the reward
    (the recipe's: ``RewardScorer.for_recipe``).

    Under torchrun each process samples, scores and trains on a contiguous share of the questions,
    whole groups, so advantages need no communication; the loss is normalised by the global batch
    (``BatchSize``) and DDP (``trained``: the wrapped policy) averages the gradients. Samples are
    seeded by global row, so N processes draw the rollouts one process would. ``amp``: the forward
    passes' precision context (``runtime.autocast``). ``record``: this process's checked
    completions are appended to it (reward-model data for the next round). ``redraw(slot, k)``:
    the question of a slot's k-th redraw (``grpo.redraws`` > 0: dynamic sampling)."""
    alg = ALGORITHMS[gc.algorithm]
    sampler = models.ref if alg.samples == "reference" else models.policy
    clock = [time.perf_counter()]

    # Rollout and score: G samples per question from pi_old (the current policy; RFT: the frozen
    # starting model), seeded by global row; the reward sources (answer checker, ORM, PRM);
    # process supervision scores every step. Dynamic sampling: a slot whose group has no reward
    # spread samples another question's group, up to grpo.redraws times (questions.fill).
    mine = d.shard(len(questions), "grpo.questions_per_step")  # whole groups: advantages need no communication
    with d.gathered(trained):  # FSDP: each process samples its share on the whole policy
        first = explore(sampler, tokenizer, questions, mine, gc, seed, scorer, d, amp)
        ex, drawn = first, None
        if gc.redraws:
            if redraw is None:
                raise ValueError("grpo.redraws > 0 needs the questions to redraw from (rl_step's redraw)")
            ex, drawn = fill(first, list(range(mine.start, mine.stop)), gc.redraws, lambda e: has_spread(e, gc),
                             lambda qs, s, k: sample_groups(sampler, tokenizer, qs, s, gc, draw_seed(seed, k), scorer, amp),
                             redraw, tokenizer.pad_token_id)
    if record is not None:
        record += ex.checked()  # what trained (with dynamic sampling: the kept groups, not those dropped)
    clock.append(first.sampled_at)

    # Advantages: the algorithm's estimator (group z-scores or process credit; 1[correct]; GAE).
    adv = ADVANTAGES[alg.advantage](ex, models, gc, amp)
    clock.append(time.perf_counter())

    # Update: mu passes of clipped-ratio minibatch updates, with the k3 KL to the reference where
    # the algorithm puts it in the loss; then what it trains beside the policy (PPO's values).
    rollout = dataclasses.replace(ex.rollout, completion_mask=adv.mask)
    sums, n_updates = update(models.policy, models.ref, trained or models.policy, opt,
                             rollout, adv.values, gc, len(questions), d, amp, clock)
    after = value_updates(models, rollout, adv.mask, adv.value_targets, gc, amp) if "value" in alg.trains else {}

    # Metrics: every cross-process reduction of the step in one place.
    return step_metrics(sums, n_updates, first, ex, adv.values, adv.stats, gc.group_size, opt, d, clock, drawn) | after


# Training metrics averaged over the last steps for the stage's summary (a round's report).
SUMMARY_METRICS = ("train/reward_mean", "train/kl", "train/accuracy", "train/frac_reward_zero_std", "train/frac_batch_zero_std")
SUMMARY_WINDOW = 10
# Kept at every step (the manifest's ``rewards``): the answer checker's accuracy on the rollouts beside
# the learned rewards' means (a gap that widens is the policy hacking a reward model); the study draws it.
# With them each learned reward model's within-question AUC on the policy's current samples (its
# staleness) and how many groups it was measured on.
RECORDED = ("train/accuracy", "train/reward_mean", "train/kl", "reward/orm_mean", "reward/prm_lowest_mean",
            "train/frac_reward_zero_std", "train/frac_batch_zero_std", "sampling/groups_drawn",
            "reward/orm_within_auc", "reward/orm_mixed_groups", "reward/prm_within_auc", "reward/prm_mixed_groups")
LEARNED = {"orm": "orm_mean", "prm": "prm_lowest_mean"}  # each model's mean score of the step's solutions


def recorded(metrics: dict) -> dict:
    """A step's recorded metrics by their short names (``train/accuracy`` -> ``accuracy``): the
    manifest's ``rewards`` rows."""
    return {k.split("/")[-1]: v for k, v in metrics.items()}


def staleness(steps: list[dict]) -> dict[str, float]:
    """What the reward models in use are worth on the policy's samples of ``steps`` (their
    ``recorded`` metrics): per learned model, its within-question AUC against the answer checker
    pooled over the steps (the mean over every mixed group, so a step counts by its groups) and its
    mean score; the checker's accuracy beside them (the reward-hacking curve: a learned reward that
    rises while the checker's accuracy does not). Empty where no step had a learned reward with a
    mixed group."""
    out = {}
    for name, mean in LEARNED.items():
        mixed = sum(p.get(f"{name}_mixed_groups", 0.0) for p in steps)
        if mixed:
            out[f"staleness/{name}_within_auc"] = sum(p[f"{name}_within_auc"] * p[f"{name}_mixed_groups"]
                                                      for p in steps if p.get(f"{name}_mixed_groups")) / mixed
            out[f"staleness/{name}_mean"] = sum(p[mean] for p in steps) / len(steps)
    if out:
        out["staleness/checker_accuracy"] = sum(p["accuracy"] for p in steps) / len(steps)
    return out


def run_grpo(cfg: PipelineConfig, data_dir: Path, init_dir: str | Path, out_dir: Path,
             logger: MetricLogger | None = None, reward_models: dict[str, str] | None = None,
             round_: int = 1, pass_rates: str | Path | None = None, adapter: str | Path | None = None) -> dict:
    """Train from ``init_dir`` (the SFT policy in round 1, the previous round's policy later; also
    the frozen reference), resuming if possible.

    ``reward_models`` maps ``orm`` / ``prm`` to model folders, needed when ``grpo.reward_weights``
    uses them. ``round_`` seeds the questions and rollouts, so each RL round sees other ones.
    ``pass_rates``: the round's reward-data pass rates (a folder), which ``grpo.curriculum`` draws by.
    ``adapter`` (``grpo.lora``): an adapter trained on ``init_dir`` to start from instead of a fresh one
    (its optimizer state starts afresh); the reference stays ``init_dir``.
    Under torchrun rank 0 validates, logs, checkpoints and returns the manifest (others: None)."""
    gc = cfg.grpo
    if gc.curriculum and pass_rates is None:
        raise ValueError(f"grpo.curriculum = {gc.curriculum} draws questions by the policy's pass rates, but no "
                         f"reward-data pass rates were given")
    d = distributed.init(cfg.launch)
    device = device_for(cfg.launch)  # this process's
    logger = (logger or NullLogger()) if d.main else NullLogger()
    set_compute(cfg.threads)
    # The reward (the answer checker and the reward models the recipe weighs): a weighted model that
    # was not given is an error here, before any checkpoint is looked at.
    reward_models = reward_models or {}
    scorer = RewardScorer.for_recipe(gc, load_tokenizer(init_dir), cfg.reward_data.step_separator, reward_models,
                                     device=device)
    used = {k: reward_models[k] for k in gc.reward_models_used}
    seed = round_seed(cfg.seed, round_)
    identity = run_identity(cfg, "grpo", init=digest_dir(Path(init_dir)), round=round_,
                            reward_models={k: digest_dir(Path(p)) for k, p in used.items()},
                            separator=cfg.reward_data.step_separator if "prm" in used else None,
                            **({"pass_rates": digest_dir(Path(pass_rates))} if gc.curriculum else {}),
                            **({"adapter": digest_dir(Path(adapter))} if adapter else {}))
    if adapter is not None and gc.lora is None:
        raise ValueError(f"an adapter to continue ({adapter}) needs grpo.lora: the adapter's rank and layers")
    trainer = Trainer(cfg, "grpo", out_dir, identity, d, logger)
    policy, tokenizer = load_trainable(init_dir, gc.lora, trainer.resume or adapter, seed)
    place(policy, cfg.launch, train=True)
    amp = functools.partial(autocast, cfg.launch, device)
    # The models the algorithm uses: the frozen reference where it samples it or weighs a KL to it;
    # PPO's value model from the policy (on resume its weights come from the checkpoint).
    alg = ALGORITHMS[gc.algorithm]
    ref = None
    if gc.loads_reference and gc.lora is not None:
        ref = policy  # with its adapter off (adapters.off): the starting model, no second copy
    elif gc.loads_reference:
        ref, _ = load_model(init_dir)
        place(ref, cfg.launch).eval().requires_grad_(False)
    companions = {}
    if "value" in alg.trains:
        if d.world > 1:
            raise ValueError(f"grpo.algorithm={gc.algorithm} runs in one process (its value model has no "
                             f"data-parallel wrapper)")
        value = place(value_model_from(policy, seed), cfg.launch, train=True)
        companions["value"] = (value, (gc.ppo.value_lr or gc.lr) / gc.lr)
    pool = read_split(data_dir, "rl")
    rates = read_pass_rates(Path(pass_rates) / "pass_rates.jsonl") if gc.curriculum else None
    draws = QuestionSampler(pool, seed, rates, gc.curriculum)
    val = read_split(data_dir, "val")
    policy.train()
    trained = trainer.wrap(CompletionLogprobs(policy))
    st = trainer.start(policy, tokenizer, Plan(max_steps=gc.steps, eval_every=gc.eval_every, eval_first=True,
                                               eval_last=True, keep_best="val/accuracy" if gc.keep_best else None,
                                               record=RECORDED), companions)
    rollouts = rollout_log.log_path(out_dir, d.rank)
    if gc.save_rollouts:
        out_dir.mkdir(parents=True, exist_ok=True)
        rollout_log.truncate_after(rollouts, st.step)  # steps past the checkpoint are sampled again
    resumed_from = st.step

    def step(st: TrainState) -> dict:
        questions = draws.step(st.step, gc.questions_per_step)
        taken = frozenset(q.question for q in questions)
        record: list[dict] = []
        try:
            value, value_opt = trainer.companions.get("value", (None, None))
            metrics = rl_step(Models(policy, ref, value, value_opt), tokenizer, trainer.opt, questions, gc,
                              step_seed(seed, st.step), scorer, d, trained, amp, record,
                              redraw=lambda slot, k: draws.redraw(st.step, slot, k, taken))
        except RewardError as e:
            raise RewardError(f"{gc.algorithm.upper()} step {st.step + 1} of {out_dir}: {e}; the stage stops, and "
                              f"its last checkpoint is where a re-run resumes") from None
        if gc.save_rollouts:
            rollout_log.append(rollouts, st.step + 1, record)
        recent = st.extra.get("recent", []) + [{k: metrics[k] for k in SUMMARY_METRICS if k in metrics}]
        st.extra["recent"] = recent[-SUMMARY_WINDOW:]
        return metrics

    def evaluate(st: TrainState) -> dict:
        # Beside validation accuracy: the reward models' staleness on the rollouts since the last evaluation.
        since = st.curve[-1]["step"] if st.curve else 0
        return {"val/accuracy": greedy_accuracy(policy, tokenizer, val, cfg.eval.max_new_tokens),
                **staleness([recorded(h) for h in st.history if h["step"] > since])}

    # The loop: [validate the start] -> (RL step -> log -> [validate -> keep best] -> checkpoint)*.
    st = trainer.fit(step, evaluate)
    final_dir = trainer.publish()
    if not d.main:
        return None
    recent = st.extra.get("recent", [])
    last = {k.removeprefix("train/"): sum(m[k] for m in recent) / len(recent)
            for k in SUMMARY_METRICS if recent and all(k in m for m in recent)}
    published = (st.best_acc, st.best_step) if gc.keep_best else (st.curve[-1]["val/accuracy"], st.step)  # the last
    summary = {"best_val_accuracy": published[0], "best_step": published[1], "steps": st.step,
               "wall_s": round(st.elapsed, 2), "train_s": round(st.train_s, 2), "stopped": trainer.stop_reason(),
               "resumed_from_step": resumed_from, "round": round_,
               f"last_{SUMMARY_WINDOW}_steps": last, "curve": st.curve,
               "rewards": [recorded(h) for h in st.history]}
    logger.log_metrics({"val/best_accuracy": published[0], "time/wall_s": st.elapsed}, step=st.step)
    # The staleness curve at its start, middle and end (the evaluations that measured it).
    measured = [p for p in st.curve if any(k.startswith("staleness/") for k in p)]
    summary["staleness"] = {k.removeprefix("staleness/"): [p.get(k, float("nan")) for p in (measured[0], measured[len(measured) // 2], measured[-1])]
                            for k in (measured[-1] if measured else {}) if k.startswith("staleness/")}
    summary["curriculum_questions"] = len(draws.sometimes) if draws.share else None  # solved sometimes: drawn from
    return write_manifest(out_dir, {"stage": "grpo", "algorithm": gc.algorithm, "model": str(final_dir),
                                    "init": str(init_dir), **summary,
                                    "rollouts": str(out_dir) if gc.save_rollouts else None})

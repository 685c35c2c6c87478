"""The RL stage (``grpo``: its folder, manifest, Prefect task and recipe section keep the name the
paper gives the method): ``run_grpo`` trains a policy with ``grpo.algorithm`` (GRPO, or one of its §5
peers: ``algorithms.ALGORITHMS``) on the shared training loop (``training/trainer.py``: log,
validate with keep-best, checkpoint, resume), one RL step at a time (``rl_step.py``, which reads top
to bottom). Here: the entry, the set-up (``build``), the run's identity and its summary."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import torch

from grpo_core.algorithms import ALGORITHMS
from grpo_core.config import GRPOConfig, PipelineConfig
from grpo_core.data import Example, read_split
from grpo_core.digests import digest_dir
from grpo_core.evaluation import greedy_accuracy
from grpo_core.lm.modeling import load_model, load_tokenizer, load_trainable
from grpo_core.lm.policy import CompletionLogprobs
from grpo_core.lm.runtime import autocast, device_for, place, set_compute
from grpo_core.manifests import write_manifest
from grpo_core.rewards import rollout_log
from grpo_core.rewards.scorer import RewardError, RewardScorer
from grpo_core.seeds import round_seed
from grpo_core.stages.identity import run_identity
from grpo_core.stages.ppo import value_model_from
from grpo_core.stages.questions import QuestionSampler, read_pass_rates
from grpo_core.stages.rl_records import POSITION_METRICS, RECORDED, SUMMARY_METRICS, SUMMARY_WINDOW, recorded, staleness
from grpo_core.stages.rl_step import Learner, rl_step
from grpo_core.stages.rl_types import Models
from grpo_core.tracking import MetricLogger, NullLogger
from grpo_core.training import distributed
from grpo_core.training.trainer import Plan, TrainState, Trainer


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
    run = build(cfg, data_dir, init_dir, out_dir, logger, reward_models or {}, round_, pass_rates, adapter)
    learner, trainer, sampler, grpo = run.learner, run.trainer, run.learner.question_sampler, cfg.grpo

    def step(st: TrainState) -> dict:
        record: list[dict] = []
        try:
            metrics = rl_step(learner, sampler.step(st.step, grpo.questions_per_step), st.step, record)
        except RewardError as e:
            raise RewardError(
                f"{grpo.algorithm.upper()} step {st.step + 1} of {out_dir}: {e}; the stage stops, and "
                f"its last checkpoint is where a re-run resumes"
            ) from None
        if grpo.save_rollouts:
            rollout_log.append(run.rollouts, st.step + 1, record)
        recent = st.extra.get("recent", []) + [{k: metrics[k] for k in SUMMARY_METRICS if k in metrics}]
        st.extra["recent"] = recent[-SUMMARY_WINDOW:]
        return metrics

    def evaluate(st: TrainState) -> dict:
        # Beside validation accuracy: the reward models' staleness on the rollouts since the last evaluation.
        since = st.curve[-1]["step"] if st.curve else 0
        return {
            "val/accuracy": greedy_accuracy(learner.models.policy, learner.tokenizer, run.val, cfg.eval.max_new_tokens),
            **staleness([recorded(h) for h in st.history if h["step"] > since]),
        }

    # The loop: [validate the start] -> (RL step -> log -> [validate -> keep best] -> checkpoint)*.
    st = trainer.fit(step, evaluate)
    final_dir = trainer.publish(keep_last=True)
    if not learner.d.main:
        return None
    run.logger.log_metrics({"val/best_accuracy": published_accuracy(st, grpo), "time/wall_s": st.elapsed}, step=st.step)
    return write_manifest(out_dir, manifest(grpo, st, run, final_dir, init_dir, out_dir, round_))


class Built(NamedTuple):
    """A run ready to loop: the learner (models, optimizer, reward, question sampler), the training
    loop, this process's logger, the validation questions, the rollout log and the step it resumed
    from."""

    learner: Learner
    trainer: Trainer
    logger: MetricLogger
    val: list[Example]
    rollouts: Path
    resumed_from: int


def build(
    cfg: PipelineConfig,
    data_dir: Path,
    init_dir: str | Path,
    out_dir: Path,
    logger: MetricLogger | None,
    reward_models: dict[str, str],
    round_: int,
    pass_rates: str | Path | None,
    adapter: str | Path | None,
) -> Built:
    """The run's set-up (``run_grpo``'s arguments): the processes, the reward (a weighted model that
    was not given is an error here, before any checkpoint is looked at), the policy (from its last
    checkpoint where one is), the algorithm's other models, the questions and the loop's plan."""
    grpo = cfg.grpo
    refuse_missing_inputs(grpo, pass_rates, adapter)
    d = distributed.init(cfg.launch)
    device = device_for(cfg.launch)  # this process's
    logger = (logger or NullLogger()) if d.main else NullLogger()
    set_compute(cfg.threads)
    scorer = RewardScorer.for_recipe(
        grpo, load_tokenizer(init_dir), cfg.reward_data.step_separator, reward_models, device=device
    )
    seed = round_seed(cfg.seed, round_)
    trainer = Trainer(
        cfg, "grpo", out_dir, identity(cfg, init_dir, round_, reward_models, pass_rates, adapter), d, logger
    )
    policy, tokenizer = load_trainable(init_dir, grpo.lora, trainer.resume or adapter, seed)
    place(policy, cfg.launch, train="grpo")
    amp = functools.partial(autocast, cfg.launch, device)
    ref, companions = algorithm_models(cfg, init_dir, policy, seed, d.world)
    rates = read_pass_rates(Path(pass_rates) / "pass_rates.jsonl") if grpo.curriculum else None
    sampler = QuestionSampler(read_split(data_dir, "rl"), seed, rates, grpo.curriculum)
    policy.train()
    wrapped = trainer.wrap(CompletionLogprobs(policy))
    # The loop's plan: validate the start (GRPO never publishes a worse model), keep-best by
    # validation accuracy where on, every step's recorded rewards kept.
    plan = Plan(
        max_steps=grpo.max_steps,
        eval_every=grpo.eval_every,
        eval_first=True,
        eval_last=True,
        keep_best="val/accuracy" if grpo.keep_best else None,
        record=RECORDED,
    )
    st = trainer.start(policy, tokenizer, plan, companions)
    rollouts = rollout_log.log_path(out_dir, d.rank)
    if grpo.save_rollouts:
        out_dir.mkdir(parents=True, exist_ok=True)
        rollout_log.truncate_after(rollouts, st.step)  # steps past the checkpoint are sampled again
    value, value_opt = trainer.companions.get("value", (None, None))
    learner = Learner(
        Models(policy, ref, value, value_opt), tokenizer, trainer.opt, grpo, scorer, seed, sampler, d, wrapped, amp
    )
    return Built(learner, trainer, logger, read_split(data_dir, "val"), rollouts, st.step)


def manifest(
    grpo: GRPOConfig,
    st: TrainState,
    run: Built,
    final_dir: str | Path,
    init_dir: str | Path,
    out_dir: Path,
    round_: int,
) -> dict:
    """The stage's manifest: what it published (keep-best's policy, the last beside it where they
    differ), where it started, and its training's summary."""
    sampler = run.learner.question_sampler
    kept_another = grpo.keep_best and st.best_step != st.step
    return {
        "stage": "grpo",
        "algorithm": grpo.algorithm,
        "model": str(final_dir),
        "last_model": str(out_dir / "last") if kept_another else None,
        "init": str(init_dir),
        **summary(st, grpo, run.trainer.stop_reason(), run.resumed_from, round_),
        "curriculum_questions": len(sampler.sometimes) if sampler.share else None,  # solved sometimes: drawn from
        "rollouts": str(out_dir) if grpo.save_rollouts else None,
    }


def refuse_missing_inputs(grpo: GRPOConfig, pass_rates: str | Path | None, adapter: str | Path | None) -> None:
    """What the recipe asks for and the caller did not give, refused before anything loads."""
    if grpo.curriculum and pass_rates is None:
        raise ValueError(
            f"grpo.curriculum = {grpo.curriculum} draws questions by the policy's pass rates, but no "
            f"reward-data pass rates were given"
        )
    if adapter is not None and grpo.lora is None:
        raise ValueError(f"an adapter to continue ({adapter}) needs grpo.lora: the adapter's rank and layers")


def identity(
    cfg: PipelineConfig,
    init_dir: str | Path,
    round_: int,
    reward_models: dict[str, str],
    pass_rates: str | Path | None,
    adapter: str | Path | None,
) -> dict:
    """The run's identity (a checkpoint resumes only under the same): the recipe and the digests of
    every input the step reads."""
    used = {k: reward_models[k] for k in cfg.grpo.reward_models_used}
    return run_identity(
        cfg,
        "grpo",
        init=digest_dir(Path(init_dir)),
        round=round_,
        reward_models={k: digest_dir(Path(p)) for k, p in used.items()},
        separator=cfg.reward_data.step_separator if cfg.grpo.reward_weights.get("prm") else None,  # PRM or oracle
        **({"pass_rates": digest_dir(Path(pass_rates))} if cfg.grpo.curriculum else {}),
        **({"adapter": digest_dir(Path(adapter))} if adapter else {}),
    )


def algorithm_models(
    cfg: PipelineConfig, init_dir: str | Path, policy: torch.nn.Module, seed: int, world: int
) -> tuple[torch.nn.Module | None, dict]:
    """The models the algorithm uses beside the policy: the frozen reference where it samples it or
    weighs a KL to it (a LoRA policy with its adapter off: no second copy), and the companions the
    trainer optimises beside it (PPO's value model from the policy, with its lr scale; on resume
    its weights come from the checkpoint)."""
    grpo = cfg.grpo
    ref = None
    if grpo.loads_reference and grpo.lora is not None:
        ref = policy  # with its adapter off (adapters.off): the starting model
    elif grpo.loads_reference:
        ref, _ = load_model(init_dir)
        place(ref, cfg.launch).eval().requires_grad_(False)
    companions = {}
    if "value" in ALGORITHMS[grpo.algorithm].trains:
        if world > 1:
            raise ValueError(
                f"grpo.algorithm={grpo.algorithm} runs in one process (its value model has no data-parallel wrapper)"
            )
        value = place(value_model_from(policy, seed), cfg.launch, train="grpo")
        companions["value"] = (value, (grpo.ppo.value_lr or grpo.lr) / grpo.lr)
    return ref, companions


def published_accuracy(st: TrainState, grpo: GRPOConfig) -> float:
    """The validation accuracy of the published policy: keep-best's, or the last evaluation's."""
    return st.best_acc if grpo.keep_best else st.curve[-1]["val/accuracy"]


def position_bias(history: list[dict]) -> dict[str, float]:
    """Each step place's mean advantage in checker-silent groups (``position_metrics``) over the run's
    steps that trained on such a step: the run's summary of a bias that should be 0."""
    out = {}
    for key in POSITION_METRICS:
        values = [h[key] for h in history if key in h]
        out[key.removeprefix("adv/silent_")] = sum(values) / len(values) if values else float("nan")
    return out


def summary(st: TrainState, grpo: GRPOConfig, stopped: str, resumed_from: int, round_: int) -> dict:
    """What the stage's manifest says of its training: the published step and its accuracy, the
    budget spent, the curve, every step's recorded rewards, the last steps' means and the reward
    models' staleness at the first, middle and last evaluation that measured it."""
    recent = st.extra.get("recent", [])
    last = {
        k.removeprefix("train/"): sum(m[k] for m in recent) / len(recent)
        for k in SUMMARY_METRICS
        if recent and all(k in m for m in recent)
    }
    measured = [p for p in st.curve if any(k.startswith("staleness/") for k in p)]
    return {
        "best_val_accuracy": published_accuracy(st, grpo),
        "best_step": st.best_step if grpo.keep_best else st.step,  # the last
        "steps": st.step,
        "wall_s": round(st.elapsed, 2),
        "train_s": round(st.train_s, 2),
        "stopped": stopped,
        "resumed_from_step": resumed_from,
        "round": round_,
        f"last_{SUMMARY_WINDOW}_steps": last,
        "curve": st.curve,
        "rewards": [recorded(h) for h in st.history],
        "position_bias": position_bias(st.history),
        "staleness": {
            k.removeprefix("staleness/"): [
                p.get(k, float("nan")) for p in (measured[0], measured[len(measured) // 2], measured[-1])
            ]
            for k in (measured[-1] if measured else {})
            if k.startswith("staleness/")
        },
    }

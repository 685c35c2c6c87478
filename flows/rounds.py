"""Iterative RL (DeepSeekMath §4.2, Algorithm 1): the ``rl-round`` subflow (``rl-rounds``, which continues a
finished run, is in ``flows/pipeline.py``).

Round k starts from policy k-1 (the SFT model for k = 1) and the reward models of round k-1:
  reward_data  sample the current policy on this round's RL questions; label outcomes and steps
  replay       buffer version k = version k-1 + these training rows (written before any training)
  orm / prm    continue last round's model on the fresh rows + a replay of version k-1
               (``rounds.replay_fraction`` of the set); held-out = fresh rows only, measured
               before and after: how stale the reward model had become, and what retraining fixed
  grpo         from policy k-1, reference reset to it, with the retrained reward models
  eval         the new policy's test accuracy
then the policy is registered in MLflow (alias ``champion`` on the best by validation accuracy) and
the round publishes a Prefect artifact. A recipe that trains no reward model runs grpo and eval only
(and reward_data first where ``grpo.curriculum`` draws GRPO's questions by the policy's pass rates).

Every stage is a cached task under ``runs/<run>/round-<k>/``: re-running a flow skips finished
rounds, and a killed round resumes each stage from its last complete checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, ConfigDict

from flows import artifact_key
from flows.reports import mlflow_link, round_report
from grpo_core.config import PipelineConfig
from grpo_core.rewards.gate import Gated, gate_grpo
from grpo_core.stages.inputs import EvalInputs, GRPOInputs, INPUTS, Ref, ReplayInputs, RewardDataInputs
from grpo_core.stages.outputs import GRPOOutput
from grpo_core.stats import question_interval
from grpo_core.mlflow_runs import delete_run, experiment_id, finishing, logged_round, patiently, round_params, start_run
from grpo_core.tracking import MlflowLogger, unsent_dir
from tasks.registry import promote_champion, register_policy, registered_name
from tasks.stage_tasks import (
    StageRun,
    eval_task,
    grpo_task,
    orm_task,
    prm_task,
    replay_task,
    reward_data_task,
    run_stage,
)


class RoundStart(BaseModel):
    """Where round k starts: policy k-1 (the SFT model for k = 1), the reward models and replay
    buffer version of round k-1, its GRPO rollouts, and the registered policy versions so far."""

    model_config = ConfigDict(frozen=True)
    policy: Ref
    reward_models: dict[str, Ref] = {}
    buffer: Ref | None = None
    rollouts: Ref | None = None
    versions: list[str] = []
    previous_answers: str | None = None  # round k-1's per-question test answers (round k against it)


def reward_stages(
    cfg: PipelineConfig, k: int, round_dir: Path, run_dir: Path, data: Ref, sft: Ref, start: RoundStart, common: dict
) -> dict[str, StageRun]:
    """reward_data -> replay -> orm / prm for round ``k``, by stage (reward_data alone where only
    GRPO's curriculum needs the policy's pass rates)."""
    wanted = [kind for kind in ("orm", "prm") if getattr(cfg, kind).train]
    if not wanted and not cfg.grpo.curriculum:
        return {}
    out = {
        "reward_data": run_stage(
            reward_data_task,
            cfg,
            str(round_dir / "reward_data"),
            RewardDataInputs(data=data, policy=start.policy, round=k, rollouts=start.rollouts),
            **common,
        )
    }
    if not wanted:
        return out
    datasets = out["reward_data"].output.datasets
    out["replay"] = run_stage(
        replay_task,
        cfg,
        str(run_dir / "replay" / f"v{k}"),
        ReplayInputs(reward_data=datasets, previous=start.buffer, round=k),
        **common,
    )
    for kind in wanted:
        # Round 1: from the SFT checkpoint (or what <kind>.init names, decided in the stage).
        inputs = INPUTS[kind](
            reward_data=datasets, init=start.reward_models.get(kind, sft), round=k, replay=start.buffer, baseline=sft
        )
        out[kind] = run_stage(orm_task if kind == "orm" else prm_task, cfg, str(round_dir / kind), inputs, **common)
    return out


def round_summary(k: int, runs: dict[str, StageRun], test: dict) -> dict:
    """What a round produced and measured (the manifest's ``rounds`` entries)."""
    out = {name: r.output for name, r in runs.items()}
    grpo = out["grpo"]
    rms = {
        kind: {
            "model": rm.model,
            "digest": rm.digest,
            "before": rm.heldout_before,
            "after": rm.heldout,
            "replay": rm.replay,
            "baseline": rm.baseline,
            "quality_gate": rm.quality_gate,
        }
        for kind, rm in out.items()
        if kind in ("orm", "prm")
    }
    return {
        "round": k,
        "policy": grpo.model,
        "policy_digest": grpo.digest,
        "test_accuracy": test["accuracy"],
        "val_accuracy": grpo.best_val_accuracy,
        "test_per_question": test.get("per_question"),
        "held_out_accuracy": {name: r["accuracy"] for name, r in test.get("held_out", {}).items()},
        "grpo": {
            "steps": grpo.steps,
            "wall_s": grpo.wall_s,
            "train_s": grpo.train_s,
            "best_step": grpo.best_step,
            "resumed_from_step": grpo.resumed_from_step,
            **grpo.last_10_steps,
            # the reward models' within-question AUC on the policy's samples, and the reward-hacking
            # curve, at GRPO's first, middle and last evaluation
            "staleness": grpo.staleness,
        },
        "reward_models": rms,
        "buffer": {"dir": out["replay"].dir, "digest": out["replay"].digest} if "replay" in out else None,
        # The rollouts are determined by the stage that wrote them: its policy's digest names them.
        "rollouts": {"dir": grpo.rollouts, "digest": grpo.digest} if grpo.rollouts else None,
        "stages": {name: r.manifest for name, r in runs.items()},
        "cached_stages": [name for name, r in runs.items() if r.cached],
    }


def against_previous(previous: str | None, now: str | None) -> dict | None:
    """Round k's test accuracy minus round k-1's on the same questions, with its 95% interval (None
    for round 1, whose start, the SFT model, is evaluated at the pipeline's end)."""
    import json

    if not previous or not now or not Path(previous).exists():
        return None
    return question_interval(json.loads(Path(now).read_text()), json.loads(Path(previous).read_text()))


# What a comparison of rounds or recipes looks at first: MLflow lists metrics by name, and
# ``headline/`` sorts before the round's ``rm/...`` and ``round/...`` (copies of round/ values).
HEADLINE = {
    "test_accuracy": "round/test_accuracy",
    "minus_previous_round": "round/minus_previous_round",
    "minus_previous_round_low": "round/minus_previous_round_low",
    "minus_previous_round_high": "round/minus_previous_round_high",
    "reward_mean": "round/grpo_reward_mean",
    "kl": "round/grpo_kl",
}


def round_metrics(summary: dict) -> dict[str, float]:
    """Flat metrics of a round for MLflow (``headline/...`` first; ``round/...``;
    ``rm/<kind>/before|after/...``)."""
    out = {"round/test_accuracy": summary["test_accuracy"], "round/val_accuracy": summary["val_accuracy"]}
    if summary.get("minus_previous_round"):  # round k against round k-1 on the same test questions
        gain = summary["minus_previous_round"]
        out |= {
            "round/minus_previous_round": gain["mean"],
            "round/minus_previous_round_low": gain["low"],
            "round/minus_previous_round_high": gain["high"],
        }
    out.update({f"round/{name}_accuracy": v for name, v in summary.get("held_out_accuracy", {}).items()})
    out.update({f"round/grpo_{k}": v for k, v in summary["grpo"].items() if isinstance(v, (int, float))})
    out.update(
        {
            f"round/staleness_{k}_{when}": v
            for k, vs in summary["grpo"].get("staleness", {}).items()
            for when, v in zip(("start", "middle", "end"), vs)
        }
    )
    for kind, rm in summary["reward_models"].items():
        for when in ("before", "after", "baseline"):
            out.update({f"rm/{kind}/{when}/{m}": v for m, v in rm.get(when, {}).items()})
        if rm.get("quality_gate"):
            out[f"rm/{kind}/quality_gate_passed"] = float(rm["quality_gate"]["passed"])
        out[f"rm/{kind}/replay_share"] = rm["replay"].get("share", 0.0)
    return {f"headline/{name}": out[key] for name, key in HEADLINE.items() if key in out} | out


@flow(name="rl-round", flow_run_name="{cfg.run_name}/round-{k}")
def rl_round(cfg: PipelineConfig, k: int, data: Ref, sft: Ref, start: RoundStart, uri: str, parent_id: str) -> dict:
    """One RL round (see the module docstring) from ``start``."""
    log = get_run_logger()
    run_dir = cfg.run_dir.resolve()
    round_dir = run_dir / f"round-{k}"
    wait_s, unsent = cfg.tracking.wait_s, unsent_dir(run_dir)
    exp_id = experiment_id(uri, cfg.tracking.experiment, wait_s)
    run_id = start_run(uri, exp_id, f"round-{k}", parent_id=parent_id, tags={"round": str(k)}, wait_s=wait_s)
    common = {"uri": uri, "parent_id": run_id}
    with finishing(uri, [run_id], unsent):
        results = reward_stages(cfg, k, round_dir, run_dir, data, sft, start, common)
        rms = {kind: results[kind].output for kind in ("orm", "prm") if kind in results}
        # What GRPO optimises this round is decided in the core (rewards/gate.py); the flow reports it.
        gated = gate_grpo(cfg, {kind: rm.quality_gate for kind, rm in rms.items()})
        warn_gate_failures(log, k, gated)
        gcfg = gated.cfg
        rates = results["reward_data"].output.pass_rates_ref if cfg.grpo.curriculum else None
        refs = {kind: rm.ref for kind, rm in rms.items()}
        results["grpo"] = grpo_stage(gcfg, k, round_dir / "grpo", data, start.policy, refs, rates, common)
        grpo = results["grpo"].output
        warn_kept_start(log, k, gcfg, grpo)
        results["eval"] = run_stage(
            eval_task, cfg, str(round_dir / "eval"), EvalInputs(data=data, models={"policy": grpo.ref}), **common
        )
        summary = round_summary(k, results, results["eval"].output.results["policy"])
        summary["minus_previous_round"] = against_previous(start.previous_answers, summary["test_per_question"])
        cached, stages = summary["cached_stages"], summary["stages"]
        summary["quality_warnings"] = gated.failures
        summary["excluded_reward_models"] = gated.excluded
        # A round served whole from the cache (a rerun, a continuation) is the run that computed it.
        logged = logged_round(uri, stages["grpo"]["mlflow_run_id"]) if len(cached) == len(results) else None
        clock = time.perf_counter()
        summary["model_version"], champion = register(
            cfg, k, uri, logged or run_id, grpo, summary["val_accuracy"], start.versions
        )
        # Where the round's time went: each stage as the flow waited for it, and the model registry.
        summary["profile"] = {s: r.seconds for s, r in results.items()} | {"register": time.perf_counter() - clock}
        if logged is None:
            log_round(MlflowLogger(uri, run_id, unsent=unsent), gcfg, k, summary)
        link = mlflow_link(uri, exp_id, logged or run_id)
        create_markdown_artifact(
            key=artifact_key(f"{cfg.run_name}-round-{k}"),
            markdown=round_report(summary, champion, link),
            description=f"RL round {k} of {cfg.run_name}",
        )
    if logged is not None:
        delete_run(uri, run_id)  # (empty: nothing ran or was registered in it)
    summary.update(mlflow_run_id=logged or run_id, champion=champion)
    log.info(
        "round %d: test %.4f, validation %.4f, cached %s",
        k,
        summary["test_accuracy"],
        summary["val_accuracy"],
        cached or "none",
    )
    return summary


def grpo_stage(
    cfg: PipelineConfig,
    k: int,
    where: Path,
    data: Ref,
    policy: Ref,
    reward_models: dict[str, Ref],
    rates: Ref | None,
    common: dict,
) -> StageRun:
    """Round ``k``'s GRPO in ``where``, from ``policy`` on the reward models its recipe (``cfg``, the
    quality gates applied) uses of ``reward_models``; ``rates``: the policy's pass rates, given to a
    curriculum only. The pipeline's rounds and the experiments' iterated variants both run it."""
    return run_stage(
        grpo_task,
        cfg,
        str(where),
        GRPOInputs(
            data=data,
            init=policy,
            reward_models={m: reward_models[m] for m in cfg.grpo.reward_models_used},
            round=k,
            pass_rates=rates if cfg.grpo.curriculum else None,
        ),
        **common,
    )


def warn_gate_failures(log, k: int, gated: Gated) -> None:
    """A warning per reward model that failed its quality gate this round, saying whether GRPO's
    reward leaves it out."""
    for failure in gated.failures:
        log.warning(
            "round %d: QUALITY GATE FAILED: %s%s",
            k,
            failure,
            "; kept out of GRPO's reward" if gated.excluded else "",
        )


def warn_kept_start(log, k: int, gcfg: PipelineConfig, grpo: GRPOOutput) -> None:
    """A warning where keep-best published the round's starting policy itself: validation never rose
    above it over GRPO's steps."""
    if gcfg.grpo.keep_best and grpo.best_step == 0 and grpo.steps:
        log.warning(
            "round %d: validation never rose above the starting policy's %.1f%% in %d GRPO steps: keep-best "
            "published the starting policy itself (for a LoRA run, an adapter that changes nothing)%s",
            k,
            100 * grpo.best_val_accuracy,
            grpo.steps,
            f"; the last step's policy is {grpo.last_model}" if grpo.last_model else "",
        )


def register(
    cfg: PipelineConfig, k: int, uri: str, run_id: str, grpo: GRPOOutput, val_accuracy: float, versions: list[str]
) -> tuple[str, dict]:
    """Round ``k``'s policy registered under the MLflow run ``run_id`` (with its validation accuracy),
    and the champion alias moved to the best of it and the earlier ``versions``; returns its version
    and the champion."""
    wait_s, name = cfg.tracking.wait_s, registered_name(cfg)
    version = patiently(
        lambda: register_policy(uri, name, run_id, grpo.model, k, val_accuracy, grpo.digest),
        uri,
        wait_s,
        f"register round {k}'s policy",
    )
    champion = patiently(
        lambda: promote_champion(uri, name, [*versions, version]),
        uri,
        wait_s,
        "move the champion alias",
    )
    return version, champion


def log_round(tracker: MlflowLogger, gcfg: PipelineConfig, k: int, summary: dict) -> None:
    """A round's parameters, metrics (``round_metrics``) and tags on its own MLflow run."""
    tracker.log_params(round_params(gcfg, k))
    tracker.log_metrics(round_metrics(summary))
    tracker.set_tags(
        {
            "cached_stages": ",".join(summary["cached_stages"]) or "none",
            "model_version": summary["model_version"],
            "quality_gate": "FAILED: " + "; ".join(summary["quality_warnings"])
            if summary["quality_warnings"]
            else "passed",
            **{f"stage_run.{s}": m["mlflow_run_id"] for s, m in summary["stages"].items()},
        }
    )


def next_start(summary: dict, start_versions: list[str]) -> RoundStart:
    """Where round k+1 starts: round k's policy, reward models, replay buffer version and rollouts."""
    return RoundStart(
        policy=Ref(path=summary["policy"], digest=summary["policy_digest"]),
        reward_models={
            kind: Ref(path=rm["model"], digest=rm["digest"]) for kind, rm in summary["reward_models"].items()
        },
        buffer=summary["buffer"] and Ref(path=summary["buffer"]["dir"], digest=summary["buffer"]["digest"]),
        rollouts=summary["rollouts"] and Ref(path=summary["rollouts"]["dir"], digest=summary["rollouts"]["digest"]),
        versions=[*start_versions, summary["model_version"]],
        previous_answers=summary.get("test_per_question"),
    )

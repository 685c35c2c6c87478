"""The ``pipeline`` flow: data -> SFT -> RL rounds (each: [reward data -> replay -> ORM / PRM] -> GRPO
-> evaluation; see ``flows.rounds``) -> evaluation of the SFT model and the final policy.

One MLflow parent run per pipeline run, a child run per stage and per round (``round-<k>``, with its
stages nested); ``runs/<run_name>/manifest.json`` is the public summary (docs/architecture.md): policy,
sft_model, eval, mlflow_run_id, tracking_uri, and ``rounds``. The ``rl-rounds`` flow continues a
finished run for more rounds with its own recipe.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import Field

from flows import artifact_key, numbered_run_name, parameter
from flows.corpus import corpus
from flows.reports import PARENT_NOTE, figure_source, pipeline_report
from flows.rounds import RoundStart, next_start, rl_round, round_metrics
from grpo_core import figures
from grpo_core.config import PipelineConfig
from grpo_core.digests import digest_dir
from grpo_core.lm.runtime import numerics, peak_memory
from grpo_core.manifests import read_manifest, write_manifest
from grpo_core.mlflow_runs import experiment_id, finishing, run_params, start_run, tracking_uri
from grpo_core.recipe import ConfigError, load_config
from grpo_core.stages.inputs import (
    CorpusInputs,
    DataInputs,
    EvalInputs,
    PretrainInputs,
    Ref,
    SFTInputs,
    write_resolved,
)
from grpo_core.stats import question_interval
from grpo_core.tracking import MlflowLogger, check_tracking, redact, send_unsent, unsent_count, unsent_dir
from tasks.run_lock import run_lock
from tasks.stage_tasks import StageRun, data_task, eval_task, pretrain_task, run_stage, sft_task, stage_key, trusted


def pretraining_stages(config: PipelineConfig, run_dir, data: Ref, common: dict) -> dict[str, StageRun]:
    """corpus (a subflow: a scoring task per iteration) -> continued pretraining, whose model SFT starts
    from. The corpus subflow is skipped when its manifest carries the same content key."""
    clock = time.perf_counter()
    out = run_dir / "corpus"
    inputs = CorpusInputs(data=data)
    key = stage_key("corpus", config, inputs, out)
    manifest_path = out / "manifest.json"
    why = trusted(manifest_path, key, inputs.output)
    if why:
        get_run_logger().warning("corpus: %s: running it again", why)
    hit = why is None
    done = read_manifest(manifest_path) if hit else {}
    if not hit:
        done = corpus(config, own_benchmarks=inputs.benchmarks(), parent_run_id=common["parent_id"])
        done.update(cache_key=key, digest=digest_dir(Path(done["corpus_dir"])))
        write_manifest(out, done, run_dir)
    done = inputs.output.model_validate(done)
    pre = run_stage(pretrain_task, config, str(run_dir / "pretrain"), PretrainInputs(corpus=done.ref), **common)
    return {"corpus": StageRun(done, hit, time.perf_counter() - clock - pre.seconds), "pretrain": pre}


def gain_over_sft(policy: dict, sft: dict) -> dict:
    """A policy's test accuracy minus the SFT model's on the same questions (their eval results),
    with a 95% interval over the questions (one seed: what this run shows, not what the recipe does
    on average; ``compare`` repeats seeds)."""
    paths = [r.get("per_question") for r in (policy, sft)]
    if not all(paths) or not all(Path(p).exists() for p in paths):
        return {}
    return question_interval(*(json.loads(Path(p).read_text()) for p in paths))


def held_out_gains(policy: dict, sft: dict) -> dict[str, dict]:
    """Each further held-out set (``data.held_out``): its size, the SFT model's and the policy's
    accuracy, and the policy's paired gain over SFT with its 95% interval (``gain_over_sft``)."""
    both = [name for name in policy.get("held_out", {}) if name in sft.get("held_out", {})]
    return {
        name: {
            "n": policy["held_out"][name]["n"],
            "sft": sft["held_out"][name]["accuracy"],
            "policy": policy["held_out"][name]["accuracy"],
            "gain_over_sft": gain_over_sft(policy["held_out"][name], sft["held_out"][name]),
        }
        for name in both
    }


def round_gains(manifest: dict) -> dict[int, dict[str, dict]]:
    """Each round's policy minus the SFT model, paired over the questions with a 95% interval: on
    the test split (``test``) and each further held-out set, by round."""
    sft = manifest["eval"]["sft"]
    return {
        r["round"]: {"test": gain_over_sft(policy, sft)}
        | {k: g["gain_over_sft"] for k, g in held_out_gains(policy, sft).items()}
        for r in manifest["rounds"]
        for policy in [r["stages"]["eval"]["results"]["policy"]]
    }


def report_run(manifest: dict, run_dir: Path, exp_id: str, tracker: MlflowLogger) -> dict[str, str]:
    """The run's figures, saved under ``run_dir/figures``, logged as images on its MLflow run, and
    shown with its tables in a Prefect summary artifact; returns the figures' paths."""
    paths = figures.save(figures.pipeline_figures(manifest, run_dir), run_dir / "figures")
    tracker.log_artifacts(run_dir / "figures", "figures")
    shown = {name: figure_source(path) for name, path in paths.items()}
    create_markdown_artifact(
        key=artifact_key(f"{manifest['run_name']}-summary"),
        markdown=pipeline_report(manifest, exp_id, round_gains(manifest), shown),
        description=f"pipeline run {manifest['run_name']}: results, reward models, figures",
    )
    return {name: str(path) for name, path in paths.items()}


def time_profile(
    runs: dict[str, StageRun], rounds: list[dict], wall_s: float, cached: list[str], earlier: dict[str, float]
) -> dict:
    """Where the run's wall time went: every stage (a round's as ``round-<k>/<stage>``, its model
    registration as ``round-<k>/register``) as the flow waited for it, and the share of the flow's
    wall time the stages that ran account for (the rest: MLflow and Prefect bookkeeping between
    them). A stage served from the cache (``cached``) keeps the seconds it took when it ran
    (``earlier``: the profile of the run manifest this one replaces), not the cache hit's."""
    ran = {name: r.seconds for name, r in runs.items()}
    ran |= {f"round-{r['round']}/{s}": v for r in rounds for s, v in r["profile"].items()}
    ran = {name: round(v, 2) for name, v in ran.items()}
    share = sum(v for name, v in ran.items() if name not in cached) / wall_s
    return {
        "stages_s": {name: earlier.get(name, v) if name in cached else v for name, v in ran.items()},
        "wall_s": round(wall_s, 2),
        "stage_share": round(share, 4),
    }


def earlier_profile(run_dir: Path) -> dict[str, float]:
    """The stage seconds of the run manifest in ``run_dir`` (empty if none can be read)."""
    try:
        return read_manifest(run_dir / "manifest.json").get("profile", {}).get("stages_s", {})
    except (OSError, ValueError):
        return {}


@flow(name="pipeline", flow_run_name=lambda: numbered_run_name(parameter("config").run_name))
def pipeline(config: PipelineConfig, continues: str | None = None) -> dict:
    """``continues``: the MLflow run of the finished run that ``rl-rounds`` continues (its parent
    run is then named for the rounds it adds, and tagged with the run it continues)."""
    # One writer per run folder: a second run on it refuses at once, naming the first (tasks/run_lock.py).
    with run_lock(config.run_dir, f"pipeline {config.run_name}", get_run_logger()):
        return _pipeline(config, continues)


def made_elsewhere(run_dir: Path) -> Path | None:
    """Where a finished run folder was made, when that is not where it is now (a copied or moved
    project or run folder); None otherwise. Its stages are reused where they are now: cache keys
    count paths relative to the run folder, and manifests are read relocated (``read_manifest``)."""
    path = run_dir / "manifest.json"
    try:
        made = json.loads(path.read_text(encoding="utf-8")).get("written_in") if path.exists() else None
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    return None if made is None or Path(made) == run_dir.resolve() else Path(made)


def _pipeline(config: PipelineConfig, continues: str | None = None) -> dict:
    """The pipeline flow's body (``pipeline``), under the run folder's lock."""
    log = get_run_logger()
    clock = time.perf_counter()
    process_numerics = numerics()  # warns before any work where MKL ignores the reproducibility setting
    run_dir = config.run_dir.resolve()
    if (made := made_elsewhere(run_dir)) is not None:
        log.info("%s was made at %s: its finished stages are reused here, read where they are now", run_dir, made)
    run_dir.mkdir(parents=True, exist_ok=True)
    uri, unsent = ready_tracking(config, run_dir, log)
    exp_id = experiment_id(uri, config.tracking.experiment)
    parent = start_parent_run(config, uri, exp_id, continues)
    common = {"uri": uri, "parent_id": parent}
    with finishing(uri, [parent], unsent):
        tracker = MlflowLogger(uri, parent, unsent=unsent)
        log_setup(tracker, config, process_numerics)
        runs = model_stages(config, run_dir, common)
        data, sft = runs["data"].output, runs["sft"].output
        rounds = run_rounds(config, data.ref, sft.ref, uri, parent, tracker)
        policy = rounds[-1]
        # The SFT model's test accuracy; each round's eval already measured its policy on the same questions.
        runs["eval"] = run_stage(
            eval_task, config, str(run_dir / "eval"), EvalInputs(data=data.ref, models={"sft": sft.ref}), **common
        )
        cached = [name for name, r in runs.items() if r.cached] + [
            f"round-{r['round']}/{s}" for r in rounds for s in r["cached_stages"]
        ]
        eval_results = {**runs["eval"].output.results, "policy": policy["stages"]["eval"]["results"]["policy"]}
        gain, held_out = log_evaluation(tracker, eval_results)
        tracker.set_tags(run_tags(cached, rounds, runs))
        profile = time_profile(runs, rounds, time.perf_counter() - clock, cached, earlier_profile(run_dir))
        tracker.log_metrics(
            {f"time/stage/{name}_s": s for name, s in profile["stages_s"].items()}
            | {"time/wall_s": profile["wall_s"], "time/stage_share": profile["stage_share"]}
        )
        manifest = run_manifest(
            config, runs, rounds, eval_results, gain, held_out, cached, profile, parent, uri, process_numerics, unsent
        )
        manifest["figures"] = report_run(manifest, run_dir, exp_id, tracker)
        # The resolved recipe goes beside the manifest it produced (``baseline`` reads both).
        write_resolved(config, run_dir / "config.yaml")
        manifest = write_manifest(run_dir, manifest, run_dir)
    log.info(
        "pipeline %s finished: %s",
        config.run_name,
        json.dumps({k: round(v["accuracy"], 4) for k, v in eval_results.items()}),
    )
    if kept := unsent_count(unsent):
        log.warning(
            "tracking: %d records the MLflow store did not take are kept in %s: the next run of this "
            "recipe sends them (or: grpo-pipeline sync %s)",
            kept,
            unsent,
            run_dir,
        )
    return manifest


def ready_tracking(config: PipelineConfig, run_dir: Path, log) -> tuple[str, Path]:
    """The recipe's tracking URI, its server checked reachable (an unreachable one fails here, not at
    the first stage's first metric), and the run folder's store of records MLflow did not take,
    with what an earlier run of the folder left there sent."""
    uri = tracking_uri(config)
    check_tracking(uri)
    unsent = unsent_dir(run_dir)
    sent, kept = send_unsent(uri, unsent)
    if sent or kept:
        log.info("tracking: sent %d records kept by an earlier run (%d still kept in %s)", sent, kept, unsent)
    return uri, unsent


def start_parent_run(config: PipelineConfig, uri: str, exp_id: str, continues: str | None) -> str:
    """The run's MLflow parent run. A continuation (``continues``: the run it continues) is its own
    run, named for what it adds (the rounds before it come from the cache)."""
    name = config.run_name if continues is None else f"{config.run_name}: to round {config.rounds.count}"
    return start_run(
        uri,
        exp_id,
        name,
        tags={
            "pipeline": "deepseekmath-grpo",
            "mlflow.note.content": PARENT_NOTE,
            **({"continues": continues} if continues else {}),
        },
    )


def log_setup(tracker: MlflowLogger, config: PipelineConfig, process_numerics: dict) -> None:
    """The recipe's parameters and the process's numerics (``numerics``) on the parent run."""
    tracker.log_params(run_params(config))
    tracker.set_tags(
        {
            "numerics.mkl_mode": str(process_numerics["mkl_mode"]),
            "numerics.cpu_capability": process_numerics["cpu_capability"],
            "numerics.cpu": process_numerics["cpu"],
        }
    )


def model_stages(config: PipelineConfig, run_dir: Path, common: dict) -> dict[str, StageRun]:
    """data -> (corpus -> continued pretraining, where the recipe pretrains) -> SFT, by stage."""
    runs = {"data": run_stage(data_task, config, str(run_dir / "data"), DataInputs(), **common)}
    data = runs["data"].output
    runs |= pretraining_stages(config, run_dir, data.ref, common) if config.pretrain.train else {}
    init = runs["pretrain"].output.ref if "pretrain" in runs else None
    runs["sft"] = run_stage(sft_task, config, str(run_dir / "sft"), SFTInputs(data=data.ref, init=init), **common)
    return runs


def run_rounds(config: PipelineConfig, data: Ref, sft: Ref, uri: str, parent: str, tracker: MlflowLogger) -> list[dict]:
    """The recipe's RL rounds (``rl_round``), each from the last one's end, with per-round curves on
    the parent run; returns their summaries."""
    start = RoundStart(policy=sft)
    rounds = []
    for k in range(1, config.rounds.count + 1):
        rounds.append(rl_round(config, k, data, sft, start, uri, parent))
        start = next_start(rounds[-1], start.versions)
        tracker.log_metrics(round_metrics(rounds[-1]), step=k)  # per-round curves on the parent
    return rounds


def log_evaluation(tracker: MlflowLogger, eval_results: dict) -> tuple[dict, dict[str, dict]]:
    """The SFT model's and the final policy's accuracies, the policy's gain over SFT with its 95%
    interval, and the same on each further held-out set, on the parent run; returns the gain and
    the held-out sets' (``gain_over_sft``, ``held_out_gains``)."""
    tracker.log_metrics({f"eval/{name}/accuracy": r["accuracy"] for name, r in eval_results.items()})
    gain = gain_over_sft(eval_results["policy"], eval_results["sft"])
    held_out = held_out_gains(eval_results["policy"], eval_results["sft"])
    for where, g in [("", gain)] + [(f"{name}/", h["gain_over_sft"]) for name, h in held_out.items()]:
        if g:
            tracker.log_metrics(
                {
                    f"eval/{where}gain_over_sft": g["mean"],
                    f"eval/{where}gain_over_sft_low": g["low"],
                    f"eval/{where}gain_over_sft_high": g["high"],
                }
            )
    tracker.log_metrics(
        {f"eval/{name}/{model}/accuracy": h[model] for name, h in held_out.items() for model in ("sft", "policy")}
    )
    return gain, held_out


def run_tags(cached: list[str], rounds: list[dict], runs: dict[str, StageRun]) -> dict[str, str]:
    """The parent run's tags: the stages served from the cache, the champion, each stage's and
    round's MLflow run."""
    return {
        "cached_stages": ",".join(cached) or "none",
        "champion_version": rounds[-1]["champion"]["version"],
        **{f"stage_run.{s}": r.output.mlflow_run_id for s, r in runs.items()},
        **{f"round_run.{r['round']}": r["mlflow_run_id"] for r in rounds},
    }


def run_manifest(
    config: PipelineConfig,
    runs: dict[str, StageRun],
    rounds: list[dict],
    eval_results: dict,
    gain: dict,
    held_out: dict[str, dict],
    cached: list[str],
    profile: dict,
    parent: str,
    uri: str,
    process_numerics: dict,
    unsent: Path,
) -> dict:
    """The run's manifest before its figures (docs/architecture.md)."""
    policy = rounds[-1]
    return {
        "run_name": config.run_name,
        "policy": policy["policy"],
        "sft_model": runs["sft"].output.model,
        "data_dir": runs["data"].output.dir,
        "eval": eval_results,
        "gain_over_sft": gain,
        "held_out": held_out,
        "reward_models": {kind: rm["model"] for kind, rm in policy["reward_models"].items()},
        "rounds": rounds,
        "champion": rounds[-1]["champion"],
        "stages": {name: r.manifest for name, r in runs.items()},
        "cached_stages": cached,
        "profile": profile,
        "mlflow_run_id": parent,
        "tracking_uri": redact(uri),
        "experiment": config.tracking.experiment,
        "numerics": process_numerics,
        "tracking_unsent": unsent_count(unsent),
        # The flow's process over the run (the stages that ran in it; a launched stage's is its own manifest's).
        "peak_memory": peak_memory(),
    }


@flow(name="recipe", flow_run_name=lambda: numbered_run_name(f"recipe-{Path(parameter('recipe')).stem}"))
def run_recipe(recipe: str = "configs/demo.yaml", overrides: list[str] | None = None) -> dict:
    """The pipeline on a YAML recipe file plus ``section.key=value`` overrides (the deployments' entry
    point): the recipe is validated by ``PipelineConfig`` before any work, and an invalid one fails
    the flow run with every offending field named."""
    try:
        config = load_config(recipe, overrides or [])
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return pipeline(config)


@flow(name="rl-rounds", flow_run_name=lambda: numbered_run_name(f"more-rounds-{Path(parameter('run_dir')).name}"))
def rl_rounds(
    run_dir: str = "runs/demo", rounds: Annotated[int, Field(ge=1, le=100)] = 1, overrides: list[str] | None = None
) -> dict:
    """Continue a finished pipeline run for ``rounds`` more RL rounds with its own recipe
    (``overrides``: ``section.key=value`` over it, as ``run`` takes them).

    Reads ``<run_dir>/manifest.json`` and ``config.yaml``; the pipeline then serves every stage done
    before from the cache and runs only the new rounds (or finishes an interrupted one)."""
    root = Path(run_dir)
    manifest_path = root / "manifest.json"
    if not manifest_path.exists():
        raise FileNotFoundError(f"{manifest_path}: not a finished run; run the pipeline first (grpo-pipeline run ...)")
    finished = read_manifest(manifest_path)
    done = len(finished.get("rounds", []))
    cfg = load_config(root / "config.yaml", [*(overrides or []), f"rounds.count={done + rounds}"], migrate=True)
    if cfg.run_dir.resolve() != root.resolve():
        raise ValueError(
            f"{root / 'config.yaml'} writes to {cfg.run_dir.resolve()}, not {root.resolve()}: run "
            f"rl_rounds from the folder the run was started in (output_dir is relative to it)"
        )
    return pipeline(cfg, continues=finished.get("mlflow_run_id"))

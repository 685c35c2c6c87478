"""One Prefect task per stage, cached by content.

Prefect's default cache key includes the flow-run id and only the task's own source, so it never
hits across runs. Ours is keyed on the stage's config sections, the digests of its upstream outputs
and the library's code version, with persisted results: re-running a recipe skips finished stages.
A stage whose output folder has gone missing is recomputed rather than served from the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from prefect import task

from grpo_core.config import PipelineConfig
from grpo_core.digests import digest_dir
from grpo_core.lm.runtime import stage_peak_memory
from grpo_core.manifests import moved, read_manifest, write_manifest
from grpo_core.mlflow_runs import finishing, patiently, start_run
from grpo_core.recipe import flatten
from grpo_core.stages.identity import code_version
from grpo_core.stages.inputs import StageInputs
from grpo_core.stages.outputs import StageOutput
from grpo_core.tracking import MlflowLogger, unsent_dir
from tasks.launch import run_launched, runs_apart


class StageLogger(MlflowLogger):
    """A stage's MLflow logger (metric names prefixed by ``tracking.stage_prefix``) that also reports
    validation metrics to the Prefect run log, so a terminal running the flow (and the Prefect UI)
    shows progress. Through Prefect's logger, not ``log_prints``: that patch also catches what
    libraries print into a captured stdout (dill's bytecode listing while datasets fingerprints a
    table)."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        from prefect.exceptions import MissingContextError
        from prefect.logging import get_run_logger

        super().log_metrics(metrics, step)
        shown = {k: round(v, 4) for k, v in metrics.items() if k.startswith("val/")}
        if shown:
            try:
                get_run_logger().info("[%s] step %s: %s", self.stage, step, shown)
            except MissingContextError:
                print(f"[{self.stage}] step {step}: {shown}", flush=True)


@contextmanager
def child_run(
    uri: str, parent_id: str, stage: str, cfg: PipelineConfig, params: dict | None = None, name: str | None = None
) -> Iterator[MlflowLogger]:
    """A nested run for one stage, marked FAILED if the stage raises; named ``name`` (default: the
    stage), ``round-<k>/<name>`` under a round's run, so that two rounds' runs differ in a comparison.
    Starting it waits up to ``tracking.wait_s`` for a store that stopped answering; what the stage
    logs while it is down is kept in the run folder (``MlflowLogger``)."""
    from mlflow.tracking import MlflowClient

    wait_s, unsent = cfg.tracking.wait_s, unsent_dir(cfg.run_dir.resolve())
    parent = patiently(lambda: MlflowClient(uri).get_run(parent_id), uri, wait_s, f"start {stage}'s MLflow run")
    k = parent.data.tags.get("round")
    name = name or stage
    run_id = start_run(uri, parent.info.experiment_id, f"round-{k}/{name}" if k else name, parent_id, wait_s=wait_s)
    logger = StageLogger(uri, run_id, stage, unsent)
    with finishing(uri, [run_id], unsent):
        if params:
            logger.log_params(params)
        yield logger


def _select(cfg: PipelineConfig, keys: tuple[str, ...]) -> dict[str, Any]:
    dumped = cfg.model_dump(mode="json")
    out = {}
    for key in keys:
        node: Any = dumped
        for part in key.split("."):
            node = node[part]
        out[key] = node
    return out


def stage_key(stage: str, cfg: PipelineConfig, inputs: StageInputs, out_dir: Path) -> str:
    """The stage's content key. Paths inside the run folder count relative to it, so that a copied
    or moved run folder keeps its keys (its manifests are read where they are: ``read_manifest``)."""
    # A round with a history to replay: rounds.replay_fraction decides its reward models too.
    sections = inputs.sections + (("rounds.replay_fraction",) if getattr(inputs, "replay", None) else ())
    payload = {
        "stage": stage,
        "config": _select(cfg, sections),
        "upstream": inputs.model_dump(mode="json"),
        "code": code_version(),
        "out": str(out_dir.resolve()),
    } | ({"also": also} if (also := inputs.also_reads()) else {})
    payload = moved(payload, str(cfg.run_dir.resolve()), "<run>")
    return f"{stage}-{hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()}"


class StageRun(NamedTuple):
    output: StageOutput  # what the stage produced, typed (``stages/outputs.py``)
    cached: bool
    seconds: float  # how long the flow waited for the stage in this run (a cache hit: about none)

    @property
    def manifest(self) -> dict:
        """The stage's manifest as JSON (for a run's manifest and reports)."""
        return self.output.model_dump(mode="json")


def run_stage(stage_task, cfg: PipelineConfig, out_dir: str, inputs: StageInputs, uri: str, parent_id: str) -> StageRun:
    """Run a stage task; returns its output (typed), whether it came from the cache, and its wall time.

    A cached result is trusted only while the outputs on disk are the ones it describes: the
    manifest must be readable and carry the same cache key (another recipe under the same run name
    may have overwritten the folder), and the folders it names must still have their digests (a
    file truncated, removed or changed since). Otherwise the task runs again, resuming from its
    checkpoints, and refreshes the cache entry.
    """
    start = time.perf_counter()
    key = stage_key(stage_task.name, cfg, inputs, Path(out_dir))
    why = trusted(Path(out_dir) / "manifest.json", key, type(inputs).output)
    served = read_manifest(Path(out_dir) / "manifest.json").get("mlflow_run_id") if why is None else None
    if why:
        log = logging.getLogger("grpo_pipeline.cache")
        log.warning("%s: %s: running the stage again (from its last complete checkpoint, if any)", stage_task.name, why)
    state = stage_task.with_options(refresh_cache=why is not None)(
        cfg=cfg, out_dir=out_dir, inputs=inputs, uri=uri, parent_id=parent_id, return_state=True
    )
    try:
        state.result()
    except Exception as e:  # the same error, marked with the stage that raised it (``failed_stage``)
        e.failed_stage = (stage_task.name, str(out_dir))
        raise
    # What the stage wrote, read where it is now (a cached result may carry the paths of a folder
    # this run was copied from); served, not run, when its MLflow run is the one trusted before.
    output = type(inputs).output.model_validate(read_manifest(Path(out_dir) / "manifest.json"))
    return StageRun(output, why is None and output.mlflow_run_id == served, time.perf_counter() - start)


def failed_stage(error: BaseException) -> str | None:
    """One line for an error a stage raised during a run (None for any other): the stage, its folder
    and the error's first line."""
    stage = getattr(error, "failed_stage", None)
    if stage is None:
        return None
    first = (str(error).strip().splitlines() or [""])[0][:500]
    return f"stage {stage[0]} failed: {type(error).__name__}: {first} (its folder: {stage[1]})"


def trusted(manifest_path: Path, key: str, output: type[StageOutput]) -> str | None:
    """None when the stage's cached result can be served; else why not ("" when there is nothing to
    say: it never ran here, or ran with another key)."""
    if not manifest_path.exists():
        return ""
    try:
        on_disk = read_manifest(manifest_path)
        if on_disk.get("cache_key") != key:
            return ""
        return output.model_validate(on_disk).damaged()
    except ValueError as e:  # pydantic's ValidationError is one too
        return str(e).splitlines()[0][:300]


def _cache_key(stage: str):
    def key_fn(context, parameters: dict[str, Any]) -> str:
        return stage_key(stage, parameters["cfg"], parameters["inputs"], Path(parameters["out_dir"]))

    return key_fn


def _stage_params(cfg: PipelineConfig, inputs: StageInputs) -> dict[str, str]:
    return {k: v for k, v in flatten(cfg).items() if any(k == s or k.startswith(s + ".") for s in inputs.sections)}


def stage_task(stage: str):
    """The Prefect task of ``stage``: its inputs run in this process, or as processes of their own
    (``runs_apart``: training stages with ``launch.distributed`` or ``launch.own_process``, the
    evaluation with ``own_process``); the manifest records the output's digest, the cache key and the
    stage's MLflow run."""

    @task(name=stage, cache_key_fn=_cache_key(stage), persist_result=True)
    def run(cfg: PipelineConfig, out_dir: str, inputs: StageInputs, uri: str, parent_id: str) -> dict:
        key = stage_key(stage, cfg, inputs, Path(out_dir))
        if trusted(Path(out_dir) / "manifest.json", key, type(inputs).output) is None:
            # Done before, with no result in this Prefect home (a run folder copied from another project).
            return read_manifest(Path(out_dir) / "manifest.json")
        with child_run(uri, parent_id, stage, cfg, _stage_params(cfg, inputs), inputs.run_name(cfg)) as log:
            if runs_apart(cfg.launch, stage):  # its manifest carries its process's peak
                manifest = run_launched(stage, cfg, out_dir, inputs, uri, log.run_id)
            else:
                with stage_peak_memory() as peak:
                    manifest = inputs.run(cfg, Path(out_dir), log)
                manifest["peak_memory"] = peak
            if "model" in manifest:
                manifest["digest"] = digest_dir(Path(manifest["model"]))
            if manifest.get("last_model"):  # GRPO's last policy where keep-best published another
                manifest["last_digest"] = digest_dir(Path(manifest["last_model"]))
            manifest["mlflow_run_id"] = log.run_id
            manifest["cache_key"] = key
            return write_manifest(Path(out_dir), manifest, cfg.run_dir)

    return run


data_task, pretrain_task, sft_task, reward_data_task, replay_task, orm_task, prm_task, grpo_task, eval_task = (
    stage_task(s) for s in ("data", "pretrain", "sft", "reward_data", "replay", "orm", "prm", "grpo", "eval")
)

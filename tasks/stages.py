"""One Prefect task per stage, cached by content.

Prefect's default cache key includes the flow-run id and only the task's own source, so it never
hits across runs. Ours is keyed on the stage's config sections, the digests of its upstream outputs
and the library's code version, with persisted results: re-running a recipe skips finished stages.
A stage whose output folder has gone missing is recomputed rather than served from the cache.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from prefect import task

from grpo_core.config import PipelineConfig, flatten
from grpo_core.data import load_jsonl
from grpo_core.evaluation import evaluate
from grpo_core.modeling import load_model
from grpo_core.runtime import place
from grpo_core.stages.common import code_version, digest_dir, set_threads, write_manifest
from grpo_core.stages.grpo import run_grpo
from grpo_core.stages.prepare import run_prepare
from grpo_core.stages.reward_data import run_reward_data
from grpo_core.stages.reward_model import run_reward_model
from grpo_core.stages.sft import run_sft
from tasks.launch import run_launched
from tasks.tracking import child_run

# Which config sections decide each stage's output (besides its upstream digests).
STAGE_SECTIONS = {
    "data": ("seed", "data"),
    "corpus": ("seed", "corpus"),
    "pretrain": ("seed", "model", "pretrain"),
    "sft": ("seed", "model", "sft", "eval.max_new_tokens"),
    "reward_data": ("seed", "reward_data"),
    "replay": (),
    # rounds.replay_fraction enters through the upstream ``replay`` of rounds that have a history.
    "orm": ("seed", "orm", "reward_data.step_separator"),
    "prm": ("seed", "prm", "reward_data.step_separator"),
    "grpo": ("seed", "grpo", "eval.max_new_tokens", "reward_data.step_separator"),
    "eval": ("eval",),
}


def _select(cfg: PipelineConfig, keys: tuple[str, ...]) -> dict[str, Any]:
    dumped = cfg.model_dump(mode="json")
    out = {}
    for key in keys:
        node: Any = dumped
        for part in key.split("."):
            node = node[part]
        out[key] = node
    return out


def stage_key(stage: str, cfg: PipelineConfig, upstream: dict[str, Any], out_dir: Path) -> str:
    payload = {"stage": stage, "config": _select(cfg, STAGE_SECTIONS[stage]), "upstream": upstream,
               "code": code_version(), "out": str(out_dir.resolve())}
    return f"{stage}-{hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()}"


def run_stage(stage_task, cfg: PipelineConfig, out_dir: str, upstream: dict | None = None,
              **kwargs) -> tuple[dict, bool]:
    """Run a stage task; returns its manifest and whether it came from the cache.

    A cached result is trusted only while the outputs on disk are the ones it describes: the
    manifest must exist and carry the same cache key (another recipe under the same run name may
    have overwritten the folder). Otherwise the task runs again, resuming from its checkpoints,
    and refreshes the cache entry.
    """
    upstream = upstream or {}
    key = stage_key(stage_task.name, cfg, upstream, Path(out_dir))
    manifest_path = Path(out_dir) / "manifest.json"
    on_disk = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    refresh = on_disk.get("cache_key") != key
    extra = {"upstream": upstream} if upstream else {}
    state = stage_task.with_options(refresh_cache=refresh)(
        cfg=cfg, out_dir=out_dir, return_state=True, **extra, **kwargs)
    return state.result(), state.name == "Cached"


def grpo_upstream(data: dict, init: dict, reward_models: dict[str, str], reward_digests: dict[str, str],
                  round_: int = 1) -> dict:
    """What a GRPO stage starts from: the data, the policy (``init``'s model and digest: the SFT model
    in round 1), the reward models it uses (only those: retraining an unused one must not
    invalidate it) and its RL round."""
    return {"data_dir": data["dir"], "data": data["digest"], "init_model": init["model"], "init": init["digest"],
            "reward_models": reward_models, "reward_digests": reward_digests, "round": round_}


def _cache_key(stage: str):
    def key_fn(context, parameters: dict[str, Any]) -> str:
        return stage_key(stage, parameters["cfg"], parameters.get("upstream", {}), Path(parameters["out_dir"]))
    return key_fn


def _finish(stage: str, cfg: PipelineConfig, out_dir: str, upstream: dict, manifest: dict, run_id: str) -> dict:
    """Record what identifies the outputs (digest, cache key, MLflow run) in the stage manifest."""
    if "model" in manifest:
        manifest["digest"] = digest_dir(Path(manifest["model"]))
    manifest["mlflow_run_id"] = run_id
    manifest["cache_key"] = stage_key(stage, cfg, upstream, Path(out_dir))
    return write_manifest(Path(out_dir), manifest)


def _stage_params(cfg: PipelineConfig, stage: str) -> dict[str, str]:
    return {k: v for k, v in flatten(cfg).items() if any(k == s or k.startswith(s + ".") for s in STAGE_SECTIONS[stage])}


@task(name="data", cache_key_fn=_cache_key("data"), persist_result=True)
def data_task(cfg: PipelineConfig, out_dir: str, uri: str, parent_id: str) -> dict:
    with child_run(uri, parent_id, "data", _stage_params(cfg, "data")) as log:
        manifest = run_prepare(cfg, Path(out_dir))
        log.log_metrics({k: v for k, v in manifest.items() if k.startswith("n_")})
        return _finish("data", cfg, out_dir, {}, manifest, log.run_id)


@task(name="sft", cache_key_fn=_cache_key("sft"), persist_result=True)
def sft_task(cfg: PipelineConfig, out_dir: str, upstream: dict, uri: str, parent_id: str) -> dict:
    with child_run(uri, parent_id, "sft", _stage_params(cfg, "sft")) as log:
        if cfg.launch.distributed:
            init = upstream.get("init_model")
            manifest = run_launched("sft", cfg, out_dir, ["--data", upstream["data_dir"], "--out", out_dir,
                                                          *(["--init", init] if init else [])], uri, log.run_id)
        else:
            manifest = run_sft(cfg, Path(upstream["data_dir"]), Path(out_dir), log, init_from=upstream.get("init_model"))
        return _finish("sft", cfg, out_dir, upstream, manifest, log.run_id)


@task(name="pretrain", cache_key_fn=_cache_key("pretrain"), persist_result=True)
def pretrain_task(cfg: PipelineConfig, out_dir: str, upstream: dict, uri: str, parent_id: str) -> dict:
    from grpo_core.stages.pretrain import run_pretrain

    with child_run(uri, parent_id, "pretrain", _stage_params(cfg, "pretrain")) as log:
        if cfg.launch.distributed:
            manifest = run_launched("pretrain", cfg, out_dir, ["--corpus", upstream["corpus_dir"], "--out", out_dir],
                                    uri, log.run_id)
        else:
            manifest = run_pretrain(cfg, Path(upstream["corpus_dir"]), Path(out_dir), log)
        return _finish("pretrain", cfg, out_dir, upstream, manifest, log.run_id)


@task(name="reward_data", cache_key_fn=_cache_key("reward_data"), persist_result=True)
def reward_data_task(cfg: PipelineConfig, out_dir: str, upstream: dict, uri: str, parent_id: str) -> dict:
    with child_run(uri, parent_id, "reward_data", _stage_params(cfg, "reward_data")) as log:
        manifest = run_reward_data(cfg, Path(upstream["data_dir"]), upstream["policy"], Path(out_dir), log,
                                   round_=upstream.get("round", 1),
                                   rollouts=(upstream.get("rollouts") or {}).get("dir"))
        return _finish("reward_data", cfg, out_dir, upstream, manifest, log.run_id)


def _reward_model_task(kind: str):
    @task(name=kind, cache_key_fn=_cache_key(kind), persist_result=True)
    def train(cfg: PipelineConfig, out_dir: str, upstream: dict, uri: str, parent_id: str) -> dict:
        with child_run(uri, parent_id, kind, _stage_params(cfg, kind)) as log:
            if cfg.launch.distributed:
                datasets = Path(out_dir) / "reward_data.json"
                datasets.parent.mkdir(parents=True, exist_ok=True)
                datasets.write_text(json.dumps(upstream["reward_data"]))
                replay = upstream.get("replay") or {"round": 1, "dir": None}
                manifest = run_launched(kind, cfg, out_dir, [
                    "--reward-data", str(datasets), "--init", upstream["init_model"], "--out", out_dir,
                    "--round", str(replay["round"]), *(["--replay", replay["dir"]] if replay["dir"] else [])],
                    uri, log.run_id)
            else:
                manifest = run_reward_model(cfg, kind, upstream["reward_data"], upstream["init_model"], Path(out_dir),
                                            log, replay=upstream.get("replay"))
            return _finish(kind, cfg, out_dir, upstream, manifest, log.run_id)
    return train


orm_task = _reward_model_task("orm")
prm_task = _reward_model_task("prm")


@task(name="replay", cache_key_fn=_cache_key("replay"), persist_result=True)
def replay_task(cfg: PipelineConfig, out_dir: str, upstream: dict, uri: str, parent_id: str) -> dict:
    """Replay buffer version k: version k-1 plus round k's fresh training rows (outcome pairs, steps)."""
    from datasets import load_from_disk

    from grpo_core.replay import KINDS, write_version
    from grpo_core.stages.reward_data import COLUMNS

    with child_run(uri, parent_id, "replay") as log:
        fresh = {kind: load_from_disk(upstream["reward_data"][f"{kind}_dir"])["train"].to_list() for kind in KINDS}
        previous = upstream["previous"]["dir"] if upstream["previous"] else None
        contents = write_version(previous, fresh, upstream["round"], Path(out_dir), COLUMNS)
        digest = digest_dir(Path(out_dir), "*.arrow")
        for kind, c in contents.items():
            log.log_input(name=f"replay/{Path(out_dir).name}/{kind}", digest=digest, source=str(Path(out_dir) / kind),
                          rows={"total": c["rows"], **{f"from_round_{r}": n for r, n in c["by_round"].items()}})
            log.log_metrics({f"buffer/{kind}_rows": c["rows"]})
        manifest = {"stage": "replay", "dir": out_dir, "round": upstream["round"], "contents": contents,
                    "digest": digest}
        return _finish("replay", cfg, out_dir, upstream, manifest, log.run_id)


@task(name="grpo", cache_key_fn=_cache_key("grpo"), persist_result=True)
def grpo_task(cfg: PipelineConfig, out_dir: str, upstream: dict, uri: str, parent_id: str) -> dict:
    with child_run(uri, parent_id, "grpo", _stage_params(cfg, "grpo")) as log:
        if cfg.launch.distributed:
            models = [arg for kind, path in (upstream.get("reward_models") or {}).items() for arg in (f"--{kind}", path)]
            manifest = run_launched("grpo", cfg, out_dir, ["--data", upstream["data_dir"], "--init", upstream["init_model"],
                                                           "--out", out_dir, "--round", str(upstream.get("round", 1)),
                                                           *models], uri, log.run_id)
        else:
            manifest = run_grpo(cfg, Path(upstream["data_dir"]), upstream["init_model"], Path(out_dir), log,
                                reward_models=upstream.get("reward_models"), round_=upstream.get("round", 1))
        return _finish("grpo", cfg, out_dir, upstream, manifest, log.run_id)


@task(name="eval", cache_key_fn=_cache_key("eval"), persist_result=True)
def eval_task(cfg: PipelineConfig, out_dir: str, upstream: dict, uri: str, parent_id: str) -> dict:
    """Greedy pass@1 (and maj@K / pass@K) of every model in ``upstream['models']`` on the test split."""
    ec = cfg.eval
    set_threads(cfg.threads)
    test = load_jsonl(str(Path(upstream["data_dir"]) / "test.jsonl"), limit=ec.n_questions)
    results: dict[str, dict] = {}
    with child_run(uri, parent_id, "eval", _stage_params(cfg, "eval")) as log:
        for name, model_dir in upstream["models"].items():
            model, tokenizer = load_model(model_dir)
            place(model, cfg.launch)
            metrics, rows = evaluate(model, tokenizer, test, max_new_tokens=ec.max_new_tokens,
                                     batch_size=ec.batch_size, samples=ec.samples,
                                     temperature=ec.temperature, seed=cfg.seed)
            # Per-question greedy correctness, for paired differences between models (grpo_core.stats).
            per_question = Path(out_dir) / "per_question" / f"{name}.json"
            per_question.parent.mkdir(parents=True, exist_ok=True)
            per_question.write_text(json.dumps([int(r["correct"]) for r in rows]))
            results[name] = {**metrics, "model": model_dir, "per_question": str(per_question)}
            log.log_metrics({f"eval/{name}/{k}": v for k, v in metrics.items()})
            log.log_table(rows[: ec.log_examples], f"eval/{name}_samples.json")
        return _finish("eval", cfg, out_dir, upstream, {"stage": "eval", "results": results}, log.run_id)

"""The ``pipeline`` flow: data -> SFT -> [reward data -> ORM / PRM] -> GRPO -> evaluation of the SFT
model and the final policy.

One MLflow parent run per pipeline run (child runs per stage); ``runs/<run_name>/manifest.json``
is the public summary (GUIDE §3): policy, sft_model, eval, mlflow_run_id, tracking_uri.
"""
from __future__ import annotations

import json

import yaml
from prefect import flow, get_run_logger

from grpo_core.config import PipelineConfig, flatten
from grpo_core.stages.common import write_manifest
from grpo_core.tracking import MlflowLogger
from tasks.stages import (data_task, eval_task, grpo_task, grpo_upstream, orm_task, prm_task, reward_data_task,
                         run_stage, sft_task)
from tasks.tracking import end_run, experiment_id, redact, start_run, tracking_uri


def reward_model_stages(config: PipelineConfig, run_dir, data: dict, sft: dict, common: dict) -> dict:
    """reward_data, then the ORM and / or PRM the recipe trains: {stage: (manifest, cached)}."""
    wanted = [k for k in ("orm", "prm") if getattr(config, k).train]
    if not wanted:
        return {}
    out = {"reward_data": run_stage(reward_data_task, out_dir=str(run_dir / "reward_data"),
                                    upstream={"data_dir": data["dir"], "data": data["digest"],
                                              "policy": sft["model"], "init": sft["digest"]}, **common)}
    rd = out["reward_data"][0]
    datasets = {k: v for k, v in rd.items() if k.endswith(("_dir", "_digest")) and k != "dir"}
    for kind in wanted:
        out[kind] = run_stage(orm_task if kind == "orm" else prm_task, out_dir=str(run_dir / kind),
                              upstream={"reward_data": datasets, "init_model": sft["model"],
                                        "init": sft["digest"]}, **common)
    return out


@flow(name="pipeline", log_prints=True)
def pipeline(config: PipelineConfig) -> dict:
    log = get_run_logger()
    run_dir = config.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    uri = tracking_uri(config)
    parent = start_run(uri, experiment_id(uri, config.tracking.experiment), config.run_name,
                       tags={"pipeline": "deepseekmath-grpo"})
    common = {"cfg": config, "uri": uri, "parent_id": parent}
    try:
        tracker = MlflowLogger(uri, parent)
        params = flatten(config)
        params["tracking.tracking_uri"] = redact(params["tracking.tracking_uri"])
        tracker.log_params(params)
        data, data_hit = run_stage(data_task, out_dir=str(run_dir / "data"), **common)
        sft, sft_hit = run_stage(sft_task, out_dir=str(run_dir / "sft"),
                                 upstream={"data_dir": data["dir"], "data": data["digest"]}, **common)
        reward_stages = reward_model_stages(config, run_dir, data, sft, common)
        reward_models = {k: m["model"] for k, (m, _) in reward_stages.items() if k in ("orm", "prm")}
        used = config.grpo.reward_models_used
        grpo, grpo_hit = run_stage(grpo_task, out_dir=str(run_dir / "grpo"),
                                   upstream=grpo_upstream(data, sft, {k: reward_models[k] for k in used},
                                                          {k: reward_stages[k][0]["digest"] for k in used}),
                                   **common)
        ev, eval_hit = run_stage(eval_task, out_dir=str(run_dir / "eval"),
                                 upstream={"data_dir": data["dir"], "data": data["digest"],
                                           "models": {"sft": sft["model"], "policy": grpo["model"]},
                                           "digests": [sft["digest"], grpo["digest"]]}, **common)
        hits = [("data", data_hit), ("sft", sft_hit), *((k, hit) for k, (_, hit) in reward_stages.items()),
                ("grpo", grpo_hit), ("eval", eval_hit)]
        cached = [name for name, hit in hits if hit]
        stages = {"data": data, "sft": sft, **{k: m for k, (m, _) in reward_stages.items()}, "grpo": grpo}
        eval_results = ev["results"]
        tracker.log_metrics({f"eval/{name}/accuracy": r["accuracy"] for name, r in eval_results.items()})
        tracker.set_tags({"cached_stages": ",".join(cached) or "none",
                          **{f"stage_run.{s}": m["mlflow_run_id"] for s, m in {**stages, "eval": ev}.items()}})
        tracker.log_artifacts(grpo["model"], "policy")
        manifest = {
            "run_name": config.run_name,
            "policy": grpo["model"],
            "sft_model": sft["model"],
            "data_dir": data["dir"],
            "eval": eval_results,
            "reward_models": reward_models,
            "stages": stages,
            "cached_stages": cached,
            "mlflow_run_id": parent,
            "tracking_uri": redact(uri),
            "experiment": config.tracking.experiment,
        }
        # The resolved recipe goes beside the manifest it produced (``baseline`` reads both).
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        write_manifest(run_dir, manifest)
    except BaseException:
        end_run(uri, parent, "FAILED")
        raise
    end_run(uri, parent, "FINISHED")
    log.info("pipeline %s finished: %s", config.run_name,
             json.dumps({k: round(v["accuracy"], 4) for k, v in eval_results.items()}))
    return manifest

"""The ``compare`` flow: GRPO reward variants from one finished run's SFT checkpoint, side by side
(the first RL round: its reward models were trained on the SFT model's samples).

Variants: the rule reward (answer checker), ORM outcome supervision and PRM process supervision,
each with the recipe's GRPO settings and budget, evaluated on the same test questions. A variant
whose GRPO settings equal the run's own reuses its finished GRPO stage. The table goes to an MLflow
run (``compare-<run_name>``, child runs per stage) and to a Prefect table artifact.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from grpo_core.config import PipelineConfig
from grpo_core.stages.common import write_manifest
from grpo_core.tracking import MlflowLogger
from tasks.stages import eval_task, grpo_task, grpo_upstream, run_stage
from tasks.tracking import end_run, experiment_id, start_run, tracking_uri

VARIANTS = {
    "rule-outcome": {"reward_weights": {"rule": 1.0}, "supervision": "outcome"},
    "orm-outcome": {"reward_weights": {"orm": 1.0}, "supervision": "outcome"},
    "prm-process": {"reward_weights": {"prm": 1.0}, "supervision": "process"},
}


def variant_config(cfg: PipelineConfig, grpo_update: dict) -> PipelineConfig:
    grpo = cfg.grpo.model_validate({**cfg.grpo.model_dump(), **grpo_update})
    return cfg.model_copy(update={"grpo": grpo})


def reward_model_metric(first_round: dict, uses: tuple[str, ...]) -> str:
    """The held-out quality of the reward model a variant trains on, as a short string."""
    if "orm" in uses:
        return f"ORM pairwise acc {first_round['orm']['heldout'].get('pairwise_accuracy', float('nan')):.3f}"
    if "prm" in uses:
        return f"PRM step AUC {first_round['prm']['heldout'].get('step_auc', float('nan')):.3f}"
    return "exact checker"


@flow(name="compare")
def compare(run_dir: str, variants: list[str] | None = None) -> list[dict]:
    log = get_run_logger()
    root = Path(run_dir).resolve()
    manifest = json.loads((root / "manifest.json").read_text())
    cfg = PipelineConfig.model_validate(yaml.safe_load((root / "config.yaml").read_text()))
    uri = tracking_uri(cfg)
    parent = start_run(uri, experiment_id(uri, cfg.tracking.experiment), f"compare-{cfg.run_name}",
                       tags={"pipeline": "deepseekmath-grpo", "compare_of": manifest["mlflow_run_id"]})
    common = {"uri": uri, "parent_id": parent}
    rows: list[dict] = []
    try:
        data = manifest["stages"]["data"]
        sft = manifest["stages"]["sft"]
        first = manifest["rounds"][0]["stages"]  # round 1: GRPO and reward models from the SFT model
        models, digests = {"sft": sft["model"]}, {"sft": sft["digest"]}
        names = variants or list(VARIANTS)
        for name in names:
            vcfg = variant_config(cfg, VARIANTS[name])
            uses = vcfg.grpo.reward_models_used
            missing = [k for k in uses if k not in first]
            if missing:
                log.warning("skipping %s: the run trained no %s", name, ", ".join(missing))
                continue
            if vcfg.grpo == cfg.grpo:
                grpo = first["grpo"]
            else:
                grpo, _ = run_stage(grpo_task, cfg=vcfg, out_dir=str(root / "compare" / name),
                                    upstream=grpo_upstream(data, sft, {k: first[k]["model"] for k in uses},
                                                           {k: first[k]["digest"] for k in uses}),
                                    **common)
            models[name], digests[name] = grpo["model"], grpo["digest"]
            rows.append({"variant": name, "reward_model": reward_model_metric(first, uses),
                         "grpo_steps": grpo["steps"], "grpo_wall_s": grpo["wall_s"],
                         "best_val_accuracy": round(grpo["best_val_accuracy"], 4)})
        ev, _ = run_stage(eval_task, cfg=cfg, out_dir=str(root / "compare" / "eval"),
                          upstream={"data_dir": data["dir"], "data": data["digest"], "models": models,
                                    "digests": digests}, **common)
        results = ev["results"]
        for row in rows:
            row["test_accuracy"] = round(results[row["variant"]]["accuracy"], 4)
            row["gain_over_sft"] = round(results[row["variant"]]["accuracy"] - results["sft"]["accuracy"], 4)
        rows.insert(0, {"variant": "sft", "reward_model": "-", "grpo_steps": 0, "grpo_wall_s": 0.0,
                        "best_val_accuracy": round(sft["best_val_accuracy"], 4),
                        "test_accuracy": round(results["sft"]["accuracy"], 4), "gain_over_sft": 0.0})
        tracker = MlflowLogger(uri, parent)
        tracker.log_table(rows, "comparison.json")
        tracker.log_metrics({f"compare/{r['variant']}/test_accuracy": r["test_accuracy"] for r in rows})
        create_table_artifact(key=f"compare-{cfg.run_name}".lower().replace("_", "-").replace(".", "-"),
                              table=rows, description=f"GRPO reward variants from {root} (MLflow run {parent})")
        write_manifest(root / "compare", {"rows": rows, "mlflow_run_id": parent})
    except BaseException:
        end_run(uri, parent, "FAILED")
        raise
    end_run(uri, parent, "FINISHED")
    log.info("comparison:\n%s", format_table(rows))
    return rows


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the comparison rows."""
    cols = ["variant", "test_accuracy", "gain_over_sft", "best_val_accuracy", "reward_model", "grpo_steps", "grpo_wall_s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)

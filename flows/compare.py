"""The ``compare`` flow: RL variants from one finished run's SFT checkpoint, several seeds each, side
by side with the no-RL baseline (the first RL round: its reward models were trained on the SFT
model's samples).

Variants (``VARIANTS``; by default ``DEFAULT_VARIANTS``): SFT continued on its worked solutions for
the time the run's round-1 GRPO took (the honest baseline: what a user without RL would do with the
compute), and GRPO with the rule reward (answer checker), ORM outcome supervision, PRM process
supervision, and the rule reward plus PRM process supervision (the exact outcome with dense step
credit); on request the paper's §5 algorithms on the rule reward: ``rft``, ``online-rft``, ``ppo``. Every variant gets the recipe's settings and
budget (``grpo.max_seconds`` / ``grpo.steps``), once per seed, and
is evaluated on the same test questions. Seed s of every variant is the recipe's seed + s; seed 0 of
a GRPO variant whose settings equal the run's own reuses its finished round-1 GRPO stage.

Reported per variant: test accuracy mean ± std over seeds, and the paired difference (seed by seed,
same questions) to the SFT model and to continued SFT with a 95% Student-t interval over seeds
(``grpo_core.stats``). The table goes to an MLflow run (``compare-<run_name>``, child runs per stage),
a Prefect table artifact and ``runs/<run>/compare/manifest.json``.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from flows import artifact_key, numbered_run_name, parameter
from grpo_core.config import PipelineConfig
from grpo_core.stages.common import write_manifest
from grpo_core.stages.sft import continued
from grpo_core.stats import mean_std, seed_interval
from grpo_core.tracking import MlflowLogger
from grpo_core.stages.inputs import EvalInputs, GRPOInputs, Ref, SFTInputs
from tasks.stage_tasks import eval_task, grpo_task, run_stage, sft_task
from grpo_core.tracking import experiment_id, finishing, start_run, tracking_uri

BASELINE = "continued-sft"
RULE = {"reward_weights": {"rule": 1.0}, "supervision": "outcome"}
VARIANTS = {
    BASELINE: None,
    "rule-outcome": RULE,
    "orm-outcome": {"reward_weights": {"orm": 1.0}, "supervision": "outcome"},
    "prm-process": {"reward_weights": {"prm": 1.0}, "supervision": "process"},
    "prm-process-min-credit": {"reward_weights": {"prm": 1.0}, "supervision": "process", "process_credit": "min"},
    "rule+prm-process": {"reward_weights": {"rule": 1.0, "prm": 1.0}, "supervision": "process"},
    # The paper's §5 algorithms on the same reward (``--variants continued-sft,rft,online-rft,ppo,rule-outcome``).
    "rft": {**RULE, "algorithm": "rft"},
    "online-rft": {**RULE, "algorithm": "online_rft"},
    "ppo": {**RULE, "algorithm": "ppo"},
}
DEFAULT_VARIANTS = (BASELINE, "rule-outcome", "orm-outcome", "prm-process", "rule+prm-process")


def variant_config(cfg: PipelineConfig, grpo_update: dict | None, seed: int, seconds: float) -> PipelineConfig:
    """The recipe for one (variant, seed); continued SFT (``grpo_update`` None) runs the recipe's SFT
    schedule from the SFT model for ``seconds`` (the run's round-1 GRPO time), without early stopping,
    from ``cfg.sft.lr`` (the flows set it to the lr the SFT stage ended with: ``sft.continued``)."""
    if grpo_update is None:
        sft = cfg.sft.model_copy(update={"max_seconds": seconds, "max_steps": 10**9, "patience": 0})
        return cfg.model_copy(update={"sft": sft, "seed": seed})
    grpo = cfg.grpo.model_validate({**cfg.grpo.model_dump(), **grpo_update})
    return cfg.model_copy(update={"grpo": grpo, "seed": seed})


def reward_model_metric(first_round: dict, uses: tuple[str, ...]) -> str:
    """The held-out quality of the reward models a variant trains on, as a short string."""
    parts = []
    for kind, pooled, name in (("orm", "auc", "AUC"), ("prm", "step_auc", "step AUC")):
        if kind in uses:
            held_out = first_round[kind]["heldout"]
            parts.append(f"{kind.upper()} within-question AUC {held_out.get('within_question_auc', float('nan')):.3f} "
                         f"(pooled {name} {held_out.get(pooled, float('nan')):.3f})")
    return ", ".join(parts) or "-"


def summarise(name: str, accs: list[float], sft_acc: float, baseline: list[float] | None) -> dict:
    """A table row: accuracy over seeds, and the paired differences to SFT and to continued SFT."""
    mean, std = mean_std(accs)
    row = {"variant": name, "seeds": len(accs), "test_accuracy_mean": round(mean, 4), "test_accuracy_std": round(std, 4)}
    for label, ref in (("sft", [sft_acc] * len(accs)), (BASELINE, baseline)):
        if ref is None or name in ("sft", label) or len(ref) != len(accs):
            continue
        d = seed_interval(accs, ref)
        row[f"gain_over_{label}"] = round(d["mean"], 4)
        row[f"gain_over_{label}_95ci"] = [round(d["low"], 4), round(d["high"], 4)]
    return row


def finished_run(run_dir: str, flow_name: str, variants: list[str] | None, known) -> tuple[Path, dict, PipelineConfig]:
    """The run a ``compare`` or ``study`` starts from: its folder, manifest and recipe, with ``sft.lr``
    at the lr its SFT stage ended with (continued SFT goes on from there); unknown variants fail here."""
    unknown = [v for v in variants or () if v not in known]
    if unknown:
        raise ValueError(f"unknown {flow_name} variant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    root = Path(run_dir).resolve()
    manifest = json.loads((root / "manifest.json").read_text())
    cfg = PipelineConfig.model_validate(yaml.safe_load((root / "config.yaml").read_text()))
    return root, manifest, continued(cfg, manifest["stages"]["sft"])


@flow(name="compare", flow_run_name=lambda: numbered_run_name(f"compare-{Path(parameter('run_dir')).name}"))
def compare(run_dir: str, variants: list[str] | None = None, seeds: int = 3, samples: int = 1) -> list[dict]:
    """``samples`` K > 1: every model's maj@K and pass@K on the test questions too (the paper's
    Figure 7 question: does RL raise Maj@K and leave Pass@K flat?)."""
    log = get_run_logger()
    root, manifest, cfg = finished_run(run_dir, "compare", variants, VARIANTS)
    uri = tracking_uri(cfg)
    parent = start_run(uri, experiment_id(uri, cfg.tracking.experiment), f"compare-{cfg.run_name}",
                       tags={"pipeline": "deepseekmath-grpo", "compare_of": manifest["mlflow_run_id"]})
    common = {"uri": uri, "parent_id": parent}
    with finishing(uri, [parent]):
        data = Ref.folder(manifest["stages"]["data"])
        sft = Ref.model(manifest["stages"]["sft"])
        first = manifest["rounds"][0]["stages"]  # round 1: GRPO and reward models from the SFT model
        models, runs = {"sft": sft}, {}
        for name in variants or DEFAULT_VARIANTS:
            update = VARIANTS[name]
            uses = () if update is None else variant_config(cfg, update, cfg.seed, 0).grpo.reward_models_used
            missing = [k for k in uses if k not in first]
            if missing:
                log.warning("skipping %s: the run trained no %s", name, ", ".join(missing))
                continue
            runs[name] = []
            for s in range(seeds):
                vcfg = variant_config(cfg, update, cfg.seed + s, first["grpo"]["wall_s"])
                out = str(root / "compare" / name / f"seed-{s}")
                if update is None:
                    stage = run_stage(sft_task, vcfg, out, SFTInputs(data=data, init=sft), **common).manifest
                elif s == 0 and vcfg.grpo == cfg.grpo:
                    stage = first["grpo"]
                else:
                    stage = run_stage(grpo_task, vcfg, out, GRPOInputs(
                        data=data, init=sft, reward_models={k: Ref.model(first[k]) for k in uses}), **common).manifest
                models[f"{name}/seed-{s}"] = Ref.model(stage)
                runs[name].append({"seed": vcfg.seed, "wall_s": stage["wall_s"], "steps": stage["steps"],
                                   "reward_model": reward_model_metric(first, uses)})
        ecfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"samples": samples})})
        ev = run_stage(eval_task, ecfg, str(root / "compare" / "eval"), EvalInputs(data=data, models=models),
                       **common).manifest
        results = ev["results"]
        sft_acc = results["sft"]["accuracy"]
        accs = {name: [results[f"{name}/seed-{s}"]["accuracy"] for s in range(len(r))] for name, r in runs.items()}
        def sampled(name: str, n: int) -> dict:  # maj@K / pass@K, mean over the seeds
            keys = [k for k in (f"maj@{samples}", f"pass@{samples}") if samples > 1]
            per = [results[name if name == "sft" else f"{name}/seed-{s}"] for s in range(n)]
            return {f"{k}_mean": round(mean_std([p[k] for p in per])[0], 4) for k in keys}

        rows = [summarise("sft", [sft_acc], sft_acc, None) | sampled("sft", 1)]
        for name, r in runs.items():
            rows.append({**summarise(name, accs[name], sft_acc, accs.get(BASELINE)), **sampled(name, len(r)),
                         "reward_model": r[0]["reward_model"], "steps_mean": mean_std([x["steps"] for x in r])[0],
                         "wall_s_mean": round(mean_std([x["wall_s"] for x in r])[0], 1),
                         "per_seed": [round(a, 4) for a in accs[name]]})
        tracker = MlflowLogger(uri, parent)
        tracker.log_table(rows, "comparison.json")
        tracker.log_metrics({f"compare/{r['variant']}/test_accuracy_mean": r["test_accuracy_mean"] for r in rows})
        create_table_artifact(key=artifact_key(f"compare-{cfg.run_name}"),
                              table=[{k: str(v) for k, v in r.items()} for r in rows],
                              description=f"RL variants from {root}, {seeds} seed(s) each (MLflow run {parent})")
        write_manifest(root / "compare", {"rows": rows, "runs": runs, "n_test": results["sft"]["n"],
                                          "mlflow_run_id": parent})
    log.info("comparison:\n%s", format_table(rows))
    return rows


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the comparison rows (accuracies and gains in points)."""
    def pts(x: float) -> str:
        return f"{100 * x:+.1f}"

    lines = ["| variant | seeds | test accuracy (mean ± std) | vs SFT (95% CI) | vs continued SFT (95% CI) | reward model |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        gains = []
        for label in ("sft", BASELINE):
            if f"gain_over_{label}" in r:
                low, high = r[f"gain_over_{label}_95ci"]
                gains.append(f"{pts(r[f'gain_over_{label}'])} [{pts(low)}, {pts(high)}]")
            else:
                gains.append("-")
        lines.append(f"| {r['variant']} | {r['seeds']} | {100 * r['test_accuracy_mean']:.1f} ± "
                     f"{100 * r['test_accuracy_std']:.1f} | {gains[0]} | {gains[1]} | {r.get('reward_model', '-')} |")
    return "\n".join(lines)

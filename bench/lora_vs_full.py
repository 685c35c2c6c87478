"""Full fine-tuning against LoRA on the real model, on this machine: the same SFT steps of
``configs/smollm2-cpu.yaml`` (SmolLM2-135M on ASDiv's worked solutions) each way, each in a process of
its own, reporting seconds a step, the process's peak resident memory and the greedy accuracy on the
recipe's validation questions (MAWPS) after those steps. LoRA: rank 16 on every linear layer, its lr
10x full fine-tuning's (configs/demo-lora.yaml's ratio). The last line is one JSON object.

    python bench/lora_vs_full.py [--steps 10] [--model models/smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = {
    "full": [],
    "lora": ["sft.lora.rank=16", "sft.lora.alpha=32", "sft.lr=5.0e-4", "sft.min_lr=5.0e-5"],
}


def one(mode: str, steps: int, model: str, out: Path) -> dict:
    """SFT for ``steps`` steps in this process; what it measured."""
    from grpo_core.lm.runtime import peak_memory
    from grpo_core.recipe import load_config
    from grpo_core.stages.prepare import run_prepare
    from grpo_core.stages.sft import run_sft

    cfg = load_config(
        ROOT / "configs" / "smollm2-cpu.yaml",
        [
            f"model.path={model}",
            f"output_dir={out}",
            f"sft.max_steps={steps}",
            f"sft.eval_every={steps}",
            f"sft.checkpoint_every={steps}",
            *MODES[mode],
        ],
    )
    run_prepare(cfg, out / "data")
    sft = run_sft(cfg, out / "data", out / "sft")
    return {
        "mode": mode,
        "steps": sft["steps"],
        "step_s": round(sft["train_s"] / sft["steps"], 2),
        "peak_rss_mib": peak_memory()["rss_mib"],
        "val_accuracy": sft["curve"][-1]["val/accuracy"],
        "n_val": cfg.data.benchmark.n_val,
        "lr": cfg.sft.lr,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--one", choices=sorted(MODES), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.steps, args.model, args.out)))
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:  # one after the other: two processes on two cores would time each other
            command = [
                sys.executable,
                __file__,
                "--one",
                mode,
                "--steps",
                str(args.steps),
                "--model",
                args.model,
                "--out",
                str(Path(tmp) / mode),
            ]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(results[mode]), flush=True)
    full, lora = results["full"], results["lora"]
    print(
        json.dumps(
            {
                **results,
                "lora_over_full": {
                    "step_s": round(lora["step_s"] / full["step_s"], 3),
                    "peak_rss_mib": round(lora["peak_rss_mib"] / full["peak_rss_mib"], 3),
                },
            }
        )
    )


if __name__ == "__main__":
    main()

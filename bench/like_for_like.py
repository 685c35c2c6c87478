"""Our GRPO step against TRL's, like for like, at several completion lengths: the same prompts,
number of samples, lengths, precision and passes (sampling, one no-grad reference pass, one
forward/backward), on a model whose weights are freshly initialised so that every completion on
every side runs to the length (``grpo_step.py --fresh``). Six implementations, each in its own
process, alternating:

    ours                          every activation kept, each prompt computed once per group
    ours-unshared                 every activation kept, every row's prompt computed in the log-prob
                                  passes (as TRL does; sampling's prefill is shared on every ours)
    ours-checkpointing            each layer recomputed in backward, each prompt once
    ours-unshared-checkpointing   each layer recomputed, every row's prompt
    trl                           TRL 1.16 GRPOTrainer as configured by default (each layer recomputed)
    trl-no-checkpointing          TRL keeping every activation

    .venv/bin/python bench/like_for_like.py --model models/smollm2-135m-instruct --prompts FILE.jsonl \\
        --lengths 32,256,512 --prompts-per-step 2 --group 4 --steps 2 --warmup 1 --rounds 3 --threads 2

Prints one JSON object: ``grpo_step.py --compare``'s result at each length (``by_length``) and the
table a reader looks at (``table``: per length and implementation, median step seconds, peak memory,
time and memory over TRL's default, each phase's median seconds). TRL needs ``pip install trl==1.16.0``
(the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

STEP = Path(__file__).resolve().with_name("grpo_step.py")
NAMES = ("ours", "ours-unshared", "ours-checkpointing", "ours-unshared-checkpointing", "trl", "trl-no-checkpointing")


def table(by_length: dict[str, dict], names: list[str], memory: str) -> list[dict]:
    """One row per length and implementation: its seconds, memory and phases, and both against TRL's
    default at that length (None where TRL did not run)."""
    rows = []
    for length, result in by_length.items():
        trl = result.get("trl")
        for name in names:
            r = result[name]
            rows.append(
                {
                    "max_new_tokens": int(length),
                    "implementation": name,
                    "median_step_s": r["median_step_s"],
                    "completion_tokens_per_step": r["median_completion_tokens"],
                    memory: r.get(memory),
                    "time_over_trl": round(r["median_step_s"] / trl["median_step_s"], 3) if trl else None,
                    "memory_over_trl": round(r[memory] / trl[memory], 3) if trl and memory in r else None,
                    "median_parts_s": r.get("median_parts_s"),
                }
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="32,256,512", help="comma-separated completion lengths")
    p.add_argument("--only", default=",".join(NAMES), help="comma-separated grpo_step.py workers (default: the six)")
    a, rest = p.parse_known_args()
    if owned := {"--max-new", "--compare", "--fresh", "--json"} & {arg.split("=")[0] for arg in rest}:
        raise SystemExit(f"{', '.join(sorted(owned))}: set by like_for_like.py itself (--lengths for --max-new)")
    by_length: dict[str, dict] = {}
    for length in a.lengths.split(","):
        cmd = [sys.executable, str(STEP), "--compare", "--json", "--fresh", "--only", a.only, "--max-new", length]
        cmd += rest
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # its workers' lines pass on to stderr
        if done.returncode:
            raise SystemExit(f"grpo_step.py at {length} tokens exited {done.returncode} (its error above)")
        by_length[length] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps({"length": length, **by_length[length]}), file=sys.stderr, flush=True)  # kept if stopped
    memory = "peak_cuda_mib" if next(iter(by_length.values()))["device"] == "cuda" else "peak_rss_over_start_mib"
    print(json.dumps({"memory": memory, "table": table(by_length, a.only.split(","), memory), "by_length": by_length}))


if __name__ == "__main__":
    main()

"""The decode loop on a GPU: the eager loop (``decode``), the same step with static shapes, and that
step replayed as a CUDA graph (``decode.StaticStep``), on randomly initialised Llamas of the demo's
shape and SmolLM2-135M's (no files needed), in fp32, under bf16 autocast, and with bf16 weights (a
bf16 copy of the model, no autocast: what sampling from a bf16 rollout copy would cost; autocast
casts every weight at every step). Rows x new tokens as a
GRPO rollout; every row runs to the end (no EOS). Prints one JSON object: median seconds per
rollout, tokens per second, and whether each path chose the same greedy tokens as the eager loop.

    python bench/cuda_decode.py [--rows 64] [--new 32] [--repeat 3]      (on a machine with CUDA)
    python bench/cuda_decode.py --device cpu [--compile]                   (eager and static only)

``--compile``: also the static step compiled by ``torch.compile`` (inductor; on the CPU its C++
backend), the path the CPU would take instead of a graph; its first call compiles (``first_s``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shapes import SHAPES, llama  # noqa: E402


def main() -> None:
    from grpo_core.lm import decode as decoding
    from grpo_core.lm.decode import decode

    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--prompt", type=int, default=48, help="prompt tokens (the first rows left-padded by up to 8)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile", action="store_true", help="also the static step under torch.compile")
    p.add_argument("--shapes", default=",".join(SHAPES), help="model shapes, comma-separated")
    a = p.parse_args()
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    paths = {"eager": {}, "static": {"static": True}}
    if a.device == "cuda":
        paths["graph"] = {"static": True, "graph": True}
    if a.compile:
        paths["compiled"] = {"static": True}
    eager_step = decoding.StaticStep._step
    result = {
        "rows": a.rows,
        "new_tokens": a.new,
        "prompt_tokens": a.prompt,
        "device": a.device,
        "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
        "models": {},
    }
    for name in a.shapes.split(","):
        model = llama(name, max_position_embeddings=1024).to(a.device).eval()
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(3, SHAPES[name]["vocab_size"], (a.rows, a.prompt), generator=g).to(a.device)
        mask = torch.ones_like(ids)
        for r in range(min(8, a.rows)):  # some left padding, as a batch of different prompts has
            mask[r, : r + 1] = 0
        for precision in ("fp32", "bf16", "bf16-weights"):
            amp = torch.autocast(a.device, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
            net = copy.deepcopy(model).to(torch.bfloat16) if precision == "bf16-weights" else model
            runs = {}
            for path, kw in paths.items():
                # Compiled once per model and precision (dynamo's guards): its cost is in the first call.
                decoding.StaticStep._step = (
                    torch.compile(eager_step, dynamic=False) if path == "compiled" else eager_step
                )
                times = []
                for _ in range(a.repeat + 1):  # the first is a warm-up (and the graph's capture)
                    sync()
                    t0 = time.perf_counter()
                    with amp:
                        out = decode(
                            net, ids, mask, max_new_tokens=a.new, eos_id=-1, pad_id=0, choose=lambda ids, s: s, **kw
                        )
                    sync()
                    times.append(time.perf_counter() - t0)
                runs[path] = {
                    "median_s": round(statistics.median(times[1:]), 4),
                    "first_s": round(times[0], 4),
                    "tokens_per_s": round(a.rows * a.new / statistics.median(times[1:]), 1),
                    "tokens": out.cpu(),
                }
            decoding.StaticStep._step = eager_step
            eager = runs["eager"]["tokens"]
            for path, r in runs.items():
                r["same_tokens_as_eager"] = round(float((r.pop("tokens") == eager).float().mean()), 4)
                r["speedup_over_eager"] = round(runs["eager"]["median_s"] / r["median_s"], 2)
            result["models"][f"{name}/{precision}"] = runs
            print(json.dumps({f"{name}/{precision}": runs}), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

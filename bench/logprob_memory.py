"""Peak memory of the log-probability pass at SmolLM2's vocabulary (49,152 tokens): the whole
[B, T, V] fp32 logits at once (``CompletionLogprobs(chunk_bytes=None)``, what a GRPO step held before)
against the head read in chunks (``policy.LOGIT_CHUNK_BYTES``, the default), forward and backward,
each in a process of its own (its peak resident set is its own); and the largest differences between
the two in log-probs and in gradients. A Llama of SmolLM2's vocabulary and width (576), 2 layers.

    .venv/bin/python bench/logprob_memory.py [--rows 32 --tokens 128] --json

Prints one JSON object: per mode the peak RSS above the process's resident set before the pass
(MiB) and the seconds of the pass; ``whole_over_chunks`` of the former; ``max_abs_diff`` of log-probs
and ``max_rel_grad_diff`` (largest |g_chunks - g_whole| / |g_whole| per parameter tensor).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.shapes import SHAPES, llama  # noqa: E402

VOCAB = SHAPES["smollm2-135m"]["vocab_size"]


def _batch(rows: int, prompt: int, tokens: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (rows, prompt + tokens), generator=g)
    return ids, torch.ones_like(ids)


def worker(mode: str, rows: int, prompt: int, tokens: int, out: Path | None) -> dict:
    """One pass (forward + backward of the summed log-probs) in this process; its peak memory."""
    from grpo_core.lm.policy import LOGIT_CHUNK_BYTES, CompletionLogprobs
    from grpo_core.lm.runtime import peak_rss_mib

    model = llama("smollm2-135m", num_hidden_layers=2)
    ids, mask = _batch(rows, prompt, tokens)
    reader = CompletionLogprobs(model, chunk_bytes=None if mode == "whole" else LOGIT_CHUNK_BYTES)
    before = peak_rss_mib()  # this worker's own, not the parent's it would inherit in ru_maxrss
    t0 = time.perf_counter()
    logp, _ = reader(ids, mask, prompt, with_entropy=True)
    logp.sum().backward()
    seconds = time.perf_counter() - t0
    peak = peak_rss_mib()
    if out is not None:
        torch.save({"logp": logp.detach(), "grads": [p.grad for p in model.parameters()]}, out)
    return {"peak_above_start_mib": round(peak - before, 1), "seconds": round(seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    ap.add_argument("--worker", choices=["whole", "chunks"], help=argparse.SUPPRESS)
    ap.add_argument("--save", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.rows, args.prompt, args.tokens, args.save)))
        return
    import tempfile

    result: dict = {
        "rows": args.rows,
        "prompt_tokens": args.prompt,
        "completion_tokens": args.tokens,
        "vocab": VOCAB,
        "logits_gib_per_copy": round(args.rows * args.tokens * VOCAB * 4 / 2**30, 2),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("whole", "chunks"):
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                mode,
                "--rows",
                str(args.rows),
                "--prompt",
                str(args.prompt),
                "--tokens",
                str(args.tokens),
                "--save",
                str(Path(tmp) / f"{mode}.pt"),
            ]
            result[mode] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        whole, chunks = (torch.load(Path(tmp) / f"{m}.pt") for m in ("whole", "chunks"))
    result["whole_over_chunks"] = round(
        result["whole"]["peak_above_start_mib"] / max(result["chunks"]["peak_above_start_mib"], 1.0), 2
    )
    result["max_abs_diff"] = float((whole["logp"] - chunks["logp"]).abs().max())
    result["max_rel_grad_diff"] = max(
        float((a - b).norm() / b.norm().clamp(min=1e-30))
        for a, b in zip(chunks["grads"], whole["grads"])
        if b is not None
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""The seconds of the log-probability pass (forward and backward, as GRPO's update runs it) with
``attention.grouped_sdpa`` against transformers' SDPA (``--forward-only``: the no-grad forward of
the reference pass), which repeats each key/value head to every query head of its group: a Llama of
SmolLM2-135M's width, heads and vocabulary with a few layers, a GRPO step's rows (8 prompts x 8
completions, the prompt shared), fp32 on this CPU. The two models hold the same weights and
alternate, ``--rounds`` times after a warm-up each: what the grouped attention's memory saving costs
in time (docs/results.md, "The whole step's peak").

    .venv/bin/python bench/grouped_attention.py [--layers 3 --prompt 81 --tokens 32 --rounds 5] [--forward-only] --json

Prints one JSON object: each attention's median seconds and their ratio (grouped over plain).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.shapes import SHAPES, llama  # noqa: E402

VOCAB = SHAPES["smollm2-135m"]["vocab_size"]


def model(layers: int, grouped: bool):
    from grpo_core.lm.attention import use_grouped_sdpa

    m = llama("smollm2-135m", num_hidden_layers=layers)
    if grouped:
        use_grouped_sdpa(m)
    return m.train()


def pass_seconds(m, ids: torch.Tensor, prompt: int, backward: bool = True) -> float:
    """One forward and backward of the completion log-probabilities, as the update runs them;
    ``backward`` False: the forward alone without autograd, as the reference pass runs it."""
    from grpo_core.lm import policy

    m.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        logprobs, _ = policy.CompletionLogprobs(m)(ids, torch.ones_like(ids), prompt, with_entropy=False)
    if backward:
        logprobs.sum().backward()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=81, help="prompt tokens (GSM8K's first test questions)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--forward-only", action="store_true", help="the no-grad forward (the reference pass)")
    ap.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(1)
    ids = torch.cat(
        [
            torch.randint(0, VOCAB, (a.prompts, a.prompt), generator=g).repeat_interleave(a.group, 0),
            torch.randint(0, VOCAB, (a.prompts * a.group, a.tokens), generator=g),
        ],
        1,
    )
    models = {"plain": model(a.layers, False), "grouped": model(a.layers, True)}
    times: dict[str, list[float]] = {name: [] for name in models}
    for name, m in models.items():  # warm-up
        pass_seconds(m, ids, a.prompt, not a.forward_only)
    for _ in range(a.rounds):
        for name, m in models.items():
            times[name].append(pass_seconds(m, ids, a.prompt, not a.forward_only))
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(
        json.dumps(
            {
                "pass": "forward" if a.forward_only else "forward and backward",
                "layers": a.layers,
                "rows": a.prompts * a.group,
                "prompt_tokens": a.prompt,
                "completion_tokens": a.tokens,
                "threads": a.threads,
                "rounds": a.rounds,
                "median_s": {name: round(s, 4) for name, s in medians.items()},
                "seconds": {name: [round(s, 4) for s in t] for name, t in times.items()},
                "grouped_over_plain": round(medians["grouped"] / medians["plain"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()

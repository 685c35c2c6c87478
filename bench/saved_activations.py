"""What one training pass of the log-probabilities keeps for backward, at SmolLM2-135M's shape and a
GRPO step's sizes (8 prompts x 8 completions, prompts of 135 tokens, 32 completion tokens): the
bytes of every tensor autograd saves (counted once per storage, parameters left out), under bf16
autocast as on a GPU, for 1 and 3 layers of a Llama of SmolLM2's width, heads and vocabulary, then
per layer and scaled to its 30 layers. Exact and device-independent apart from the attention
kernel's own saves; a checkpointed layer's recomputation in backward adds one layer's worth.

    .venv/bin/python bench/saved_activations.py [--prompt 135 --tokens 32] --json

Modes, each against ``before`` (the pass as it was: keys and values repeated to every query head
by transformers' SDPA; with checkpointing, no prompt sharing):
- ``stored``: every activation kept; ``grouped``: the same with ``attention.grouped_sdpa``;
- ``checkpointed-plain``: each layer recomputed, every row's prompt computed (before);
  ``checkpointed``: each layer recomputed, each prompt once (``prompt_cache``).
Prints one JSON object: per mode the GiB at 30 layers and the MiB per layer; ratios to the mode it
replaces.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.shapes import SHAPES, llama  # noqa: E402

VOCAB = SHAPES["smollm2-135m"]["vocab_size"]
LAYERS = SHAPES["smollm2-135m"]["num_hidden_layers"]


def _model(layers: int, grouped: bool, checkpointed: bool):
    from grpo_core.lm.attention import use_grouped_sdpa

    # use_cache as ``runtime.place`` leaves a checkpointed model
    model = llama("smollm2-135m", num_hidden_layers=layers, use_cache=not checkpointed)
    if grouped:
        use_grouped_sdpa(model)
    if checkpointed:
        model.activation_checkpointing_enable()
    return model.train()


def saved_bytes(layers: int, mode: str, prompts: int, group: int, prompt: int, tokens: int) -> int:
    """Bytes autograd saves in one forward of ``CompletionLogprobs`` (the head read in chunks)."""
    from grpo_core.lm import policy

    checkpointed = mode.startswith("checkpointed")
    model = _model(layers, grouped=mode in ("grouped", "checkpointed"), checkpointed=checkpointed)
    g = torch.Generator().manual_seed(1)
    ids = torch.cat(
        [
            torch.randint(0, VOCAB, (prompts, prompt), generator=g).repeat_interleave(group, 0),
            torch.randint(0, VOCAB, (prompts * group, tokens), generator=g),
        ],
        1,
    )
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    # Before, a checkpointed model took the plain forward: every row's prompt computed.
    plain = (
        mock.patch.object(policy, "distinct_prompts", lambda *a: None)
        if mode == "checkpointed-plain"
        else nullcontext()
    )
    with plain:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", torch.bfloat16):
            policy.CompletionLogprobs(model)(ids, torch.ones_like(ids), prompt, with_entropy=True)
    return sum(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=135, help="prompt tokens (the H200 window's widest step)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    sizes = (a.prompts, a.group, a.prompt, a.tokens)
    result: dict = {"prompts": a.prompts, "group": a.group, "prompt_tokens": a.prompt, "completion_tokens": a.tokens}
    for mode in ("stored", "grouped", "checkpointed-plain", "checkpointed"):
        one, three = saved_bytes(1, mode, *sizes), saved_bytes(3, mode, *sizes)
        per_layer = (three - one) / 2
        result[mode] = {
            "per_layer_mib": round(per_layer / 2**20, 1),
            "smollm2_gib": round((one + (LAYERS - 1) * per_layer) / 2**30, 3),
        }
    for mode, before in (("grouped", "stored"), ("checkpointed", "checkpointed-plain"), ("checkpointed", "grouped")):
        result[f"{mode}_over_{before}"] = round(result[mode]["smollm2_gib"] / result[before]["smollm2_gib"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

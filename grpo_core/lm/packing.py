"""SFT examples as token ids, randomly concatenated into rows of the context length (packing).

DeepSeekMath SFT: "training examples are randomly concatenated until reaching a maximum context
length". Each example is ``<bos> prompt solution <eos>``; rows are cut at the context length, so an
example may continue into the next row, and the last row of an epoch is padded.
"""

from __future__ import annotations

import random

import torch

from grpo_core.data import Example, prompt_text

IGNORE = -100


def encode_examples(examples: list[Example], tokenizer, loss_on_prompt: bool) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per example; prompt labels are IGNORE unless ``loss_on_prompt``."""
    out = []
    for e in examples:
        if not e.solution:
            continue
        prompt = tokenizer(prompt_text(e.question), add_special_tokens=False).input_ids
        answer = tokenizer(e.solution, add_special_tokens=False).input_ids
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []  # many have none
        ids = bos + prompt + answer + [tokenizer.eos_token_id]
        labels = (
            list(ids) if loss_on_prompt else [IGNORE] * (len(bos) + len(prompt)) + answer + [tokenizer.eos_token_id]
        )
        out.append((ids, labels))
    return out


def pack(
    encoded: list[tuple[list[int], list[int]]], context_length: int, pad_id: int, rng: random.Random | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate examples (shuffled when ``rng`` is given) into [R, context_length] ids and labels."""
    order = list(range(len(encoded)))
    if rng is not None:
        rng.shuffle(order)
    ids = [t for i in order for t in encoded[i][0]]
    labels = [t for i in order for t in encoded[i][1]]
    rows = max(1, -(-len(ids) // context_length))
    pad = rows * context_length - len(ids)
    ids += [pad_id] * pad
    labels += [IGNORE] * pad
    return (torch.tensor(ids).view(rows, context_length), torch.tensor(labels).view(rows, context_length))

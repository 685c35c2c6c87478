"""SFT examples as token ids, randomly concatenated into rows of the context length (packing).

DeepSeekMath SFT: "training examples are randomly concatenated until reaching a maximum context
length". Each example is ``<bos> prompt solution <eos>``; rows are cut at the context length, so an
example may continue into the next row, and the last row of an epoch is padded.
"""

from __future__ import annotations

import random

import torch

from grpo_core.calculator import tool_form
from grpo_core.data import Example, prompt_text

IGNORE = -100


def encode_examples(
    examples: list[Example], tokenizer, loss_on_prompt: bool, calculator: bool = False
) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per example; prompt labels are IGNORE unless ``loss_on_prompt``.
    ``calculator``: the solution in the calculator's form (``calculator.tool_form``), each result it
    writes tokenized on its own, as the sampler forces it, and IGNORE in the labels (not the model's)."""
    out = []
    for e in examples:
        if not e.solution:
            continue
        prompt = tokenizer(prompt_text(e.question), add_special_tokens=False).input_ids
        answer, written = solution_tokens(e.solution, tokenizer, calculator)
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []  # many have none
        ids = bos + prompt + answer + [tokenizer.eos_token_id]
        before = bos + prompt if loss_on_prompt else [IGNORE] * (len(bos) + len(prompt))
        learnt = [IGNORE if w else t for t, w in zip(answer, written)]
        out.append((ids, before + learnt + [tokenizer.eos_token_id]))
    return out


def solution_tokens(solution: str, tokenizer, calculator: bool) -> tuple[list[int], list[bool]]:
    """A solution's token ids and, per token, whether the calculator writes it: the text in pieces,
    the model's and the calculator's, each tokenized on its own (without the calculator: one piece)."""
    if not calculator:
        ids = tokenizer(solution, add_special_tokens=False).input_ids
        return ids, [False] * len(ids)
    text, spans = tool_form(solution)
    ids, written, at = [], [], 0
    for start, end in spans + [(len(text), len(text))]:
        for piece, by_tool in ((text[at:start], False), (text[start:end], True)):
            if piece:
                piece_ids = tokenizer(piece, add_special_tokens=False).input_ids
                ids += piece_ids
                written += [by_tool] * len(piece_ids)
        at = end
    return ids, written


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

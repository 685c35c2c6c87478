"""The shared prompts' keys and values in a GRPO batch: written once, then only read.

``CompletionLogprobs`` runs each distinct prompt once and lets its G rows attend to that prompt's
keys and values through transformers' cache. The pass is differentiated, so its cache must survive
a layer being run again in backward (activation checkpointing recomputes each layer):
- ``PromptKV`` (the prompt pass) keeps each layer's keys and values as the layer first computed
  them; the layer run again gets its own back, and nothing is stored twice;
- ``PrefixKV`` (the completion pass) reads them for the B rows; a layer's update returns them
  joined to the completion's own without storing anything, so the layer run again sees the same,
  and no layer's join outlives its attention.
transformers' checkpointed layers drop a cache unless marked as safe to replay (``keeping_cache``).
With these two they keep it: the prompt is shared with activation checkpointing as without.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from transformers.cache_utils import Cache, DynamicCache


class PromptKV(DynamicCache):
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """[U, H_kv, P, D] each -> the same; stored the first time layer ``layer_idx`` runs."""
        if layer_idx < len(self.layers) and self.layers[layer_idx].is_initialized:
            return key_states, value_states  # the layer recomputed in backward
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class PrefixKV(Cache):
    def __init__(self, prompt: PromptKV, rows: torch.Tensor) -> None:
        """``prompt``'s keys and values read for the rows [B] (each row's distinct-prompt index),
        selected as each layer asks: no layer's [B, ...] copy is kept for the backward pass."""
        super().__init__(layers=prompt.layers)
        self.rows = rows

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """[B, H_kv, T, D] each -> [B, H_kv, P + T, D] each: the prompt's joined to them, unstored;
        differentiable."""
        layer = self.layers[layer_idx]
        return (
            torch.cat([layer.keys[self.rows], key_states], -2),
            torch.cat([layer.values[self.rows], value_states], -2),
        )


@contextmanager
def keeping_cache(model) -> Iterator[None]:
    """While the passes run, ``model``'s checkpointed layers keep the cache they are given (the mark
    is read when a layer runs forward; its recomputation in backward reuses that call's arguments)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m in layers:
            vars(m).pop("_can_checkpoint_with_cache", None)

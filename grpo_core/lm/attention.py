"""Grouped-query attention over a mask without repeating the keys and values.

transformers' SDPA path repeats each key/value head to every query head of its group
(``repeat_kv``) whenever an attention mask is passed, which the completion pass always does (left
padding, a cached prompt): SmolLM2's 3 key/value heads become 9 copies, each saved for backward.
Here each group's query heads are folded into the query axis instead, [B, H, T, D] ->
[B, H_kv, (H / H_kv) x T, D], with the mask repeated along that axis: every query still attends on
its own, the same numbers for a third of the keys and values. transformers does the same fold for a
single query token (``pack_gqa``); this extends it to T > 1. Written here because the library has no
masked GQA on CUDA that avoids the math kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "sdpa-grouped"


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [B, H, T, D], key and value [B, H_kv, L, D], attention_mask [B or 1, 1, T, L] or None
    -> the attention's output [B, T, H, D] (transformers' attention-function contract). Calls without
    a mask, with a single query token, without groups or with a per-head mask or bias go to
    transformers' own SDPA function unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, h, t, d = query.shape
    groups = getattr(module, "num_key_value_groups", 1)
    plain = attention_mask is None or attention_mask.shape[1] != 1 or kwargs.get("position_bias") is not None
    if groups == 1 or t == 1 or plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    folded = query.reshape(b, h // groups, groups * t, d)  # query head h reads key/value head h // groups
    mask = attention_mask.repeat(1, 1, groups, 1)  # row g * T + t: token t's row
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(out.shape[0], h, t, d).transpose(1, 2).contiguous(), None


def use_grouped_sdpa(model) -> None:
    """Point ``model``'s attention at ``grouped_sdpa`` where it uses transformers' SDPA with grouped
    key/value heads (else leave it as it is). Not saved with the model: a saved folder loads with
    its own attention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = getattr(model, "config", None)
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or not heads or kv in (None, heads):
        return
    AttentionInterface.register(NAME, grouped_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA takes
    model.set_attn_implementation(NAME)

"""Batched decoding of Llama-architecture models with a preallocated KV cache: the rollout's loop.

Our own because ``generate``'s per-token overhead, not its arithmetic, dominates a GRPO rollout on
small models: on the demo's model a decode step of 64 rows spent ~4 ms in ``forward`` (cache
objects, mask building, attention dispatch) against ~0.5 ms of matmuls. This loop reuses the
model's own modules (norms, projections, rotary embedding, MLP) and only replaces the plumbing
around them: one [B, H, P + T, D] key/value buffer per layer, written in place, and a boolean
padding mask sliced per step. ``supports`` says which models take this path; others use
``generate``. The logits match the model's forward (tested), so samples are draws from the same
distribution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


# Whether ``generate`` replays decode steps as CUDA graphs on a GPU: ``launch.cuda_graphs``, set for the
# process by ``runtime.place`` (a process runs one stage of one recipe).
CUDA_GRAPHS = True


def supports(model) -> bool:
    """True for a plain ``LlamaForCausalLM`` whose layers are the stock ones (or FSDP's class of one,
    which ``Dist.gathered`` makes whole for sampling)."""
    from torch.distributed.fsdp import FSDPModule
    from transformers import LlamaForCausalLM

    cfg = model.config
    plain = type(model) is LlamaForCausalLM or type(model).__bases__ == (FSDPModule, LlamaForCausalLM)
    return (
        plain
        and cfg.hidden_act == "silu"
        and getattr(cfg, "pretraining_tp", 1) == 1
        and not getattr(cfg, "sliding_window", None)
    )


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] positions counting only attended tokens (0 for the left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def distinct_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int):
    """The distinct prompts of a batch: ([U, P] ids, [U, P] mask, [B] row -> prompt index), or None
    when every row's prompt is distinct (nothing to share). A GRPO batch holds each prompt G times."""
    rows = torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len]], 1)
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if len(distinct) == len(rows):
        return None
    return distinct[:, :prompt_len], distinct[:, prompt_len:], inverse


def _attention(
    layer,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: tuple,
    start: int | torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """x [B, S, E] at cache positions [start, start + S) -> [B, S, E]; writes this layer's keys and
    values there. ``mask`` [B, 1, S, start + S] bool, True where a query may attend. A tensor
    ``start`` ([1], S = 1) reads the whole cache instead, ``mask`` [B, 1, 1, P + T] (static shapes)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attn = layer.self_attn
    b, s, _ = x.shape
    d = attn.head_dim
    q = attn.q_proj(x).view(b, s, -1, d).transpose(1, 2)
    k = attn.k_proj(x).view(b, s, -1, d).transpose(1, 2)
    v = attn.v_proj(x).view(b, s, -1, d).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    keys, values = cache
    if isinstance(start, torch.Tensor):  # static shapes (``StaticStep``): write at a tensor index, read it all
        keys.index_copy_(2, start, k.to(keys.dtype))
        values.index_copy_(2, start, v.to(values.dtype))
        k, v = keys, values
    else:
        keys[:, :, start : start + s] = k
        values[:, :, start : start + s] = v
        k, v = keys[:, :, : start + s], values[:, :, : start + s]
    out = F.scaled_dot_product_attention(
        q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=attn.scaling, enable_gqa=k.shape[1] != q.shape[1]
    )
    return attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))


def _forward(
    model, ids: torch.Tensor, positions: torch.Tensor, caches: list, start: int | torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """ids / positions [B, S] at cache positions [start, start + S) -> next-token logits [B, V] of
    the last position."""
    inner = model.model
    h = inner.embed_tokens(ids)
    cos, sin = inner.rotary_emb(h, positions)
    for layer, cache in zip(inner.layers, caches):
        h = h + _attention(layer, layer.input_layernorm(h), cos, sin, cache, start, mask)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(inner.norm(h[:, -1])).float()


class StaticStep:
    """One decode step with the same shapes at every token, so that a GPU can replay it as a CUDA
    graph: the step's index is a tensor, keys and values are written at a tensor index and the whole
    [P + T] cache is attended under a precomputed per-step mask. On a GPU the eager loop is bound
    by launching ~15 kernels per layer and token, its CPU time many times its GPU time; one graph
    replay per token launches them all at once (its speed-up: docs/scaling.md). ``graph``: capture it (CUDA
    only), else run the same static computation eagerly (what the CPU test compares with the plain
    loop)."""

    def __init__(
        self, model, caches: list, attended: torch.Tensor, positions: torch.Tensor, p: int, graph: bool
    ) -> None:
        b, length = attended.shape
        steps = torch.arange(length - p, device=attended.device)
        # [T, B, 1, 1, P + T]: step t's query (at p + t) sees the attended keys at positions <= p + t.
        visible = torch.arange(length, device=attended.device)[None, :] <= (p + steps)[:, None]
        self.masks = attended[None, :, None, None, :] & visible[:, None, None, None, :]
        self.positions = positions[:, p:].T.contiguous()  # [T, B]
        self.model, self.caches, self.p = model, caches, p
        self.token = torch.zeros(b, 1, dtype=torch.long, device=attended.device)
        self.t = torch.zeros(1, dtype=torch.long, device=attended.device)
        self.graph = None
        if graph:
            with torch.cuda.device(attended.device):  # the model's GPU, whichever is current
                self.graph, self.scores = _capture(self._step)

    def _step(self) -> torch.Tensor:
        mask = self.masks.index_select(0, self.t)[0]
        positions = self.positions.index_select(0, self.t).T  # [B, 1]
        return _forward(self.model, self.token, positions, self.caches, self.t + self.p, mask)

    def __call__(self, token: torch.Tensor, t: int) -> torch.Tensor:
        """The [B, V] scores after ``token`` [B], the completion's token ``t``."""
        self.token.copy_(token[:, None])
        self.t.fill_(t)
        if self.graph is None:
            return self._step()
        self.graph.replay()
        return self.scores


def _capture(step):
    """(a CUDA graph of ``step()``, its output buffer). Warm-up on a side stream first, as torch
    asks; autocast's weight cache is off while capturing (cached casts would be baked in)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    amp = {
        "device_type": "cuda",
        "dtype": torch.get_autocast_dtype("cuda"),
        "enabled": torch.is_autocast_enabled("cuda"),
        "cache_enabled": False,
    }
    with torch.cuda.stream(side), torch.autocast(**amp):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.autocast(**amp):
        out = step()
    return graph, out


@torch.no_grad()
def decode(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    choose,
    static: bool = False,
    graph: bool = False,
) -> torch.Tensor:
    """Left-padded prompts ``input_ids`` / ``attention_mask`` [B, P] -> completions [B, T <= max_new_tokens]:
    each step's token is ``choose(completions so far [B, t], scores [B, V]).argmax(-1)`` (a logits
    processor's interface, on the completions alone); a row that has emitted EOS gets
    ``pad_id`` from then on, and decoding stops once every row has (as ``generate`` does).
    ``static``: every step the same shapes (``StaticStep``), with ``graph`` replayed as a CUDA graph."""
    b, p = input_ids.shape
    device = input_ids.device
    caches = _caches(model, b, p + max_new_tokens, device, static)
    attended = torch.cat([attention_mask.bool(), torch.ones(b, max_new_tokens, dtype=torch.bool, device=device)], 1)
    positions = position_ids(attended)  # [B, P + T]
    scores = _prefill(model, input_ids, attention_mask, caches)
    out = torch.full((b, max_new_tokens), pad_id, dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    step = StaticStep(model, caches, attended, positions, p, graph) if static else None
    # The eager loop computes the rows still decoding only (``live``, in the caches' order): the rows
    # that have ended leave the batch once they are a quarter of it (a copy of the caches' live rows).
    # ``choose`` still sees every row's scores (an ended row's are stale, and its token is padding),
    # so a sampler's per-row noise is drawn as without the compaction.
    live, every = torch.arange(b, device=device), scores
    for t in range(max_new_tokens):
        every = scores if len(live) == b else every.index_copy_(0, live, scores)
        token = choose(out[:, :t], every).argmax(-1).masked_fill(done, pad_id)
        out[:, t] = token
        done |= token == eos_id
        if t + 1 == max_new_tokens or bool(done.all()):
            return out[:, : t + 1]
        if step:
            scores = step(token, t)
            continue
        ended = done[live]
        if 4 * int(ended.sum()) >= len(live):
            live, kept = live[~ended], ~ended
            caches = [(keys[kept], values[kept]) for keys, values in caches]
            attended, positions = attended[kept], positions[kept]
        here = p + t
        scores = _forward(
            model, token[live, None], positions[:, here : here + 1], caches, here, attended[:, None, None, : here + 1]
        )
    return out


def _caches(model, b: int, length: int, device: torch.device, static: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, a [B, H_kv, length, D] key buffer and value buffer in the model's dtype."""
    dtype = model.model.embed_tokens.weight.dtype
    heads_kv, d = model.config.num_key_value_heads, model.model.layers[0].self_attn.head_dim
    # A static step reads the whole cache: unwritten entries must be finite (a masked key's weight is
    # 0, but 0 x NaN is NaN).
    alloc = torch.zeros if static else torch.empty
    return [
        (
            alloc(b, heads_kv, length, d, dtype=dtype, device=device),
            alloc(b, heads_kv, length, d, dtype=dtype, device=device),
        )
        for _ in model.model.layers
    ]


def _prefill(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, caches: list) -> torch.Tensor:
    """The prompts [B, P] into the first P positions of ``caches``, once per distinct prompt, its
    keys and values then copied to the prompt's rows; returns every row's next-token scores [B, V]."""
    p = input_ids.shape[1]
    device = input_ids.device
    prefill_ids, prefill_mask, inverse = distinct_prompts(input_ids, attention_mask, p) or (
        input_ids,
        attention_mask,
        None,
    )
    u = len(prefill_ids)
    # Causal and padding mask; a padding query attends to itself only, so no row of the mask is
    # empty (its output is never used, and its key is masked for everyone else).
    causal = torch.ones(p, p, dtype=torch.bool, device=device).tril()
    mask = (causal[None] & prefill_mask.bool()[:, None, :]) | torch.eye(p, dtype=torch.bool, device=device)[None]
    scores = _forward(
        model, prefill_ids, position_ids(prefill_mask), [(k[:u], v[:u]) for k, v in caches], 0, mask[:, None]
    )
    if inverse is not None:
        scores = scores[inverse]
        for keys, values in caches:
            keys[:, :, :p] = keys[inverse, :, :p]
            values[:, :, :p] = values[inverse, :, :p]
    return scores

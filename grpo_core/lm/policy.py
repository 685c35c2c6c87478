"""Sampling from a causal LM and scoring its completions: the two things every stage does with it.

Rows are left-padded prompts followed by right-padded completions: [B, P + T]. Positions follow the
attention mask so that a left-padded row sees the same positions in training as in generation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from grpo_core.lm import decode as fast_decode
from grpo_core.lm.decode import distinct_prompts, position_ids
from grpo_core.lm.runtime import model_device
from grpo_core.lm.tool import CalculatorForcing
from grpo_core.seeds import row_seed


@dataclass
class Rollout:
    input_ids: torch.Tensor  # [B, P + T] prompt (left-padded) + completion (right-padded)
    attention_mask: torch.Tensor  # [B, P + T]
    completion_mask: torch.Tensor  # [B, T] 1 on completion tokens up to and including EOS
    prompt_len: int  # P
    texts: list[str]  # decoded completions without special tokens
    truncated: torch.Tensor  # [B] bool: no EOS within max_new_tokens
    tool_mask: torch.Tensor | None = None  # [B, T] 1 on the tokens the calculator wrote (lm/tool.py), not the policy's

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len :]

    def rows(self, start: int, stop: int) -> "Rollout":
        """Rows [start, stop) (a minibatch of whole groups)."""
        return Rollout(
            self.input_ids[start:stop],
            self.attention_mask[start:stop],
            self.completion_mask[start:stop],
            self.prompt_len,
            self.texts[start:stop],
            self.truncated[start:stop],
            None if self.tool_mask is None else self.tool_mask[start:stop],
        )

    def select(self, index: torch.Tensor) -> "Rollout":
        """The rows ``index`` [U] (long), in that order."""
        return Rollout(
            self.input_ids[index],
            self.attention_mask[index],
            self.completion_mask[index],
            self.prompt_len,
            [self.texts[i] for i in index.tolist()],
            self.truncated[index],
            None if self.tool_mask is None else self.tool_mask[index],
        )

    @staticmethod
    def cat(parts: list["Rollout"], pad_id: int) -> "Rollout":
        """The rows of ``parts`` in order, as one batch: prompts left-padded to the longest prompt and
        completions right-padded to the widest (padding is masked, and positions follow the mask, so
        every row reads as it did in its own batch). Dynamic sampling joins the groups of its draws."""
        p, t = max(r.prompt_len for r in parts), max(r.completion_mask.shape[1] for r in parts)

        def widen(x: torch.Tensor, r: "Rollout", fill) -> torch.Tensor:
            left, right = p - r.prompt_len, t - (x.shape[1] - r.prompt_len)
            return F.pad(x, (left, right), value=fill)

        return Rollout(
            torch.cat([widen(r.input_ids, r, pad_id) for r in parts]),
            torch.cat([widen(r.attention_mask, r, 0) for r in parts]),
            torch.cat([F.pad(r.completion_mask, (0, t - r.completion_mask.shape[1])) for r in parts]),
            p,
            [text for r in parts for text in r.texts],
            torch.cat([r.truncated for r in parts]),
            None
            if all(r.tool_mask is None for r in parts)
            else torch.cat([F.pad(r.written(), (0, t - r.completion_mask.shape[1])) for r in parts]),
        )

    def written(self) -> torch.Tensor:
        """[B, T] 1 on the tokens the calculator wrote (zeros where it wrote none)."""
        return torch.zeros_like(self.completion_mask) if self.tool_mask is None else self.tool_mask

    def distinct(self, *keys: torch.Tensor) -> "Distinct":
        """The rows that differ in their tokens or in any of ``keys`` ([B, ...] per row, e.g. their
        advantages): a GRPO group of a model that has learnt its task repeats its likeliest solution
        (83% of the demo's rollouts were repeats), and a pass over a repeat computes nothing new."""
        # Floats compared by their bits (exact: NaN equals itself), every key as one long row.
        bits = [k.reshape(len(k), -1) for k in (self.input_ids, self.attention_mask, *keys)]
        rows = torch.cat([k.double().view(torch.int64) if k.is_floating_point() else k.long() for k in bits], 1)
        _, inverse, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
        b = len(rows)
        at = torch.arange(b, device=rows.device)
        first = torch.full((len(counts),), b, device=rows.device).scatter_reduce_(0, inverse, at, "amin")
        order = first.argsort()  # distinct rows in the order of their first occurrence
        rank = torch.empty_like(order)
        rank[order] = at[: len(order)]
        return Distinct(first[order], rank[inverse], counts[order])


@dataclass(frozen=True)
class Distinct:
    """Rows of a batch without repeats: ``index`` [U] of each distinct row's first occurrence (in
    batch order), ``inverse`` [B] each row's distinct row (``scores[inverse]`` spreads them back),
    ``counts`` [U] how many rows each stands for. No repeats: ``index`` is 0..B-1, counts all 1."""

    index: torch.Tensor
    inverse: torch.Tensor
    counts: torch.Tensor

    @property
    def repeats(self) -> bool:
        return len(self.index) < len(self.inverse)


def text_ids(tokenizer, text: str) -> list[int]:
    """Token ids of untrusted text: a string that spells a special token (``<eos>``) stays text."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids


def encode_prompts(tokenizer, prompts: list[str]):
    """BOS (when the tokenizer has one) + prompt, left-padded: ``input_ids`` / ``attention_mask`` [B, P]."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    distinct = {p: bos + text_ids(tokenizer, p) for p in dict.fromkeys(prompts)}  # a GRPO batch repeats each G times
    rows = [distinct[p] for p in prompts]
    return tokenizer.pad({"input_ids": rows}, return_tensors="pt", padding=True, padding_side="left")


def right_pad(rows: list, pad_id: int) -> torch.Tensor:
    """[B, W] long: token-id rows (lists or 1-D tensors) padded on the right to the longest (W >= 1)."""
    out = torch.full((len(rows), max(1, max(len(r) for r in rows))), pad_id, dtype=torch.long)
    for i, ids in enumerate(rows):
        out[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    return out


def _after_prompts(
    enc, completion: torch.Tensor, cmask: torch.Tensor, texts: list[str], truncated: torch.Tensor
) -> Rollout:
    """The Rollout of the encoded prompts ``enc`` ([B, P]) followed by ``completion`` [B, T] (mask ``cmask``)."""
    return Rollout(
        input_ids=torch.cat([enc.input_ids, completion], dim=1),
        attention_mask=torch.cat([enc.attention_mask, cmask.long()], dim=1),
        completion_mask=cmask,
        prompt_len=enc.input_ids.shape[1],
        texts=texts,
        truncated=truncated,
    )


def completion_mask_from(ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] mask of tokens up to and including the first EOS, and [B] truncated flags.

    Whatever follows the first EOS (padding, or more EOS when pad == eos) is masked out."""
    is_eos = (ids == eos_id).long()
    seen_eos_before = (is_eos.cumsum(-1) - is_eos) > 0
    return (~seen_eos_before).float(), is_eos.sum(-1) == 0


class GumbelSampler:
    """Sampling as greedy decoding of perturbed logits: argmax(logits / T + G), G ~ Gumbel(0, 1), is
    an exact draw from softmax(logits / T) (the Gumbel-max trick). Each row draws its noise from its
    own generator, seeded by ``row_seed(seed, row id)``, so a sample depends on its seed and row id
    only, never on which rows share its batch: the same rollouts on 1 or N processes, after a
    resume, and at any batch size. A ``transformers`` logits processor (called once per token);
    our own because ``generate``'s sampler draws one stream for the whole batch.

    Each generator draws the noise of up to ``max_new_tokens`` tokens in one call, at most
    ``NOISE_BYTES_PER_ROW`` (all of a rollout's tokens for a small vocabulary): a call per row and
    token cost as much as the model on small models. The block size depends on the vocabulary and
    ``max_new_tokens`` alone, so the stream a row sees does not depend on its batch either."""

    NOISE_BYTES_PER_ROW = 1 << 20

    def __init__(self, temperatures: list[float], row_seeds: list[int], max_new_tokens: int = 1) -> None:
        self.max_new_tokens = max_new_tokens
        self.temperatures = torch.tensor(temperatures, dtype=torch.float32)[:, None]  # [B, 1]
        self.row_seeds = row_seeds
        self.generators: list[torch.Generator] | None = None
        self.noise = torch.empty(len(row_seeds), 0, 0)  # [B, k, V]: the current block
        self.used = 0  # tokens of the block consumed

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        """[B, V] scores of the next token -> [B, V] perturbed scores whose argmax is the sample."""
        if self.generators is None:  # on the scores' device, so that no noise crosses the bus
            self.generators = [torch.Generator(scores.device).manual_seed(s) for s in self.row_seeds]
        if self.used == self.noise.shape[1]:
            vocab = scores.shape[-1]
            block = max(1, min(self.max_new_tokens, self.NOISE_BYTES_PER_ROW // (4 * vocab)))
            u = torch.stack([torch.rand(block, vocab, generator=g, device=scores.device) for g in self.generators])
            self.noise, self.used = -torch.log(-torch.log(u.clamp(min=1e-20))), 0
        gumbel = self.noise[:, self.used]
        self.used += 1
        return scores.float() / self.temperatures.to(scores.device) + gumbel


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperatures: list[float] | None = None,
    seed: int = 0,
    row_ids: list[int] | None = None,
    calculator: bool | None = None,
) -> Rollout:
    """Sample one completion per prompt (greedy when ``temperatures`` is None). ``calculator``: the
    results of a line's arithmetic written by the calculator (``lm/tool.py``), marked in ``tool_mask``;
    None: as the model was trained (``config.calculator``, saved by SFT with ``model.calculator``).

    Row i's sample depends only on (``seed``, ``row_ids[i]``) (default: i), so a resumed run redraws
    the same rollouts and a process holding rows 8..15 of a batch draws what one process drawing all
    rows would draw for them (``GumbelSampler``).
    """
    from transformers import LogitsProcessorList

    enc = encode_prompts(tokenizer, prompts)
    prompt_len = enc.input_ids.shape[1]
    processors = LogitsProcessorList()
    if temperatures is not None:
        ids = list(range(len(prompts))) if row_ids is None else row_ids
        processors.append(GumbelSampler(temperatures, [row_seed(seed, i) for i in ids], max_new_tokens))
    was_training = model.training
    model.eval()
    device = model_device(model)
    ids, mask = enc.input_ids.to(device), enc.attention_mask.to(device)
    fast = fast_decode.supports(model)
    calculator = getattr(model.config, "calculator", False) if calculator is None else calculator
    tool = CalculatorForcing(tokenizer, len(prompts), start=0 if fast else prompt_len) if calculator else None
    processors += [tool] if tool else []
    if fast:
        graphs = device.type == "cuda" and fast_decode.CUDA_GRAPHS
        chosen = fast_decode.decode(
            model,
            ids,
            mask,
            max_new_tokens=max_new_tokens,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            choose=processors,
            static=graphs,
            graph=graphs,
        )
    else:
        chosen = _transformers_generate(model, tokenizer, ids, mask, processors, max_new_tokens)[:, prompt_len:]
    chosen = chosen.cpu()  # rollouts live on the CPU; forward passes move their inputs to the model (token_logprobs)
    model.train(was_training)
    completion = right_pad(list(chosen), tokenizer.pad_token_id)
    cmask, truncated = completion_mask_from(completion, tokenizer.eos_token_id)
    texts = tokenizer.batch_decode(
        completion * cmask.long() + tokenizer.pad_token_id * (1 - cmask.long()), skip_special_tokens=True
    )
    rollout = _after_prompts(enc, completion, cmask, texts, truncated)
    return replace(rollout, tool_mask=tool.written_mask(completion.shape[1]) * cmask) if tool else rollout


def _transformers_generate(
    model, tokenizer, ids: torch.Tensor, mask: torch.Tensor, processors, max_new_tokens: int
) -> torch.Tensor:
    """``model.generate`` on the prompts ``ids`` / ``mask`` (a model ``fast_decode`` does not
    support), its tokens chosen by ``processors``: [B, P + T] prompts and completions."""
    from transformers import GenerationConfig

    # A bare config: a model's shipped generation settings (repetition penalty, suppressed
    # tokens, ...) would make the samples' distribution differ from the log-probs trained on.
    bare = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    # synced_gpus off: transformers turns it on for an FSDP-managed model and then steps every
    # rank together; ours sample on gathered weights, each process its own rows (Dist.gathered).
    return model.generate(
        input_ids=ids, attention_mask=mask, generation_config=bare, logits_processor=processors, synced_gpus=False
    )


def encode(
    tokenizer,
    prompts: list[str],
    completions: list[str],
    *,
    add_eos: bool = True,
    max_completion_tokens: int | None = None,
) -> Rollout:
    """The Rollout layout for given texts (reward-model training and scoring of stored solutions).

    Each completion is tokenized on its own and ends with EOS (as a finished sample does), so a
    reward model sees the same rows here as on GRPO's rollouts.
    """
    enc = encode_prompts(tokenizer, prompts)
    rows = []
    for text in completions:
        ids = text_ids(tokenizer, text)
        if max_completion_tokens is not None:
            ids = ids[:max_completion_tokens]
        rows.append(ids + ([tokenizer.eos_token_id] if add_eos else []))
    completion = right_pad(rows, tokenizer.pad_token_id)
    lengths = torch.tensor([len(r) for r in rows])
    cmask = (torch.arange(completion.shape[1])[None, :] < lengths[:, None]).float()
    return _after_prompts(enc, completion, cmask, list(completions), torch.tensor([not add_eos] * len(rows)))


def _attention_only(cache) -> bool:
    """A cache of keys and values only, whose rows can be selected whole (``PrefixKV``)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    return isinstance(cache, DynamicCache) and all(
        type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in cache.layers
    )


# Log-probabilities are read from the logits this many bytes at a time (fp32): SmolLM2's 49,152-token
# vocabulary makes [B, T, V] logits 16 GB at 256 rows x 320 tokens, several copies of them live in a
# backward pass. A chunk's logits are recomputed in backward rather than kept.
LOGIT_CHUNK_BYTES = 256 << 20

# Causal LMs whose logits are ``lm_head(last hidden state)`` and nothing else (no soft-capping or
# scaling), which ``CompletionLogprobs`` reads chunk by chunk; others take their own forward whole.
PLAIN_HEADS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def plain_head(model) -> bool:
    """Whether ``model``'s logits are its ``lm_head`` on its base model's last hidden state. Not for an
    FSDP-sharded model: its root gathers the head's weights in its own forward only."""
    from torch.distributed.fsdp import FSDPModule

    return type(model).__name__ in PLAIN_HEADS and not isinstance(model, FSDPModule)


def _chunk_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """hidden [N, E], targets [N] -> log-probabilities of the targets [N] and, when asked, the
    entropies [N] (detached; else None)."""
    logp_all = F.log_softmax(head(hidden).float(), dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.no_grad():  # p log p in place: one [N, V] working copy, not two
        return logp, -logp_all.exp().mul_(logp_all).sum(-1)


def head_logprobs(
    head, hidden: torch.Tensor, targets: torch.Tensor, chunk_bytes: int = LOGIT_CHUNK_BYTES, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hidden [B, T, E], targets [B, T] -> log-probabilities of the targets under ``head``'s logits
    [B, T] and the logits' entropies [B, T] (detached; None unless ``with_entropy``), reading
    ``chunk_bytes`` of fp32 logits at a time (a chunk's working set is a few times that: the head's
    output, its fp32 copy, the log-softmax). Where there is more than one chunk each is checkpointed,
    so backward recomputes its logits instead of keeping them: a fused log-softmax-gather in plain
    torch, the same values as the whole [B, T, V] at once."""
    from torch.utils.checkpoint import checkpoint

    b, t, e = hidden.shape
    flat, ids = hidden.reshape(b * t, e), targets.reshape(b * t)
    n = max(1, chunk_bytes // (4 * head.out_features))
    # Logits that fit in one chunk are kept for backward (within the budget anyway): recomputing
    # them would cost a second pass through the head for no memory saved.
    recompute = torch.is_grad_enabled() and b * t > n
    parts = [
        checkpoint(
            _chunk_logprobs,
            head,
            flat[i : i + n],
            ids[i : i + n],
            with_entropy,
            use_reentrant=False,
            preserve_rng_state=False,
        )  # no randomness inside
        if recompute
        else _chunk_logprobs(head, flat[i : i + n], ids[i : i + n], with_entropy)
        for i in range(0, b * t, n)
    ]
    logp = torch.cat([p[0] for p in parts]).reshape(b, t) if parts else flat.new_zeros(b, t)
    if not with_entropy:
        return logp, None
    return logp, torch.cat([p[1] for p in parts]).reshape(b, t) if parts else flat.new_zeros(b, t)


class CompletionLogprobs(torch.nn.Module):
    """A causal LM read at its completion tokens: one module whose forward is the whole computation
    (what DDP must wrap). A GRPO batch holds each prompt G times; causal attention makes a prompt's
    keys and values independent of what follows, so they are computed once per distinct prompt and
    shared by its G rows through the model's KV cache: the same numbers (and gradients, summed over
    the rows) for about half the work at the paper's lengths, with activation checkpointing or
    without (``prompt_cache``). Rows whose prompts are all distinct and models whose cache holds more
    than keys and values (recurrent, linear attention) take one plain forward.

    A model with a ``plain_head`` is read as hidden states, then through its head ``chunk_bytes`` of
    logits at a time (``head_logprobs``); ``chunk_bytes`` None, or another model: its own forward's
    whole [B, T, V] logits."""

    def __init__(self, model, chunk_bytes: int | None = LOGIT_CHUNK_BYTES) -> None:
        super().__init__()
        self.model = model
        self.chunk_bytes = chunk_bytes if plain_head(model) else None

    def _read(self, keep: int, **inputs):
        """The model's outputs at the last ``keep`` positions of ``inputs``: hidden states [B, keep, E]
        when read through the head in chunks, else logits [B, keep, V]."""
        if self.chunk_bytes is None:
            return self.model(**inputs, logits_to_keep=keep).logits
        return self.model.base_model(**inputs).last_hidden_state[:, -keep:]

    def _completion_states(self, ids: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """[B, L] -> [B, T, X]: the logits (X = V) or hidden states (X = E) that predict the completion
        tokens ids[:, P:]."""
        positions = position_ids(mask)
        width = ids.shape[1] - prompt_len

        def plain():
            # Only the positions that predict completion tokens are read: the output layer over
            # the prompt would cost [B, P, V] (gigabytes with a 49k vocabulary) for nothing.
            return self._read(width + 1, input_ids=ids, attention_mask=mask, position_ids=positions)[:, :-1]

        shared = distinct_prompts(ids, mask, prompt_len)
        if shared is None:
            return plain()
        # deferred: prompt_cache imports transformers (~0.7 s); the rest of policy needs torch alone
        from grpo_core.lm.prompt_cache import PrefixKV, PromptKV, keeping_cache

        prompt_ids, prompt_mask, inverse = shared
        prompt = PromptKV(config=self.model.config)
        with keeping_cache(self.model):
            head = self._read(
                1,
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                position_ids=position_ids(prompt_mask),
                past_key_values=prompt,
            )
            first = head[inverse]  # [B, 1, X]: the last prompt position predicts completion token 0
            if width == 1:
                return first
            if not _attention_only(prompt):  # recurrent or linear-attention state: no row selection
                return plain()
            rest = self._read(
                width - 1,
                input_ids=ids[:, prompt_len:-1],
                attention_mask=mask[:, :-1],
                position_ids=positions[:, prompt_len:-1],
                past_key_values=PrefixKV(prompt, inverse),  # [U, ...] -> [B, ...], differentiable indexing
            )
        return torch.cat([first, rest], 1)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, with_entropy: bool = False
    ):
        """[B, P + T] -> log-probabilities of the completion tokens [B, T] (and their entropies,
        [B, T]) on the inputs' device (the CPU) whatever the model's: the [B, T, V] work stays on the
        model's device, and only [B, T] comes back (differentiably) for the loss."""
        device = model_device(self.model)
        ids = input_ids.to(device)
        states = self._completion_states(ids, attention_mask.to(device), prompt_len)
        targets = ids[:, prompt_len:]
        if self.chunk_bytes is not None:
            logp, entropy = head_logprobs(self.model.lm_head, states, targets, self.chunk_bytes, with_entropy)
        else:
            logp_all = F.log_softmax(states.float(), dim=-1)
            logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            entropy = (-(logp_all.exp() * logp_all).sum(-1)).detach() if with_entropy else None
        logp = logp.to(input_ids.device)
        return (logp, entropy.to(input_ids.device)) if with_entropy else (logp, None)


def token_logprobs(model, rollout: Rollout, with_entropy: bool = False):
    """Log-probabilities of the completion tokens, [B, T] (and their entropies, [B, T]), on the
    rollout's device. ``model``: a causal LM, or its ``CompletionLogprobs`` (DDP-wrapped in training)."""
    reader = model if isinstance(getattr(model, "module", model), CompletionLogprobs) else CompletionLogprobs(model)
    logp, entropy = reader(rollout.input_ids, rollout.attention_mask, rollout.prompt_len, with_entropy)
    # DDP moves a module's inputs to its GPU before forward: bring the results back explicitly.
    here = rollout.input_ids.device
    return (logp.to(here), entropy.to(here)) if with_entropy else logp.to(here)

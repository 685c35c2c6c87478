"""The fast paths of a GRPO step (grpo_core.lm.decode, policy.CompletionLogprobs) against the plain
``transformers`` ones they replace: the same samples, log-probs, entropies and gradients."""

from __future__ import annotations

import copy

import pytest
import torch

import grpo_core.lm.decode as fast_decode
from grpo_core.data import prompt_text
from grpo_core.lm.decode import decode, distinct_prompts
from grpo_core.lm.modeling import load_model
from grpo_core.lm.policy import CompletionLogprobs, encode_prompts, generate, position_ids, token_logprobs

QUESTIONS = ("What is 1 + 2?", "What is 13 - 4 + 7 - 2?", "2+2")
GROUP = 3
PROMPTS = [prompt_text(q) for q in QUESTIONS for _ in range(GROUP)]  # left-padded, each prompt 3 times


def _spread(model, seed: int = 0):
    """Weights spread out (a fresh init emits one repeated token), so completions vary."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def _model(tiny_model_dir, kind: str):
    """The tiny Llama, a grouped-query-attention Llama, or a Qwen2 (biased projections, not on the
    fast decoding path), all on the tiny model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    model, tok = load_model(tiny_model_dir)
    if kind == "llama":
        return _spread(model), tok
    shape = dict(
        vocab_size=model.config.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    other = LlamaForCausalLM(LlamaConfig(**shape)) if kind == "llama-gqa" else Qwen2ForCausalLM(Qwen2Config(**shape))
    return _spread(other.float()), tok


def _with_eos_that_splits_rows(model, tok, **sampling):
    """A copy of ``tok`` whose EOS is a token that decoding (with ``sampling``) emits in some rows
    and not in others, so that a batch mixes finished (padded after EOS) and truncated rows."""
    plain = generate(model, tok, PROMPTS, max_new_tokens=12, **sampling).completion_ids
    specials = set(tok.all_special_ids)
    for c in sorted(set(plain[:, 1:].flatten().tolist()) - specials):
        has = (plain == c).any(dim=1)
        if 0 < int(has.sum()) < len(PROMPTS) and (plain[:, 0] != c).all():
            tok = copy.deepcopy(tok)
            tok.eos_token = tok.convert_ids_to_tokens(c)
            return tok
    raise AssertionError("no token splits the rows: pick other prompts or weights for this test")


@pytest.mark.parametrize("kind", ["llama", "llama-gqa"])
@pytest.mark.parametrize("temperatures", [None, [0.7, 1.0, 1.3] * len(QUESTIONS)])
def test_fast_decoding_equals_transformers_generate(tiny_model_dir, monkeypatch, kind, temperatures):
    model, tok = _model(tiny_model_dir, kind)
    assert fast_decode.supports(model)
    tok = _with_eos_that_splits_rows(model, tok, temperatures=temperatures, seed=3)
    fast = generate(model, tok, PROMPTS, max_new_tokens=12, temperatures=temperatures, seed=3)
    monkeypatch.setattr(fast_decode, "supports", lambda m: False)
    slow = generate(model, tok, PROMPTS, max_new_tokens=12, temperatures=temperatures, seed=3)
    assert fast.truncated.any() and not fast.truncated.all()
    assert torch.equal(fast.input_ids, slow.input_ids)
    assert torch.equal(fast.attention_mask, slow.attention_mask)
    assert torch.equal(fast.completion_mask, slow.completion_mask)
    assert torch.equal(fast.truncated, slow.truncated) and fast.texts == slow.texts


def test_decode_pads_after_eos_and_stops_when_every_row_has_ended(tiny_model_dir):
    """Rows forced to end at steps 1, 3 and 4: pad after each EOS, and no step after the last."""
    model, tok = _model(tiny_model_dir, "llama")
    enc = encode_prompts(tok, [prompt_text(q) for q in QUESTIONS])
    eos, pad, other = tok.eos_token_id, tok.pad_token_id, 7
    end_at, step = torch.tensor([1, 3, 4]), [0]

    def choose(ids, scores):  # one-hot scores: EOS at the row's step, a fixed token before it
        token = torch.where(end_at == step[0], eos, other)
        step[0] += 1
        return torch.nn.functional.one_hot(token, scores.shape[-1]).float()

    out = decode(model, enc.input_ids, enc.attention_mask, max_new_tokens=10, eos_id=eos, pad_id=pad, choose=choose)
    assert out.tolist() == [[other, eos, pad, pad, pad], [other, other, other, eos, pad], [other] * 4 + [eos]]
    assert step[0] == 5


def test_distinct_prompts():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [4, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])  # row 3: same ids, a real token 0
    prompt_ids, prompt_mask, inverse = distinct_prompts(ids, mask, 3)
    assert len(prompt_ids) == 3
    assert torch.equal(prompt_ids[inverse], ids) and torch.equal(prompt_mask[inverse], mask)
    assert distinct_prompts(ids[1:], mask[1:], 3) is None  # nothing to share


@pytest.mark.parametrize("checkpointed", [False, True], ids=["stored", "checkpointed"])
@pytest.mark.parametrize("kind", ["llama", "llama-gqa", "qwen2"])
def test_shared_prompt_logprobs_and_gradients_equal_one_plain_forward(tiny_model_dir, monkeypatch, kind, checkpointed):
    """Each prompt's keys and values computed once for its G rows: the same log-probs, entropies
    and gradients as the plain forward over every row (fp32 rounding apart), also where every layer
    is recomputed in backward (activation checkpointing keeps the shared prompt)."""
    model, tok = _model(tiny_model_dir, kind)
    rollout = generate(model, tok, PROMPTS, max_new_tokens=9, temperatures=[1.0] * len(PROMPTS), seed=1)
    model.train()
    if checkpointed:
        model.activation_checkpointing_enable()

    def run():
        model.zero_grad()
        logp, entropy = token_logprobs(model, rollout, with_entropy=True)
        (logp * rollout.completion_mask).sum().backward()
        return logp.detach(), entropy, [p.grad.clone() for p in model.parameters()]

    calls = []
    real = fast_decode.distinct_prompts
    monkeypatch.setattr("grpo_core.lm.policy.distinct_prompts", lambda *a: calls.append(1) or real(*a))
    shared = run()
    assert calls  # the shared path ran
    monkeypatch.setattr("grpo_core.lm.policy.distinct_prompts", lambda *a: None)
    plain = run()
    torch.testing.assert_close(shared[0], plain[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(shared[1], plain[1], atol=2e-5, rtol=0)
    for a, b in zip(shared[2], plain[2]):  # summed in a different order: compare whole tensors
        assert (a - b).norm() <= 1e-5 * b.norm() + 1e-7


def test_grouped_attention_without_repeated_keys_gives_transformers_sdpa_numbers(tiny_model_dir, tmp_path):
    """Query heads folded onto their key/value head (``attention.grouped_sdpa``): the log-probs of
    transformers' SDPA with repeated keys and values, gradients equal up to summation order; the
    setting is not saved with the model."""
    from transformers import AutoConfig

    from grpo_core.lm.attention import NAME, use_grouped_sdpa

    model, tok = _model(tiny_model_dir, "llama-gqa")
    rollout = generate(model, tok, PROMPTS, max_new_tokens=9, temperatures=[1.0] * len(PROMPTS), seed=3)

    def run():
        model.zero_grad()
        logp = token_logprobs(model, rollout)
        (logp * rollout.completion_mask).sum().backward()
        return logp.detach(), [p.grad.clone() for p in model.parameters()]

    assert model.config._attn_implementation == "sdpa"
    repeated = run()
    use_grouped_sdpa(model)
    assert model.config._attn_implementation == NAME
    grouped = run()
    torch.testing.assert_close(grouped[0], repeated[0], atol=1e-6, rtol=0)
    for a, b in zip(grouped[1], repeated[1]):
        assert (a - b).norm() <= 1e-5 * b.norm() + 1e-7
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path)._attn_implementation != NAME


def test_one_completion_token_reads_the_prompt_pass_only(tiny_model_dir):
    model, tok = _model(tiny_model_dir, "llama")
    rollout = generate(model, tok, PROMPTS, max_new_tokens=1, temperatures=[1.0] * len(PROMPTS), seed=2)
    assert rollout.completion_ids.shape[1] == 1
    with torch.no_grad():
        shared = token_logprobs(model, rollout)
        plain = (
            CompletionLogprobs(model)
            .model(
                input_ids=rollout.input_ids,
                attention_mask=rollout.attention_mask,
                position_ids=position_ids(rollout.attention_mask),
            )
            .logits[:, -2]
        )
    expected = torch.log_softmax(plain.float(), -1).gather(-1, rollout.completion_ids).squeeze(-1)
    torch.testing.assert_close(shared.squeeze(-1), expected, atol=2e-5, rtol=0)


def test_qwen2_takes_the_transformers_sampler(tiny_model_dir):
    model, tok = _model(tiny_model_dir, "qwen2")
    assert not fast_decode.supports(model)
    r = generate(model, tok, PROMPTS, max_new_tokens=5, temperatures=[1.0] * len(PROMPTS), seed=0)
    assert r.completion_ids.shape[0] == len(PROMPTS)


def test_a_wrapped_reader_is_used_as_is(tiny_model_dir):
    model, tok = _model(tiny_model_dir, "llama")
    rollout = generate(model, tok, PROMPTS[:2], max_new_tokens=4)
    reader = CompletionLogprobs(model)
    with torch.no_grad():
        assert torch.equal(token_logprobs(reader, rollout), token_logprobs(model, rollout))


def _with_eos_that_ends_rows_early(model, tok):
    """A copy of ``tok`` whose EOS is the token that greedy decoding emits early (before its last 2
    steps) in the most rows, short of all of them and never as a first token."""
    plain = generate(model, tok, PROMPTS, max_new_tokens=12).completion_ids
    specials = set(tok.all_special_ids)
    early = {
        c: int((plain[:, 1:10] == c).any(1).sum())
        for c in set(plain[:, 1:10].flatten().tolist()) - specials
        if (plain[:, 0] != c).all()
    }
    best = max((c for c in early if early[c] < len(PROMPTS)), key=lambda c: (early[c], -c))
    tok = copy.deepcopy(tok)
    tok.eos_token = tok.convert_ids_to_tokens(best)
    return tok


@pytest.mark.parametrize("kind", ["llama", "llama-gqa"])
def test_static_step_scores_the_plain_loop(tiny_model_dir, kind):
    """The static-shape step (what a GPU replays as a CUDA graph; here eager on the CPU) reads the
    whole cache under a per-step mask: the same scores as the plain loop to float rounding, and
    the same greedy and sampled tokens, also across rows that end early and left padding. The plain
    loop drops ended rows from its batch (``live``): the rows still decoding score alike."""
    model, tok = _model(tiny_model_dir, kind)
    tok = _with_eos_that_ends_rows_early(model, tok)
    enc = encode_prompts(tok, PROMPTS)
    seen = {False: [], True: []}

    def run(static: bool, sampled: bool):
        from grpo_core.lm.policy import GumbelSampler

        sampler = GumbelSampler([1.0] * len(PROMPTS), list(range(len(PROMPTS))), 12) if sampled else None

        def choose(ids, scores):
            seen[static].append(scores.clone())
            return sampler(None, scores) if sampled else scores

        return decode(
            model,
            enc.input_ids,
            enc.attention_mask,
            max_new_tokens=12,
            eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id,
            choose=choose,
            static=static,
        )

    for sampled in (False, True):
        seen[False].clear()
        seen[True].clear()
        plain, static = run(False, sampled), run(True, sampled)
        assert torch.equal(plain, static)
        assert len(seen[False]) == len(seen[True]) > 1
        ended = [(plain[:, :t] == tok.eos_token_id).any(1) for t in range(len(seen[False]))]
        if not sampled:  # a quarter of the rows left the plain loop's batch before the end
            assert 4 * int(ended[-2].sum()) >= len(PROMPTS)
        for live, a, b in zip((~e for e in ended), seen[False], seen[True]):
            torch.testing.assert_close(a[live], b[live], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("shared", [True, False])
def test_logprobs_read_in_chunks_equal_the_whole_logits(tiny_model_dir, monkeypatch, kind, shared):
    """The head read 5 tokens at a time (``head_logprobs``, each chunk recomputed in backward): the
    same log-probs, entropies and gradients as the model's own forward over the whole [B, T, V]."""
    model, tok = _model(tiny_model_dir, kind)
    rollout = generate(model, tok, PROMPTS, max_new_tokens=9, temperatures=[1.0] * len(PROMPTS), seed=3)
    model.train()
    if not shared:
        monkeypatch.setattr("grpo_core.lm.policy.distinct_prompts", lambda *a: None)

    def run(chunk_bytes):
        model.zero_grad()
        reader = CompletionLogprobs(model, chunk_bytes=chunk_bytes)
        logp, entropy = reader(rollout.input_ids, rollout.attention_mask, rollout.prompt_len, with_entropy=True)
        (logp * rollout.completion_mask).sum().backward()
        return logp.detach(), entropy, [p.grad.clone() for p in model.parameters()]

    chunks, whole = run(5 * 4 * model.config.vocab_size), run(None)
    assert CompletionLogprobs(model).chunk_bytes  # the default reads this model in chunks
    torch.testing.assert_close(chunks[0], whole[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(chunks[1], whole[1], atol=1e-5, rtol=0)
    for a, b in zip(chunks[2], whole[2]):
        assert (a - b).norm() <= 1e-5 * b.norm() + 1e-7


def test_a_head_with_more_than_a_matmul_takes_its_own_forward(tiny_model_dir):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    _, tok = load_model(tiny_model_dir)
    gemma = Gemma2ForCausalLM(
        Gemma2Config(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
        )
    )
    assert gemma.config.final_logit_softcapping and CompletionLogprobs(gemma).chunk_bytes is None

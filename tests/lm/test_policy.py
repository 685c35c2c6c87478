"""Sampling and scoring (grpo_core.lm.policy): seeded reproducibility, log-probs that match what
``generate`` itself computed (left padding, positions), and the completion mask / truncation flags."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from grpo_core.data import prompt_text
from grpo_core.lm.modeling import load_model
from grpo_core.lm.policy import Rollout, completion_mask_from, generate, position_ids, token_logprobs

# Prompts of different lengths, so that the batch is left-padded.
PROMPTS = [prompt_text(q) for q in ("What is 1 + 2?", "What is 13 - 4 + 7 - 2?", "What is 5 + 5 + 5?", "2+2")]


@pytest.fixture
def model_and_tokenizer(tiny_model_dir):
    """The tiny model with its weights spread out (a fresh init emits one repeated token), so that
    greedy completions vary from token to token and from row to row."""
    model, tokenizer = load_model(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return model, tokenizer


# ---------------------------------------------------------------------------- completion_mask_from


def test_completion_mask_hand_made():
    eos = 2
    ids = torch.tensor(
        [
            [5, 6, 2, 0, 0],  # EOS at 2, then padding
            [5, 2, 2, 2, 2],  # pad == eos: only the first EOS counts
            [5, 6, 7, 8, 9],  # no EOS: truncated, every token kept
            [2, 0, 0, 0, 0],  # empty completion: just the EOS
            [2, 2, 5, 2, 6],  # tokens after the first EOS are masked whatever they are
        ]
    )
    mask, truncated = completion_mask_from(ids, eos)
    assert torch.equal(
        mask,
        torch.tensor(
            [
                [1, 1, 1, 0, 0],
                [1, 1, 0, 0, 0],
                [1, 1, 1, 1, 1],
                [1, 0, 0, 0, 0],
                [1, 0, 0, 0, 0],
            ],
            dtype=mask.dtype,
        ),
    )
    assert truncated.tolist() == [False, False, True, False, False]


def test_position_ids_skip_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]


# ---------------------------------------------------------------------------- generate


def test_generate_sampling_is_reproducible_per_seed(model_and_tokenizer):
    model, tok = model_and_tokenizer
    temps = [0.7, 1.0, 0.7, 1.0]
    before = torch.get_rng_state()
    a = generate(model, tok, PROMPTS, max_new_tokens=10, temperatures=temps, seed=5)
    b = generate(model, tok, PROMPTS, max_new_tokens=10, temperatures=temps, seed=5)
    c = generate(model, tok, PROMPTS, max_new_tokens=10, temperatures=temps, seed=6)
    assert torch.equal(a.input_ids, b.input_ids) and a.texts == b.texts
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert not torch.equal(a.input_ids, c.input_ids)
    # Sampling draws from a forked generator: the caller's RNG stream is untouched.
    assert torch.equal(torch.get_rng_state(), before)
    # The global RNG does not leak into the rollout either.
    torch.manual_seed(1234)
    d = generate(model, tok, PROMPTS, max_new_tokens=10, temperatures=temps, seed=5)
    assert torch.equal(a.input_ids, d.input_ids)


def test_generate_layout(model_and_tokenizer):
    model, tok = model_and_tokenizer
    r = generate(model, tok, PROMPTS, max_new_tokens=7)
    assert r.input_ids.shape == (len(PROMPTS), r.prompt_len + r.completion_ids.shape[1])
    assert r.completion_ids.shape[1] <= 7
    # Prompts are left-padded (different lengths) and start with BOS.
    prompt_mask = r.attention_mask[:, : r.prompt_len]
    assert (prompt_mask == 0).any() and prompt_mask[:, -1].all()
    first = prompt_mask.argmax(dim=1)
    assert (r.input_ids[torch.arange(len(PROMPTS)), first] == tok.bos_token_id).all()
    assert torch.equal(r.attention_mask[:, r.prompt_len :].float(), r.completion_mask)
    # generate switches to eval mode for sampling and restores the caller's mode.
    for training in (True, False):
        model.train(training)
        generate(model, tok, PROMPTS[:1], max_new_tokens=2)
        assert model.training is training


def _eos_that_splits_rows(ids: torch.Tensor, specials: set[int]) -> int:
    """A token that appears after the first position in some greedy rows but not in all of them."""
    for c in sorted(set(ids[:, 1:].flatten().tolist()) - specials):
        has = (ids == c).any(dim=1)
        if 0 < int(has.sum()) < ids.shape[0] and (ids[:, 0] != c).all():
            return c
    pytest.skip("no token splits the greedy rows")  # pragma: no cover


def test_greedy_logprobs_match_generate_scores(model_and_tokenizer):
    model, tok = model_and_tokenizer
    tok = copy.deepcopy(tok)
    plain = generate(model, tok, PROMPTS, max_new_tokens=12)
    # Declare as EOS a token that greedy decoding emits mid-way in some rows and never in others:
    # the batch then mixes finished rows (padded after EOS by generate) and truncated ones.
    eos = _eos_that_splits_rows(plain.completion_ids, set(tok.all_special_ids))
    tok.eos_token = tok.convert_ids_to_tokens(eos)
    assert tok.eos_token_id == eos
    r = generate(model, tok, PROMPTS, max_new_tokens=12)
    assert r.truncated.any() and not r.truncated.all()
    assert (r.completion_mask == 0).any()

    enc = tok([tok.bos_token + p for p in PROMPTS], return_tensors="pt", padding=True, add_special_tokens=False)
    assert torch.equal(enc.input_ids, r.input_ids[:, : r.prompt_len])
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=enc.input_ids,
            attention_mask=enc.attention_mask,
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=eos,
            output_scores=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
    width = r.completion_ids.shape[1]
    assert len(out.scores) == width
    scores = torch.stack(out.scores, dim=1).float()  # [B, T, V]
    logits = torch.stack(out.logits, dim=1).float()
    expected = F.log_softmax(scores, dim=-1).gather(-1, r.completion_ids.unsqueeze(-1)).squeeze(-1)
    expected_raw = F.log_softmax(logits, dim=-1).gather(-1, r.completion_ids.unsqueeze(-1)).squeeze(-1)

    with torch.no_grad():
        logp, entropy = token_logprobs(model, r, with_entropy=True)
    assert logp.shape == entropy.shape == r.completion_mask.shape
    m = r.completion_mask.bool()
    torch.testing.assert_close(logp[m], expected[m], atol=1e-5, rtol=0)
    torch.testing.assert_close(logp[m], expected_raw[m], atol=1e-5, rtol=0)
    # Greedy: every kept token is the argmax of its step's scores.
    assert torch.equal(scores.argmax(-1)[m], r.completion_ids[m])
    ent = -(F.softmax(logits, -1) * F.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(entropy[m], ent[m], atol=1e-4, rtol=0)


def test_a_sample_depends_on_its_seed_and_row_id_only(model_and_tokenizer):
    """What lets N processes draw the rollouts one process would: rows 1..3 generated alone (with
    their row ids) equal those rows of the whole batch."""
    model, tok = model_and_tokenizer
    temps = [0.7, 1.0, 0.7, 1.0]
    whole = generate(model, tok, PROMPTS, max_new_tokens=10, temperatures=temps, seed=5)
    part = generate(model, tok, PROMPTS[1:], max_new_tokens=10, temperatures=temps[1:], seed=5, row_ids=[1, 2, 3])
    assert part.texts == whole.texts[1:]
    assert torch.equal(part.completion_mask, whole.completion_mask[1:, : part.completion_mask.shape[1]])


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_gumbel_sampler_draws_from_softmax_of_logits_over_temperature(temperature):
    from grpo_core.lm.policy import GumbelSampler
    from grpo_core.seeds import row_seed

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")])
    n = 20_000
    sampler = GumbelSampler([temperature] * n, [row_seed(3, i) for i in range(n)])
    picks = sampler(None, logits.expand(n, -1)).argmax(-1)
    freq = torch.bincount(picks, minlength=5).float() / n
    expected = torch.softmax(logits / temperature, -1)
    # Binomial standard error <= sqrt(0.25 / 20000) = 0.0035: 5 of them is a 1-in-a-million miss.
    assert torch.allclose(freq, expected, atol=0.018), (freq, expected)
    assert freq[4] == 0  # a masked token is never drawn


# ---------------------------------------------------------------------------- Rollout.distinct


def test_distinct_rows_in_first_occurrence_order():
    """Rows 0 and 2 are one solution, 1 and 4 another; with a key (advantages) that tells 0 from 2
    they stay apart; NaN equals NaN (a row without a reward is still one row)."""
    ids = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 2, 3], [5, 5, 5], [1, 2, 4]])
    rollout = Rollout(ids, torch.ones_like(ids), torch.ones(5, 1), 2, list("abcde"), torch.zeros(5, dtype=torch.bool))
    rows = rollout.distinct()
    assert rows.index.tolist() == [0, 1, 3] and rows.inverse.tolist() == [0, 1, 0, 2, 1]
    assert rows.counts.tolist() == [2, 2, 1] and rows.repeats
    assert rollout.select(rows.index).texts == ["a", "b", "d"]
    assert torch.equal(rollout.select(rows.index).input_ids[rows.inverse], ids)
    keyed = rollout.distinct(torch.tensor([0.5, float("nan"), 0.7, 0.0, float("nan")]))
    assert keyed.index.tolist() == [0, 1, 2, 3] and keyed.counts.tolist() == [1, 2, 1, 1]
    alone = rollout.select(torch.tensor([0, 1, 3])).distinct()
    assert alone.index.tolist() == [0, 1, 2] and not alone.repeats

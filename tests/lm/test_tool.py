"""The calculator in the sampler (grpo_core.lm.tool): a row whose line reaches ``expr =`` gets the
calculator's result forced, in our decode loop and in ``generate`` alike, each row at its own step;
the forced positions are marked, and the rest of the text is the model's."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

from grpo_core.data import prompt_text
from grpo_core.lm.decode import decode
from grpo_core.lm.modeling import load_model
from grpo_core.lm.policy import _transformers_generate, encode_prompts, generate
from grpo_core.lm.tool import CalculatorForcing

# What each scripted row "wants" to write; the calculator corrects row 1's wrong result and row 2's
# text reaches '=' later than row 0's. Row 3 has no arithmetic line.
SCRIPTS = ["3 + 4 = 7\n#### 7", "2 * 6 = 11\n#### 11", "So the sum 10 - 3 = 7\n#### 7", "no sums here"]
WANT = ["3 + 4 = 7\n#### 7", "2 * 6 = 12\n#### 11", "So the sum 10 - 3 = 7\n#### 7", "no sums here"]


class Scripted:
    """One-hot scores: each row's next character of its script (by the length written so far), then EOS."""

    def __init__(self, tok, start: int) -> None:
        self.tok, self.start = tok, start

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, -1e9)
        for i, ids in enumerate(input_ids[:, self.start :].tolist()):
            text = self.tok.decode(ids, skip_special_tokens=True)
            script = SCRIPTS[i]
            nxt = (
                self.tok(script[len(text)], add_special_tokens=False).input_ids[0] if len(text) < len(script) else None
            )
            out[i, self.tok.eos_token_id if nxt is None else nxt] = 0.0
        return out


def _texts(tok, completion: torch.Tensor) -> list[str]:
    return tok.batch_decode(completion, skip_special_tokens=True)


@pytest.mark.parametrize("path", ["decode", "transformers"])
def test_the_calculator_writes_each_rows_result_at_its_own_step(tiny_model_dir, path):
    model, tok = load_model(tiny_model_dir)
    model.eval()
    enc = encode_prompts(tok, [prompt_text("q")] * len(SCRIPTS))
    p = enc.input_ids.shape[1]
    start = 0 if path == "decode" else p
    tool = CalculatorForcing(tok, len(SCRIPTS), start=start)
    processors = LogitsProcessorList([Scripted(tok, start), tool])
    if path == "decode":
        completion = decode(
            model,
            enc.input_ids,
            enc.attention_mask,
            max_new_tokens=40,
            eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id,
            choose=processors,
        )
    else:
        completion = _transformers_generate(model, tok, enc.input_ids, enc.attention_mask, processors, 40)[:, p:]
    texts = _texts(tok, completion)
    assert texts == WANT
    mask = tool.written_mask(completion.shape[1])
    for i, text in enumerate(texts):  # the marked tokens spell the results, after their '='
        written = tok.decode(completion[i][mask[i].bool()])
        expected = {0: " 7", 1: " 12", 2: " 7", 3: ""}[i]
        assert written == expected, (i, written)
    assert mask[3].sum() == 0


def test_generate_with_the_calculator_marks_its_tokens_and_is_reproducible(tiny_model_dir):
    """On a real (random) model: with no arithmetic line the calculator changes nothing, and the same
    seed draws the same tokens and marks twice."""
    model, tok = load_model(tiny_model_dir)
    prompts = [prompt_text("What is 3 + 4?")] * 4
    kw = dict(max_new_tokens=12, temperatures=[1.0] * 4, seed=3)
    plain = generate(model, tok, prompts, **kw)
    a = generate(model, tok, prompts, calculator=True, **kw)
    b = generate(model, tok, prompts, calculator=True, **kw)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.tool_mask, b.tool_mask)
    assert plain.tool_mask is None and a.tool_mask.shape == a.completion_mask.shape
    if a.tool_mask.sum() == 0:
        assert torch.equal(a.input_ids, plain.input_ids)


def test_rows_select_and_cat_keep_the_calculators_marks(tiny_model_dir):
    model, tok = load_model(tiny_model_dir)
    a = generate(model, tok, [prompt_text("a")] * 2, max_new_tokens=3, calculator=True)
    b = generate(model, tok, [prompt_text("bb")] * 2, max_new_tokens=5)
    a.tool_mask[0, 1] = 1.0
    assert a.rows(0, 1).tool_mask.tolist() == [a.tool_mask[0].tolist()]
    assert a.select(torch.tensor([1, 0])).tool_mask[1, 1] == 1.0
    both = type(a).cat([a, b], tok.pad_token_id)
    assert both.tool_mask.shape == both.completion_mask.shape and both.tool_mask.sum() == 1.0
    assert both.tool_mask[0, 1] == 1.0 and type(b).cat([b, b], tok.pad_token_id).tool_mask is None

"""The zero-training verifier (a causal LM's own token probabilities) and the metric GRPO's
group-normalised reward sees (ranking within one question), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_core.rewards.heads import roc_auc, within_question_auc
from grpo_core.rewards.likelihood import likelihood_scores, lowest_logprob, step_lowest_logprobs
from grpo_core.stages.reward_metrics import within_question


def test_within_question_auc_by_hand():
    scores = [0.9, 0.2, 0.5, 0.3, 0.6, 0.4, 0.4, 0.7, 0.7, 0.1]
    labels = [True, False, False, True, False, True, True, True, False, False]
    questions = ["a", "a", "a", "b", "b", "c", "c", "d", "d", "d"]
    # a: the right one above both wrong ones -> 1. b: below -> 0. c: no wrong solution, left out.
    # d: 0.7 against a tied 0.7 (1/2) and 0.1 (1) -> 0.75. Mean over a, b, d: (1 + 0 + 0.75) / 3.
    auc, n = within_question_auc(scores, labels, questions)
    assert n == 3 and auc == pytest.approx(1.75 / 3)
    # Pooled over questions the same scores rank otherwise: a cue shared within a question counts there.
    assert roc_auc(scores, labels) != pytest.approx(auc)
    assert math.isnan(within_question_auc([0.1, 0.2], [True, True], ["a", "a"])[0])


def test_within_question_auc_has_an_interval_over_the_questions():
    """The held-out ranking with its 95% t interval: the questions with right and wrong solutions
    are the sample (the same rows as above: per-question AUCs 1, 0, 0.75)."""
    scores = [0.9, 0.2, 0.5, 0.3, 0.6, 0.4, 0.4, 0.7, 0.7, 0.1]
    labels = [True, False, False, True, False, True, True, True, False, False]
    questions = ["a", "a", "a", "b", "b", "c", "c", "d", "d", "d"]
    got = within_question((scores, labels, questions))
    mean = 1.75 / 3
    std = math.sqrt(((1 - mean) ** 2 + (0 - mean) ** 2 + (0.75 - mean) ** 2) / 2)
    half = 4.302653 * std / math.sqrt(3)  # t(0.975, 2 degrees of freedom)
    assert got["mixed_questions"] == 3 and got["within_question_auc"] == pytest.approx(mean)
    assert got["within_question_auc_low"] == pytest.approx(mean - half, abs=1e-5)
    assert got["within_question_auc_high"] == pytest.approx(mean + half, abs=1e-5)
    one = within_question(([0.9, 0.2], [True, False], ["a", "a"]))  # one question: no spread to read
    assert one["within_question_auc"] == 1.0 and math.isnan(one["within_question_auc_low"])
    none = within_question(([0.1, 0.2], [True, True], ["a", "a"]))
    assert none["mixed_questions"] == 0 and math.isnan(none["within_question_auc"])
    # Against another scorer's AUCs by question: paired over the questions both rank (a, b, d; not z).
    against = within_question((scores, labels, questions), baseline={"a": 0.5, "b": 0.5, "d": 1.0, "z": 0.3})
    diffs = [0.5, -0.5, -0.25]
    mean = sum(diffs) / 3
    half = 4.302653 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2) / math.sqrt(3)
    assert against["within_question_auc_minus_baseline"] == pytest.approx(mean)
    assert against["within_question_auc_minus_baseline_low"] == pytest.approx(mean - half, abs=1e-5)
    assert against["within_question_auc_minus_baseline_high"] == pytest.approx(mean + half, abs=1e-5)


def test_a_step_is_as_sure_as_the_least_likely_token_so_far():
    probs = torch.tensor([[0.9, 0.5, 0.8, 0.3, 0.95, 0.7]])
    logp = probs.log()
    # Steps end at tokens 1, 3, 5: tokens {0, 1}, {2, 3}, {4, 5}, each lowest 0.5, 0.3, 0.7; read so
    # far (a step after a doubtful one is no surer than it) 0.5, 0.3, 0.3.
    ends, mask = torch.tensor([[1, 3, 5]]), torch.tensor([[True, True, True]])
    assert step_lowest_logprobs(logp, ends, mask).exp()[0].tolist() == pytest.approx([0.5, 0.3, 0.3])
    # A surer start does not lift a later step: 0.9 then 0.8 -> 0.9, 0.8.
    assert step_lowest_logprobs(logp[:, [0, 2]], torch.tensor([[0, 1]]), torch.tensor([[True, True]])).exp()[
        0
    ].tolist() == pytest.approx([0.9, 0.8])
    # Two steps and a padding slot: the second step holds tokens 2..5; padding reads log 1.
    ends, mask = torch.tensor([[1, 5, 0]]), torch.tensor([[True, True, False]])
    lowest = step_lowest_logprobs(logp, ends, mask)
    assert lowest.exp()[0].tolist() == pytest.approx([0.5, 0.3, 1.0])
    # A solution is as sure as its least likely token, EOS included (here the last, 0.7, masked in
    # the first row, out in the second); a row without tokens reads log 1.
    completion = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    assert lowest_logprob(logp.expand(3, 6), completion).exp().tolist() == pytest.approx([0.3, 0.5, 1.0])


def test_the_likelihood_verifier_reads_the_models_own_token_probabilities(tiny_model_dir):
    """On a tiny model: each step's score is the lowest of the probabilities the model gives its
    tokens and those of the steps before it, computed independently here from the model's logits."""
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.policy import encode
    from grpo_core.rewards.steps import rollout_step_ends

    model, tok = load_model(tiny_model_dir)
    model.eval()
    rollout = encode(tok, ["What is 2 + 3 - 1?\n", "What is 9 - 4?\n"], ["2 + 3 = 5\n5 - 1 = 4\n#### 4", "#### 5"])
    whole, steps, mask = likelihood_scores(model, tok, rollout, "\n")
    assert mask.sum(dim=1).tolist() == [3, 1]
    with torch.no_grad():
        logits = model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask).logits.float()
    ends, _ = rollout_step_ends(tok, rollout, "\n")
    p = rollout.prompt_len
    for i in range(2):
        for k in range(int(mask[i].sum())):
            end = int(ends[i, k])
            token_p = [logits[i, p + t - 1].softmax(-1)[rollout.input_ids[i, p + t]].item() for t in range(end + 1)]
            assert steps[i, k].item() == pytest.approx(min(token_p), rel=1e-4)
        n = int(rollout.completion_mask[i].sum())  # the whole solution: every token, EOS included
        token_p = [logits[i, p + t - 1].softmax(-1)[rollout.input_ids[i, p + t]].item() for t in range(n)]
        assert whole[i].item() == pytest.approx(min(token_p), rel=1e-4)


def test_the_likelihood_head_is_the_calibrated_zero_training_reading_and_survives_a_save(tmp_path, tiny_model_dir):
    """head: likelihood. A step's logit = scale * (lowest log-probability of its tokens so far) + bias, a
    solution's the same over all its tokens; saved as a causal-LM folder that loads back as the
    same reward model and that ``score`` reads as a PRM."""
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.policy import encode, token_logprobs
    from grpo_core.rewards.heads import load_reward_model, orm_logits, prm_step_logits
    from grpo_core.rewards.likelihood import VerifierHead
    from grpo_core.rewards.steps import rollout_step_ends
    from grpo_core.rewards.score_command import reward_model_kind, score

    lm, tok = load_model(tiny_model_dir)
    head = VerifierHead(lm, "prm", scale=1.5, bias=0.5).eval()
    prompts, texts = ["What is 2 + 3 - 1?\n"], ["2 + 3 = 5\n5 - 1 = 4\n#### 4"]
    rollout = encode(tok, prompts, texts)
    ends, mask = rollout_step_ends(tok, rollout, "\n")
    with torch.no_grad():
        logp = token_logprobs(lm, rollout)
        steps = prm_step_logits(head, rollout, ends)
        whole = orm_logits(head, rollout)
    expected = 1.5 * step_lowest_logprobs(logp, ends, mask) + 0.5
    assert torch.allclose(steps, expected, atol=1e-5) and steps.shape == (1, 3)
    assert whole.item() == pytest.approx(1.5 * lowest_logprob(logp, rollout.completion_mask).item() + 0.5, abs=1e-5)

    head.config.step_separator = "\n"
    head.save_pretrained(tmp_path / "prm")
    tok.save_pretrained(tmp_path / "prm")
    again = load_reward_model(tmp_path / "prm", "prm")
    assert isinstance(again, VerifierHead) and (again.scale.item(), again.bias.item()) == (1.5, 0.5)
    assert reward_model_kind(tmp_path / "prm") == "prm"
    [row] = score(tmp_path / "prm", list(zip(prompts, texts)))
    assert row["step_scores"] == pytest.approx(torch.sigmoid(expected[0]).tolist(), rel=1e-4)


def test_prm_step_metrics_rank_a_prm_by_its_lowest_step_within_a_question():
    """Question a: the right solution's lowest step 0.8 against the wrong one's 0.2 -> 1; question
    b: 0.3 (right) below 0.6 (wrong) -> 0; a solution with no step has no verdict and is left out.
    The wrong solution of a is caught at its first wrong step (the first below 0.5)."""
    from grpo_core.stages.reward_model import prm_step_metrics

    rows = [
        {"prompt": "a", "labels": [True, True], "exact_labels": None},
        {"prompt": "a", "labels": [True, False], "exact_labels": None},
        {"prompt": "a", "labels": [], "exact_labels": None},
        {"prompt": "b", "labels": [True], "exact_labels": None},
        {"prompt": "b", "labels": [False], "exact_labels": None},
    ]
    m = prm_step_metrics([[0.9, 0.8], [0.7, 0.2], [], [0.3], [0.6]], rows)
    assert (m["within_question_auc"], m["mixed_questions"]) == (0.5, 2)
    # b's wrong solution is not caught (0.6 >= 0.5): 1 of the 2 with an error.
    assert m["first_wrong_step_detected"] == 0.5 and m["n_steps"] == 6


def test_the_centred_step_auc_ranks_steps_at_one_position_within_a_question_and_an_outcome():
    """Question a's wrong solutions at step 0: the right step 0.9 above the wrong one's 0.4 -> 1; at
    step 1 both wrong (no ranking); its right solution is a class of its own. Question b's wrong
    ones at step 0: the right step 0.3 below the wrong one's 0.5 -> 0; at step 1 the right step 0.7
    above the wrong 0.6 -> 1, so b's mean is 0.5. Over the 2 questions: 0.75."""
    from grpo_core.stages.reward_metrics import centred_step_auc

    rows = [
        {"prompt": "a", "labels": [True, False]},
        {"prompt": "a", "labels": [False, False]},
        {"prompt": "a", "labels": [True, True]},
        {"prompt": "b", "labels": [True, False, False]},
        {"prompt": "b", "labels": [False, True, False]},
    ]
    m = centred_step_auc([[0.9, 0.2], [0.4, 0.3], [0.1, 0.1], [0.3, 0.6, 0.1], [0.5, 0.7, 0.2]], rows)
    assert (m["step_auc_centred"], m["centred_questions"]) == (0.75, 2)
    assert m["step_auc_centred_low"] < 0.75 < m["step_auc_centred_high"]
    assert math.isnan(centred_step_auc([[0.9]], [{"prompt": "a", "labels": [True]}])["step_auc_centred"])


def test_the_lm_reading_is_math_shepherds_plus_against_minus(tmp_path, tiny_model_dir):
    """head: lm. A step's logit is the LM's logit of "+" minus that of "-" as the token after the
    step's last token (computed here from the full output), the solution's after its last token;
    with the starting calibration (1, 0) that is Math-Shepherd's P(+) / (P(+) + P(-)). Saved and
    loaded back with its reading and tokens."""
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.policy import encode, position_ids
    from grpo_core.rewards.heads import load_reward_model, orm_logits, prm_step_logits
    from grpo_core.rewards.likelihood import VerifierHead
    from grpo_core.rewards.steps import rollout_step_ends

    head = load_reward_model(tiny_model_dir, "prm", "lm").eval()
    lm, tok = load_model(tiny_model_dir)
    plus, minus = tok("+", add_special_tokens=False).input_ids[0], tok("-", add_special_tokens=False).input_ids[0]
    assert (
        isinstance(head, VerifierHead)
        and head.token_ids == (plus, minus)
        and (head.scale.item(), head.bias.item()) == (1, 0)
    )
    rollout = encode(tok, ["What is 2 + 3 - 1?\n", "What is 9 - 4?\n"], ["2 + 3 = 5\n5 - 1 = 4\n#### 4", "#### 5"])
    ends, mask = rollout_step_ends(tok, rollout, "\n")
    with torch.no_grad():
        steps, whole = prm_step_logits(head, rollout, ends), orm_logits(head, rollout)
        logits = lm(
            input_ids=rollout.input_ids,
            attention_mask=rollout.attention_mask,
            position_ids=position_ids(rollout.attention_mask),
        ).logits
    p = rollout.prompt_len
    for i in range(2):
        for k in range(int(mask[i].sum())):
            at = logits[i, p + int(ends[i, k])]
            assert steps[i, k].item() == pytest.approx((at[plus] - at[minus]).item(), abs=1e-4)
            two = at[[plus, minus]].softmax(-1)[0].item()
            assert torch.sigmoid(steps[i, k]).item() == pytest.approx(two, abs=1e-5)
        last = logits[i, p + int(rollout.completion_mask[i].sum()) - 1]
        assert whole[i].item() == pytest.approx((last[plus] - last[minus]).item(), abs=1e-4)

    head.config.step_separator = "\n"
    head.save_pretrained(tmp_path / "prm")
    tok.save_pretrained(tmp_path / "prm")
    again = load_reward_model(tmp_path / "prm", "prm")  # no head named: the folder says which
    assert (again.reading, again.tokens, again.token_ids) == ("lm", ("+", "-"), (plus, minus))


def test_the_lm_reading_needs_two_single_tokens(tiny_model_dir, tiny_cfg, tmp_path):
    from grpo_core.recipe import ConfigError
    from grpo_core.lm.modeling import ModelError
    from grpo_core.rewards.heads import load_reward_model

    with pytest.raises(ModelError, match="'good' is 4 tokens"):
        load_reward_model(tiny_model_dir, "prm", "lm", ("good", "-"))
    with pytest.raises((ConfigError, ValueError), match="lm_tokens=.*applies to head=lm only"):
        tiny_cfg(tmp_path, prm__lm_tokens=["y", "n"])


def test_a_verifier_head_on_grouped_query_attention_is_placed_with_the_same_scores(tmp_path, tiny_model_dir):
    """``runtime.place`` points a reward model's attention at ``grouped_sdpa`` through the head (a
    model with fewer key/value heads than query heads, as SmolLM2: the tiny model has as many);
    the same solution scores, and the saved folder loads back with the same scores."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_core.config.launch import LaunchConfig
    from grpo_core.lm.attention import NAME
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.policy import encode
    from grpo_core.lm.runtime import place
    from grpo_core.rewards.heads import load_reward_model, orm_logits
    from grpo_core.rewards.likelihood import VerifierHead

    _, tok = load_model(tiny_model_dir)
    torch.manual_seed(0)
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    shape |= dict(num_key_value_heads=2)  # grouped: 2 query heads a key/value head
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **shape))
    head = VerifierHead(lm.float(), "orm").eval()
    rollout = encode(tok, ["What is 2 + 3?\n", "What is 12 - 7 + 1?\n"], ["2 + 3 = 5\n#### 5", "12 - 7 = 5\n#### 6"])
    with torch.no_grad():
        before = orm_logits(head, rollout)
        assert place(head, LaunchConfig(device="cpu"), train="reward_model") is head
        assert lm.config._attn_implementation == NAME
        torch.testing.assert_close(orm_logits(head, rollout), before, atol=1e-6, rtol=0)
    head.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again = load_reward_model(tmp_path, "orm")  # transformers' own attention: the same scores
    assert again.config._attn_implementation != NAME
    with torch.no_grad():
        torch.testing.assert_close(orm_logits(again.eval(), rollout), before, atol=1e-6, rtol=0)

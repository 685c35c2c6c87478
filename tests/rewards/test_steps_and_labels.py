"""Solutions as steps (grpo_core.rewards.steps) and reward-model training data (grpo_core.rewards.labels).

Step spans and step-end tokens are checked on hand-indexed strings with the project's character
tokenizer (one token per character, so token t holds character t); the exact arithmetic labels on
"What is 7 + 5 - 9?"; the Math-Shepherd Monte-Carlo labels on a stub completer whose success
probability per step prefix is known, so hard labels (any success) and soft labels (the fraction)
can be predicted. Properties (hypothesis) cover the splitter, step-end tokens, outcome pairs and
the label counts.
"""

from __future__ import annotations

import math

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_core.config import ArithmeticTask
from grpo_core.data import Example, generate_arithmetic, prompt_text
from grpo_core.lm.modeling import char_tokenizer
from grpo_core.rewards.labels import (
    Sampled,
    label_agreement,
    mc_step_labels,
    mc_step_labels_batch,
    outcome_pairs,
    sample_solutions,
    step_rows,
)
from grpo_core.rewards.steps import (
    char_ends_of_tokens,
    exact_step_labels,
    planted_error,
    reference_steps,
    split_steps,
    step_end_tokens,
    step_texts,
)
from grpo_core.verify import is_correct

QUESTION = "What is 7 + 5 - 9?"
GOLD = "3"
STEPS = ["7 + 5 = 12", "12 - 9 = 3", "#### 3"]
# Character offsets of SOLUTION (one line per step, "\n" between):
#   "7 + 5 = 12"  chars  0..9   -> span (0, 10)
#   "\n"          char  10
#   "12 - 9 = 3"  chars 11..20  -> span (11, 21)
#   "\n"          char  21
#   "#### 3"      chars 22..27  -> span (22, 28)
SOLUTION = "\n".join(STEPS)
SPANS = [(0, 10), (11, 21), (22, 28)]
STEP_END_TOKENS = [9, 20, 27]  # the character tokenizer: the token index is the character index

FAST = settings(max_examples=60, deadline=None)  # per test: no global hypothesis profile


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


# ---------------------------------------------------------------------------- split_steps


def test_split_steps_hand_spans():
    assert split_steps(SOLUTION) == SPANS
    assert step_texts(SOLUTION) == STEPS


def test_split_steps_skips_blank_steps_and_trims_whitespace():
    # "  a \n\n \nb  \n" : "  a " -> 'a' at 2; "" and " " skipped; "b  " starts at 8; trailing "" skipped.
    #   offsets: ' '0 ' '1 a2 ' '3 \n4 \n5 ' '6 \n7 b8 ' '9 ' '10 \n11
    text = "  a \n\n \nb  \n"
    assert split_steps(text) == [(2, 3), (8, 9)]
    assert step_texts(text) == ["a", "b"]


def test_split_steps_custom_separators():
    # "\n\n": single newlines stay inside a step.  "1 + 2 = 3\n\n#### 3": "1 + 2 = 3" is chars
    # 0..8 -> (0, 9); "\n\n" is 9..10; "#### 3" is chars 11..16 -> (11, 17).
    # (split_steps's own docstring example says (11, 18): that example is off by one.)
    assert split_steps("1 + 2 = 3\n\n#### 3", "\n\n") == [(0, 9), (11, 17)]
    assert split_steps("1 + 2 = 3\n\n#### 3") == [(0, 9), (11, 17)]  # same spans with "\n"
    assert step_texts("a\nb\n\nc", "\n\n") == ["a\nb", "c"]
    # Math-Shepherd's "ки" tag: "a ки b ки  ки c"
    #   a0 ' '1 к2 и3 ' '4 b5 ' '6 к7 и8 ' '9 ' '10 к11 и12 ' '13 c14  -> the middle piece is blank
    assert split_steps("a ки b ки  ки c", "ки") == [(0, 1), (5, 6), (14, 15)]


@pytest.mark.parametrize("text", ["", "\n", "\n\n\n", "   \n \t "])
def test_split_steps_empty_or_blank_text_has_no_steps(text):
    assert split_steps(text) == []
    assert step_texts(text) == []


def test_split_steps_rejects_empty_separator():
    with pytest.raises(ValueError):
        split_steps("a\nb", "")


@FAST
@given(text=st.text(alphabet="ab \n-к", max_size=40), sep=st.sampled_from(["\n", "\n\n", "ки", "-", " "]))
def test_split_steps_equals_stripped_nonblank_pieces(text, sep):
    """The spans are the stripped non-blank pieces of ``text.split(sep)``, in order, disjoint."""
    spans = split_steps(text, sep)
    assert [text[a:b] for a, b in spans] == [p.strip() for p in text.split(sep) if p.strip()]
    assert all(a < b for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))


# ---------------------------------------------------------------------------- step_end_tokens


def test_char_ends_of_char_tokenizer_count_one_per_token(tok):
    ids = ids_of(tok, SOLUTION)
    assert len(ids) == len(SOLUTION) == 28
    assert list(char_ends_of_tokens(tok, ids)) == list(range(1, 29))  # tokens 0..t decode to t + 1 chars


def test_step_end_tokens_hand_solution(tok):
    """Every step end is the token holding the step's last character: '2' of 12, '3' of = 3, '3'."""
    ids = ids_of(tok, SOLUTION)
    ends = step_end_tokens(char_ends_of_tokens(tok, ids), split_steps(SOLUTION))
    assert ends == STEP_END_TOKENS
    assert [tok.decode([ids[t]]) for t in ends] == ["2", "3", "3"]


def test_step_end_tokens_multi_character_tokens():
    # A BPE-like tokenization of "abcd\nefghi": tokens "abc" "d\ne" "fghi" -> char_ends [3, 6, 10].
    # Step "abcd" = (0, 4): its last char (index 3) lies in token 1 (chars 3..5).
    # Step "efghi" = (5, 10): its last char (index 9) lies in token 2 (chars 6..9).
    assert step_end_tokens([3, 6, 10], [(0, 4), (5, 10)]) == [1, 2]


def test_step_cut_by_truncation_maps_to_last_token(tok):
    # Only the first 15 tokens survived ("7 + 5 = 12\n12 -"): step 0 ends at 9 as before; step 1
    # (last char 20) and step 2 (27) lie past the end and map to the last token, 14.
    ids = ids_of(tok, SOLUTION)[:15]
    assert step_end_tokens(char_ends_of_tokens(tok, ids), SPANS) == [9, 14, 14]
    assert step_end_tokens([], SPANS) == []  # no token at all: no step end


@FAST
@given(text=st.text(alphabet="0123456789 +-=#\n", max_size=40))
def test_step_end_token_holds_last_character_property(text):
    """For any ASCII solution, the step-end token is the span's last character, decoded."""
    tok = char_tokenizer()
    ids = ids_of(tok, text)
    spans = split_steps(text)
    ends = step_end_tokens(char_ends_of_tokens(tok, ids), spans)
    assert ends == [b - 1 for _, b in spans]
    assert all(tok.decode([ids[t]]) == text[b - 1] for t, (_, b) in zip(ends, spans))


# ---------------------------------------------------------------------------- exact labels


def test_reference_steps_left_to_right_chain():
    # 7 + 5 = 12, then 12 - 9 = 3
    assert reference_steps(QUESTION) == [(7, "+", 5, 12), (12, "-", 9, 3)]
    assert reference_steps("What is -7 + 5?") == [(-7, "+", 5, -2)]


def test_exact_labels_all_correct():
    assert exact_step_labels(QUESTION, STEPS, GOLD) == [True, True, True]


def test_exact_labels_first_step_wrong_makes_every_later_step_wrong():
    # 7 + 5 = 13 is wrong; the later lines are each "right" given it but the chain is broken.
    steps = ["7 + 5 = 13", "13 - 9 = 4", "#### 4"]
    assert exact_step_labels(QUESTION, steps, GOLD) == [False, False, False]
    # Even a correct line after the error stays False (labels never recover).
    assert exact_step_labels(QUESTION, ["7 + 5 = 13", "12 - 9 = 3", "#### 3"], GOLD) == [False, False, False]


def test_exact_labels_wrong_final_answer():
    assert exact_step_labels(QUESTION, ["7 + 5 = 12", "12 - 9 = 3", "#### 4"], GOLD) == [True, True, False]


def test_exact_labels_miscopied_operand():
    # Right result of the wrong sum: 7 + 6 = 13 is true arithmetic but not the question's step.
    assert exact_step_labels(QUESTION, ["7 + 6 = 13", "13 - 9 = 4", "#### 4"], GOLD) == [False, False, False]
    # The second operand miscopied in step 2: 12 - 8 = 4.
    assert exact_step_labels(QUESTION, ["7 + 5 = 12", "12 - 8 = 4", "#### 4"], GOLD) == [True, False, False]


def test_exact_labels_early_answer_extra_step_and_prose():
    # Answer before the chain is done: k = 1 < 2 equations.
    assert exact_step_labels(QUESTION, ["7 + 5 = 12", "#### 3"], GOLD) == [True, False]
    # An equation past the end of the chain is wrong.
    assert exact_step_labels(QUESTION, STEPS[:2] + ["3 + 0 = 3", "#### 3"], GOLD) == [True, True, False, False]
    # A prose line is neither an equation of the chain nor an answer.
    assert exact_step_labels(QUESTION, ["7 + 5 = 12", "so", "12 - 9 = 3", "#### 3"], GOLD) == [
        True,
        False,
        False,
        False,
    ]


def test_exact_labels_non_arithmetic_question_is_none():
    assert reference_steps("How many apples does Tom have?") is None
    assert exact_step_labels("How many apples does Tom have?", STEPS, GOLD) is None


@pytest.mark.parametrize(
    "steps",
    [
        ["9" * 100_000 + " + 5 = 12", "#### 3"],  # an operand far past the 12-digit cap
        ["7 + 5 = " + "1" * 13, "#### " + "9" * 10_000],  # 13 digits: not an equation; huge answer
        [" " * 50_000 + "+" * 50_000 + "=", "#" * 100_000],
        ["7 + 5 = 12\x00", "####", "#### \\boxed{" * 1000],
    ],
)
def test_exact_labels_hostile_steps_do_not_crash(steps):
    """Over-long numbers are not equations (12-digit cap) nor answers: every step is False."""
    assert exact_step_labels(QUESTION, steps, GOLD) == [False] * len(steps)


def test_reference_steps_huge_question_operand_is_not_arithmetic():
    """A 5,000-digit operand (past Python's int-string limit) is declined, not crashed on."""
    question = "What is " + "9" * 5000 + " + 1?"
    assert reference_steps(question) is None
    assert exact_step_labels(question, STEPS, GOLD) is None


def test_reference_steps_without_spaces_and_a_negative_first_operand():
    assert reference_steps("What is 7-5?") == [(7, "-", 5, 2)]
    assert reference_steps("What is -3 + 4?") == [(-3, "+", 4, 1)]


def test_exact_label_of_an_unanswered_solution_ends_false():
    """No `####` line: the last step is wrong, as the Monte-Carlo label (whole solution checked) is."""
    assert exact_step_labels("What is 7 + 5 - 9?", ["7 + 5 = 12", "12 - 9 = 3"], "3") == [True, False]


# ---------------------------------------------------------------------------- sampling and pairs


def ex(question: str = QUESTION, gold: str = GOLD) -> Example:
    return Example(question, gold)


def test_sample_solutions_one_call_k_per_question_in_order():
    calls = []

    def complete(prompts):
        calls.append(list(prompts))
        # answer "#### 3" on even positions, "#### 4" on odd ones
        return [f"#### {3 + i % 2}" for i in range(len(prompts))]

    q2 = ex("What is 1 + 3?", "4")
    out = sample_solutions(complete, [ex(), q2], k=3)
    assert calls == [[prompt_text(QUESTION)] * 3 + [prompt_text(q2.question)] * 3]
    # positions 0..5 -> answers 3 4 3 | 4 3 4
    assert [s.completions for s in out] == [["#### 3", "#### 4", "#### 3"], ["#### 4", "#### 3", "#### 4"]]
    assert [s.correct for s in out] == [[True, False, True], [True, False, True]]
    assert [s.example for s in out] == [ex(), q2]


def sampled(completions: list[str], question: str = QUESTION, gold: str = GOLD) -> Sampled:
    return Sampled(Example(question, gold), completions, [is_correct(c, gold) for c in completions])


MIXED = sampled(["#### 3", "#### 3", "12 - 9 = 3\n#### 3", "#### 4", "#### 5"])  # 2 distinct good, 2 bad
ALL_RIGHT = sampled(["#### 4", "1 + 3 = 4\n#### 4"], "What is 1 + 3?", "4")
ALL_WRONG = sampled(["#### 1", "#### 2"], "What is 2 + 2?", "4")


def test_outcome_pairs_only_from_mixed_questions_without_duplicates():
    # good {"#### 3", "12 - 9 = 3\n#### 3"} x bad {"#### 4", "#### 5"} = 4 distinct pairs;
    # the duplicate "#### 3" sample adds none; all-right and all-wrong questions add none.
    rows = outcome_pairs([ALL_RIGHT, MIXED, ALL_WRONG], max_pairs=10, seed=0)
    assert len(rows) == 4
    assert {(r["chosen"], r["rejected"]) for r in rows} == {
        (g, b) for g in ("#### 3", "12 - 9 = 3\n#### 3") for b in ("#### 4", "#### 5")
    }
    for r in rows:
        assert set(r) == {"prompt", "chosen", "rejected"}  # TRL's preference columns
        assert r["prompt"] == prompt_text(QUESTION)
        assert is_correct(r["chosen"], GOLD) and not is_correct(r["rejected"], GOLD)


def test_outcome_pairs_cap_and_determinism():
    rows = outcome_pairs([MIXED], max_pairs=3, seed=7)
    assert len(rows) == 3 and len({(r["chosen"], r["rejected"]) for r in rows}) == 3
    assert outcome_pairs([MIXED], max_pairs=3, seed=7) == rows
    assert outcome_pairs([MIXED], max_pairs=0, seed=7) == []
    # The seed chooses which 1 of the 4 pairs is kept: over 20 seeds more than one is chosen.
    kept = {tuple(outcome_pairs([MIXED], 1, s)[0].values()) for s in range(20)}
    assert len(kept) > 1


@FAST
@given(
    flags=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=4),
    cap=st.integers(0, 5),
    seed=st.integers(0, 100),
)
def test_outcome_pairs_count_property(flags, cap, seed):
    """Per question: min(cap, #distinct good x #distinct bad) rows (answer 0 is right, 1..3 wrong)."""
    samples = [sampled([f"#### {a}" for a in answers], f"What is {i} + 0?", "0") for i, answers in enumerate(flags)]
    rows = outcome_pairs(samples, cap, seed)
    expected = sum(min(cap, len({a for a in f if a == 0}) * len({a for a in f if a != 0})) for f in flags)
    assert len(rows) == expected
    assert len({(r["prompt"], r["chosen"], r["rejected"]) for r in rows}) == len(rows)


# ---------------------------------------------------------------------------- Monte-Carlo step labels


class StubCompleter:
    """Continues a prompt ``prompt_text(q) + prefix`` with "#### <gold>" with probability
    ``p[(q, prefix)]``, else with a wrong answer; seeded, and records every call."""

    def __init__(self, p: dict[tuple[str, str], float], golds: dict[str, str], seed: int = 0):
        self.p, self.golds, self.rng, self.calls = p, golds, random.Random(seed), []

    def __call__(self, prompts: list[str]) -> list[str]:
        self.calls.append(list(prompts))
        out = []
        for prompt in prompts:
            head, prefix = prompt.split("\nAnswer:\n", 1)
            q = head.removeprefix("Question: ")
            gold = self.golds[q]
            out.append(f"#### {gold}" if self.rng.random() < self.p[(q, prefix)] else f"#### {gold}1")
        return out


def prefix_probs(question: str, steps: list[str], ps: list[float], sep: str = "\n") -> dict:
    return {(question, sep.join(steps[: k + 1]) + sep): p for k, p in enumerate(ps)}


@pytest.mark.parametrize("ps", [[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
def test_mc_labels_exact_for_certain_outcomes(ps):
    """p in {0, 1}: soft labels are exactly p, hard labels p == 1; last step = whole solution."""
    stub = StubCompleter(prefix_probs(QUESTION, STEPS, ps), {QUESTION: GOLD})
    hard, soft = mc_step_labels(stub, prompt_text(QUESTION), STEPS, GOLD, n=5)
    assert soft == ps + [1.0]  # "7 + 5 = 12\n12 - 9 = 3\n#### 3" is correct
    assert hard == [p == 1.0 for p in ps] + [True]


def test_mc_labels_soft_is_fraction_close_to_p():
    # n = 2000: the binomial std of the fraction is sqrt(p (1 - p) / n) <= 0.0112; allow ~4 std.
    ps = [0.3, 0.8]
    stub = StubCompleter(prefix_probs(QUESTION, STEPS, ps), {QUESTION: GOLD}, seed=1)
    hard, soft = mc_step_labels(stub, prompt_text(QUESTION), STEPS, GOLD, n=2000)
    assert soft[:2] == pytest.approx(ps, abs=0.045)
    assert all(s * 2000 == round(s * 2000) for s in soft)  # fractions of n
    assert hard == [True, True, True]  # any success of 2000 makes the hard label True


def test_mc_labels_hard_is_any_success():
    # A deterministic completer: exactly one success in n = 4 for step 0, none for step 1.
    def complete(prompts):
        out, seen = [], {}
        for pr in prompts:
            k = pr.count("\n") - 3  # "Question: ..\nAnswer:\n" has 2 newlines, prefix k has k + 1
            seen[k] = seen.get(k, 0) + 1
            out.append("#### 3" if (k == 0 and seen[k] == 1) else "#### 0")
        return out

    hard, soft = mc_step_labels(complete, prompt_text(QUESTION), STEPS, GOLD, n=4)
    assert soft == [0.25, 0.0, 1.0]  # 1/4, 0/4, whole solution correct
    assert hard == [True, False, True]


def test_mc_last_step_is_whole_solution_correctness_without_rollouts():
    stub = StubCompleter(prefix_probs(QUESTION, STEPS, [1.0, 1.0]), {QUESTION: GOLD})
    wrong = ["7 + 5 = 12", "12 - 9 = 3", "#### 4"]
    stub.p.update(prefix_probs(QUESTION, wrong, [1.0, 1.0]))
    hard, soft = mc_step_labels(stub, prompt_text(QUESTION), wrong, GOLD, n=3)
    assert (hard[-1], soft[-1]) == (False, 0.0)  # even though every rollout from step 2 succeeds
    # n rollouts for each of the K - 1 = 2 first steps, none from the whole solution
    assert len(stub.calls) == 1 and len(stub.calls[0]) == 3 * 2
    assert all(not p.endswith("#### 4\n") for p in stub.calls[0])
    # A one-step solution needs no rollout at all.
    stub.calls.clear()
    assert mc_step_labels(stub, prompt_text(QUESTION), ["#### 3"], GOLD, n=3) == ([True], [1.0])
    assert stub.calls == []


def test_mc_labels_batch_one_call_and_per_item_labels():
    q2, gold2 = "What is 2 + 2?", "4"
    steps2 = ["2 + 2 = 5", "#### 5"]
    p = {**prefix_probs(QUESTION, STEPS, [1.0, 0.0]), **prefix_probs(q2, steps2, [0.0])}
    stub = StubCompleter(p, {QUESTION: GOLD, q2: gold2})
    items = [(prompt_text(QUESTION), STEPS, GOLD), (prompt_text(q2), steps2, gold2), (prompt_text(q2), [], gold2)]
    out = mc_step_labels_batch(stub, items, n=3)
    assert len(stub.calls) == 1 and len(stub.calls[0]) == 3 * 2 + 3 * 1  # (K - 1) * n per item
    assert out == [([True, False, True], [1.0, 0.0, 1.0]), ([False, False], [0.0, 0.0]), ([], [])]


def test_mc_labels_custom_separator():
    # With "\n\n" the prefixes and the whole solution are joined by "\n\n".
    stub = StubCompleter(prefix_probs(QUESTION, STEPS, [1.0, 0.0], sep="\n\n"), {QUESTION: GOLD})
    hard, soft = mc_step_labels(stub, prompt_text(QUESTION), STEPS, GOLD, n=2, separator="\n\n")
    assert (hard, soft) == ([True, False, True], [1.0, 0.0, 1.0])
    assert stub.calls[0][0] == prompt_text(QUESTION) + "7 + 5 = 12\n\n"


# ---------------------------------------------------------------------------- step rows


STEP_COLUMNS = {"prompt", "completions", "labels", "soft_labels", "exact_labels", "completion"}


def test_step_rows_exact_labeler():
    """complete=None: labels are the exact ones; duplicates and step-less completions give no row."""
    wrong = "7 + 5 = 13\n13 - 9 = 4\n#### 4"
    s = sampled([SOLUTION, SOLUTION, "", "\n\n", wrong])
    rows = step_rows([s], None, n=4, separator="\n")
    # sorted distinct texts with a step: SOLUTION ('7 + 5 = 12...') < wrong ('7 + 5 = 13...')
    assert [r["completions"] for r in rows] == [STEPS, ["7 + 5 = 13", "13 - 9 = 4", "#### 4"]]
    assert [r["labels"] for r in rows] == [[True, True, True], [False, False, False]]
    assert [r["soft_labels"] for r in rows] == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert [r["exact_labels"] for r in rows] == [r["labels"] for r in rows]
    assert all(set(r) == STEP_COLUMNS and r["prompt"] == prompt_text(QUESTION) for r in rows)


def test_step_rows_exact_labeler_rejects_non_arithmetic():
    s = sampled(["Tom has 3.\n#### 3"], "How many apples does Tom have?", "3")
    with pytest.raises(ValueError, match="labeler=exact"):
        step_rows([s], None, n=2, separator="\n")


def test_step_rows_mc_labeler():
    wrong = ["7 + 5 = 12", "12 - 9 = 4", "#### 4"]
    other = "How many apples does Tom have?"
    p = {
        **prefix_probs(QUESTION, STEPS, [1.0, 1.0]),
        **prefix_probs(QUESTION, wrong, [1.0, 0.0]),
        **prefix_probs(other, ["Tom has 3.", "#### 3"], [1.0]),
    }
    stub = StubCompleter(p, {QUESTION: GOLD, other: "3"})
    samples = [sampled([SOLUTION, "\n".join(wrong)]), sampled(["Tom has 3.\n#### 3"], other, "3")]
    rows = step_rows(samples, stub, n=2, separator="\n")
    assert len(stub.calls) == 1
    assert [r["labels"] for r in rows] == [[True, True, True], [True, False, False], [True, True]]
    assert [r["soft_labels"] for r in rows] == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0]]
    # The checker's labels where the question is arithmetic, [] otherwise.
    assert [r["exact_labels"] for r in rows] == [[True, True, True], [True, False, False], []]


def test_label_agreement_hand_computed():
    rows = [
        {"labels": [True, True, False], "exact_labels": [True, False, False]},  # (T,T) (T,F) (F,F)
        {"labels": [False], "exact_labels": [True]},  # (F,T)
        {"labels": [True, True], "exact_labels": []},  # not arithmetic: ignored
    ]
    # 4 compared steps: agree on (T,T), (F,F) -> 2/4; MC True / exact False once; the reverse once.
    assert label_agreement(rows) == {
        "mc_exact_agreement": 0.5,
        "mc_true_exact_false": 0.25,
        "mc_false_exact_true": 0.25,
        "steps_compared": 4.0,
    }
    assert label_agreement([rows[2]]) == {} and label_agreement([]) == {}


def test_step_ends_decode_only_a_logarithmic_number_of_prefixes(tok):
    """The binary search asks for O(K log T) prefix lengths, not all T (quadratic at 1k tokens)."""
    text = "\n".join(f"{i} + 1 = {i + 1}" for i in range(40)) + "\n#### 40"
    ends = char_ends_of_tokens(tok, ids_of(tok, text))
    idx = step_end_tokens(ends, split_steps(text))
    assert [text[ends[i] - 1] for i in idx[:3]] == ["1", "2", "3"]
    probes = 41 * math.ceil(math.log2(len(ends)) + 1)  # 41 steps x (log2(T) + 1) bisection probes
    assert len(ends.cache) <= probes
    text = "1 + 1 = 2\n" + "x" * 3000 + "\n#### 2"  # one long step: a handful of decodes, not 3,000
    ends = char_ends_of_tokens(tok, ids_of(tok, text))
    step_end_tokens(ends, split_steps(text))
    assert len(ends.cache) <= 3 * (math.log2(len(ends)) + 1)


def chain_continuer(success: float, seed: int = 0):
    """A policy on the arithmetic task that finishes a solution from its prefix: on track (the
    prefix is the reference chain's first lines) it writes the rest and the right answer with
    probability ``success``, else a wrong answer; after an error it never recovers."""
    rng = random.Random(seed)

    def complete(prompts: list[str]) -> list[str]:
        out = []
        for prompt in prompts:
            head, prefix = prompt.split("\nAnswer:\n", 1)
            chain = reference_steps(head.removeprefix("Question: "))
            reference = [f"{a} {op} {b} = {c}" for a, op, b, c in chain]
            lines = prefix.split("\n")[:-1]
            on_track = lines == reference[: len(lines)]
            answer = chain[-1][3]
            out.append(
                "\n".join(reference[len(lines) :] + [f"#### {answer}"])
                if on_track and rng.random() < success
                else f"#### {answer + 1}"
            )
        return out

    return complete


@pytest.mark.parametrize(("success", "n", "floor"), [(1.0, 1, 1.0), (0.6, 8, 0.99)])
def test_mc_labels_agree_with_the_exact_labeller(success, n, floor):
    """Monte-Carlo labels from a policy that never recovers from an error are the exact labels (a
    step is right while the chain is): all of them with a sure continuer, at least 99% with one that
    finishes a right prefix 60% of the time (a right step is missed with probability 0.4^8).
    Questions of 3-6 operands; per question its worked solution and three with a planted error;
    solutions of one question share their common prefixes' rollouts."""
    task = ArithmeticTask(operand_counts=(3, 4, 5, 6), n_sft=60, n_rl=1, n_val=1, n_test=1)
    rng = random.Random(0)
    samples = [
        Sampled(e, [e.solution] + [planted_error(e.question, rng) for _ in range(3)], [True, False, False, False])
        for e in generate_arithmetic(task, seed=0)["sft"]
    ]
    calls = []
    continuer = chain_continuer(success)
    rows = step_rows(samples, lambda prompts: calls.append(len(prompts)) or continuer(prompts), n, "\n")
    agreement = label_agreement(rows)
    assert agreement["steps_compared"] > 500 and agreement["mc_exact_agreement"] >= floor
    prefixes = {
        (r["prompt"], "\n".join(r["completions"][: k + 1])) for r in rows for k in range(len(r["completions"]) - 1)
    }
    assert calls == [n * len(prefixes)] and len(prefixes) < sum(len(r["completions"]) - 1 for r in rows)

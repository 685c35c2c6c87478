"""The calculator: exact values of a line's arithmetic, what it writes after ``=``, and silence
(None) on everything outside its bounds, hostile text included, without an exception."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from grpo_core.calculator import evaluate, line_result, tool_form, written


@pytest.mark.parametrize(
    "expression, value",
    [
        ("7 + 2", 9),
        ("7 - 9", -2),
        ("3 * 4 + 2", 14),  # precedence
        ("3 * (4 + 2)", 18),
        ("10 / 4", Fraction(5, 2)),
        ("10 / 4 * 2", 5),  # left to right
        ("8 - 3 - 2", 3),
        ("-4 + 1", -3),
        ("2 - -3", 5),
        ("2 ^ 10", 1024),
        ("2 ** -2", Fraction(1, 4)),
        ("1,250 + 750", 2000),  # thousands separators
        ("0.5 * 12", 6),
        (".25 * 8", 2),
        ("6 × 7", 42),
        ("84 ÷ 2", 42),
        ("-2 ** 2", -4),  # a sign binds looser than a power, as on paper
        ("-2 ^ 2", -4),
        ("(-2) ** 2", 4),
        ("2 * 3 ** 2", 18),
        ("3 * -2", -6),
    ],
)
def test_evaluate_is_exact(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "value, text",
    [
        (Fraction(9), "9"),
        (Fraction(-4), "-4"),
        (Fraction(5, 2), "2.5"),
        (Fraction(-1, 8), "-0.125"),
        (Fraction(7, 3), "2.333333"),
        (Fraction(2, 3), "0.666667"),
        (Fraction(0), "0"),
        (Fraction(-1, 3), "-0.333333"),
    ],
)
def test_written_like_a_calculator(value, text):
    assert written(value) == text


@pytest.mark.parametrize(
    "so_far, writes",
    [
        ("7 + 2 =", " 9"),
        ("7 + 2 = ", "9"),
        ("Question: what?\nAnswer:\n3 + 4 = 7\n7 * 2 =", " 14"),  # the last line only
        ("So 12 - 5 =", " 7"),  # words before the arithmetic
        ("So, 12 / 4 =", " 3"),
        ("She has 7 apples + 3 =", None),  # no operator between two numbers in the suffix
        ("x =", None),
        ("7 =", None),  # no operator: nothing to compute
        ("7 + 2 = 9", None),  # the line does not end with "="
        ("7 + 2 ==", None),
        ("1 / 0 =", None),  # silent: the model writes the line itself
        ("7 + 2 =\n", None),  # a new line has begun
        ("1e5 + 1 =", None),  # begins inside a number the calculator does not read
        ("x2 + 3 =", None),  # inside a word
        ("x - 3 + 2 =", None),  # an operator after a word: its left operand is not arithmetic
        ("apples - 5 * 2 =", None),
        ("Total: -3 + 5 =", " 2"),  # a sign after a colon or "=" is the number's own
        ("6 - 8 = -2 * 3 =", " -6"),
        ("-3 + 5 =", " 2"),  # a sign at the line's start is the number's own
        ("He had 12 - 5 =", " 7"),
    ],
)
def test_line_result_writes_after_an_expression_and_equals(so_far, writes):
    assert line_result(so_far) == writes


# At least 15 hostile expressions (issue: hostile catalogue), each answered (None or a value) with no exception.
HOSTILE = [
    "10**10**10",  # a power tower
    "9 ^ 9 ^ 9",
    "2 ** 100000",  # a huge exponent
    "99999999999999999 ** 64",  # a large base to the largest exponent
    "1 / 0",
    "5 / (3 - 3)",
    "0 ** -1",
    "(" * 5000 + "1" + ")" * 5000,  # deep nesting
    "(" * 17 + "1" + ")" * 17,  # one level past the bound
    "-" * 5000 + "1",  # a run of unary signs
    "1" * 300 + " + 1",  # a 300-digit literal
    "123456789012345678901234567890 * 98765432109876543210",
    "1 + " * 200 + "1",  # past the length bound
    "٣ + ٤",  # Arabic-Indic digits
    "３ + ４",  # full-width digits
    "1e999999 + 1",  # exponent notation is not read
    "__import__('os').system('true') + 1",
    "(1 + 2",  # unbalanced
    "1 + 2)",
    "1 ++ 2 **",
    "\x00 1 + 1",
    "1.5 ** 0.5",  # a fractional exponent
    "",
]


@pytest.mark.parametrize("expression", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_expressions_get_silence_or_a_value_without_an_exception(expression):
    start = time.perf_counter()
    value = evaluate(expression)
    said = line_result("Answer:\n" + expression + " =")
    elapsed = time.perf_counter() - start
    assert value is None or isinstance(value, Fraction)
    assert said is None or isinstance(said, str)
    assert elapsed < 1.0  # a bound against a hang; the 10 ms figure is bench/calculator.py's
    assert len(HOSTILE) >= 15


def test_a_value_past_the_result_bound_is_refused_and_one_inside_is_computed():
    assert evaluate("2 ** 64") == 2**64
    assert evaluate("10 ** 64") is None  # 65 digits > the result bound
    assert evaluate("123456789 * 987654321") == 123456789 * 987654321


@pytest.mark.parametrize(
    "text, form, written",
    [
        ("3 + 4 = 7\n7 * 2 = 14\n#### 14", "3 + 4 = 7\n7 * 2 = 14\n#### 14", [" 7", " 14"]),
        ("2 * 6 = 11\n#### 11", "2 * 6 = 12\n#### 11", [" 12"]),  # a wrong result replaced
        ("7 + 2 =9", "7 + 2 = 9", [" 9"]),
        ("7 / 3 = 2.33\n#### 2.33", "7 / 3 = 2.333333\n#### 2.33", [" 2.333333"]),
        ("x = 5\nso 5 = 5", "x = 5\nso 5 = 5", []),  # nothing computed
        ("a == b", "a == b", []),
        ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 24", "Natalia sold 48/2 = 24 clips.\n#### 24", [" 24"]),
        ("0.2 x 50 = $<<0.2*50=10>>10", "0.2 x 50 = $10", []),  # GSM8K's note dropped; "x" is not read
        # A chain is written as the sampler would force it: the result after each "expr =".
        ("7 + 2 = 9 + 1 = 10", "7 + 2 = 9 + 1 = 10", [" 9", " 10"]),
        ("7 + 2 = 3 * 3 = 9", "7 + 2 = 9 * 3 = 27", [" 9", " 27"]),
    ],
)
def test_tool_form_is_the_text_the_sampler_would_write(text, form, written):
    out, spans = tool_form(text)
    assert out == form and [out[a:b] for a, b in spans] == written

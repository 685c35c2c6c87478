"""Answer checking for untrusted model text: extraction plus numeric comparison, nothing executed.

No ``eval``, ``sympify`` or ``parse_expr``: numbers are matched by strict regular expressions with a
digit cap and compared as exact fractions, so every call is linear in the input and bounded.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_ANSWER_CHARS = 200  # an extracted answer longer than this is not a number we compare
MAX_DIGITS = 60  # caps Fraction arithmetic; real answers are far shorter

_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_FRACTION = re.compile(r"(-?\d+)\s*/\s*(\d+)")
_LATEX_FRAC = re.compile(r"(-?)\\[dt]?frac\{\s*(-?\d+)\s*\}\{\s*(\d+)\s*\}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces (scan bounded by the text)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth, out = 1, []
    for ch in text[i : i + 4 * MAX_ANSWER_CHARS]:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return "".join(out).strip()
        out.append(ch)
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: after the last ``####`` (first line), else the last
    ``\\boxed{}``. None when there is neither, or the answer is empty or absurdly long."""
    if not isinstance(text, str):
        return None
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        answer = tail.splitlines()[0].strip() if tail else ""
    else:
        answer = _boxed(text) or ""
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    return answer


def _clean(answer: str) -> str:
    s = answer.strip().replace("\\!", "").replace("\\,", "").replace(" ", "")
    s = _THOUSANDS.sub("", s)
    s = s.strip("$").removesuffix("\\%").removesuffix("%").rstrip(".")
    s = s.removeprefix("+")
    for wrapper in ("\\text{", "\\mathrm{"):
        if s.startswith(wrapper) and s.endswith("}"):
            s = s[len(wrapper) : -1]
    return s


def to_number(answer: str) -> Fraction | None:
    """Exact value of an integer, decimal, ``a/b`` or ``\\frac{a}{b}``; None if not such a number."""
    s = _clean(answer)
    if len(s) > MAX_DIGITS + 3:
        return None
    if _NUMBER.fullmatch(s):
        return Fraction(s)
    for pattern in (_FRACTION, _LATEX_FRAC):
        m = pattern.fullmatch(s)
        if m:
            groups = m.groups()
            sign = -1 if len(groups) == 3 and groups[0] == "-" else 1
            num, den = int(groups[-2]), int(groups[-1])
            return None if den == 0 else sign * Fraction(num, den)
    return None


def answers_match(predicted: str, gold: str) -> bool:
    """Numeric equality when both are numbers, else equality of the cleaned strings."""
    p, g = to_number(predicted), to_number(gold)
    if p is not None and g is not None:
        return p == g
    return _clean(predicted) == _clean(gold) and bool(_clean(gold))


def is_correct(completion: str, gold: str) -> bool:
    """Does the completion's final answer equal ``gold`` (a bare answer or a GSM8K solution)?"""
    predicted = extract_answer(completion)
    if predicted is None:
        return False
    gold_answer = extract_answer(gold) if ("####" in gold or "\\boxed{" in gold) else gold.strip()
    return gold_answer is not None and answers_match(predicted, gold_answer)

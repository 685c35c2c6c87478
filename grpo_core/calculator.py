"""The calculator the model calls while it writes: the arithmetic at the end of a line that reaches
``=`` (``7 + 2 =`` -> ``9``), computed exactly on untrusted text, nothing executed.

No ``eval``, no ``ast``, no ``sympy``: a small recursive-descent parser over ASCII digits and
``+ - * / ^ ** ( )`` (and ``×``, ``÷``), exact ``Fraction`` arithmetic, and a bound on everything
that could grow: the expression's length, its nesting, a literal's digits, an exponent, and every
intermediate result's digits. Whatever falls outside (a division by zero, ``10**10**10``, a
300-digit number, a digit that is not ASCII) gives None: the calculator stays silent and the model
writes the line itself. Each call is linear in its (capped) input.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

MAX_CHARS = 120  # the longest expression read: a line's arithmetic is short
MAX_DEPTH = 16  # nested parentheses and unary signs
MAX_LITERAL_DIGITS = 18  # one number as written
MAX_RESULT_DIGITS = 40  # every intermediate value's numerator and denominator
MAX_EXPONENT = 64  # |n| in a ** n; the base's digits times it also stays under MAX_RESULT_DIGITS
DECIMALS = 6  # a non-terminating quotient is written rounded to this many places

_OPERATORS = {"×": "*", "÷": "/", "^": "**"}
_TOKEN = re.compile(r"\s*(\*\*|\d+(?:\.\d+)?|\.\d+|[-+*/()])")
# The characters an expression may hold: a line's arithmetic is its longest suffix of these.
_EXPRESSION_CHARS = re.compile(r"[0-9.,+\-*/()×÷^ \t]*$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_AFTER_A_WORD = re.compile(r"[^\W\d_]\s*$")  # text that ends with a letter (and spaces)


class _Refused(Exception):
    """Outside the calculator's bounds: the caller gets None."""


def _tokens(text: str) -> list[str]:
    for alias, op in _OPERATORS.items():
        text = text.replace(alias, op)
    out, i = [], 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            if text[i:].strip():
                raise _Refused(f"unreadable at {i}")
            break
        out.append(m.group(1))
        i = m.end()
    return out


def _bounded(x: Fraction) -> Fraction:
    if max(abs(x.numerator), x.denominator).bit_length() > MAX_RESULT_DIGITS * 3.33:
        raise _Refused("result too large")
    return x


class _Parser:
    """expr := term (('+' | '-') term)*; term := unary (('*' | '/') unary)*;
    unary := ('-' | '+') unary | power; power := atom ('**' signed)?  (no chains: ``2**3**2`` is
    refused; a sign binds looser than a power, as written on paper: ``-2**2`` is -4);
    signed := ('-' | '+') signed | atom; atom := number | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise _Refused("ends early")
        self.i += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op, right = self.take(), self.term()
            value = _bounded(value + right if op == "+" else value - right)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op, right = self.take(), self.unary()
            if op == "/" and right == 0:
                raise _Refused("division by zero")
            value = _bounded(value * right if op == "*" else value / right)
        return value

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() != "**":
            return base
        self.take()
        exponent = self.signed(self.atom)
        if self.peek() == "**":
            raise _Refused("chained powers")
        if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
            raise _Refused("exponent")
        if base == 0 and exponent < 0:
            raise _Refused("division by zero")
        size = max(abs(base.numerator), base.denominator).bit_length() * abs(int(exponent))
        if size > MAX_RESULT_DIGITS * 3.33:
            raise _Refused("result too large")
        return base ** int(exponent)

    def unary(self) -> Fraction:
        return self.signed(self.power)

    def signed(self, then: Callable[[], Fraction]) -> Fraction:
        """Leading signs, then ``then`` (a power, or an exponent's atom)."""
        if self.peek() in ("-", "+"):
            self.nest()
            sign = -1 if self.take() == "-" else 1
            value = sign * self.signed(then)
            self.depth -= 1
            return value
        return then()

    def atom(self) -> Fraction:
        tok = self.take()
        if tok == "(":
            self.nest()
            value = self.expr()
            if self.take() != ")":
                raise _Refused("unbalanced")
            self.depth -= 1
            return value
        if tok[0].isdigit() or tok[0] == ".":
            if sum(c.isdigit() for c in tok) > MAX_LITERAL_DIGITS:
                raise _Refused("literal too long")
            return Fraction(tok)
        raise _Refused(f"unexpected {tok!r}")

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused("too deep")


def evaluate(expression: str) -> Fraction | None:
    """The exact value of an arithmetic ``expression``, or None where it is not one the calculator
    reads within its bounds (the module docstring)."""
    text = _THOUSANDS.sub("", expression.strip())
    if not text or len(text) > MAX_CHARS or any(ord(c) > 127 and c not in _OPERATORS for c in text):
        return None
    try:
        tokens = _tokens(text)
        parser = _Parser(tokens)
        value = parser.expr()
        if parser.peek() is not None:
            return None
        return value
    except _Refused:
        return None


def written(value: Fraction) -> str:
    """``value`` as a calculator shows it: an integer bare (``9``, ``-4``), a terminating decimal
    exactly (``2.5``), anything else rounded to ``DECIMALS`` places (``2.333333``)."""
    if value.denominator == 1:
        return str(value.numerator)
    scaled = value * 10**DECIMALS
    exact = scaled.denominator == 1
    digits = scaled.numerator if exact else round(scaled)
    sign, digits = ("-" if digits < 0 else ""), abs(digits)
    whole, frac = divmod(digits, 10**DECIMALS)
    frac_text = f"{frac:0{DECIMALS}d}".rstrip("0")
    return f"{sign}{whole}.{frac_text}" if frac_text else f"{sign}{whole}"


def line_result(text: str) -> str | None:
    """What the calculator writes after ``text``, a completion so far, or None where it stays
    silent: when ``text``'s last line ends with ``=`` (and optional spaces) after an arithmetic
    expression with at least one operator, that expression's value (``written``), with a leading
    space where the line has none after its ``=``. ``So 7 + 2 =`` -> ``" 9"``; ``7 + 2 = `` ->
    ``"9"``; ``x =`` or ``7 =`` -> None."""
    line = text[text.rfind("\n") + 1 :]
    stripped = line.rstrip(" ")
    if not stripped.endswith("=") or stripped.endswith("==") or len(stripped) > 4 * MAX_CHARS:
        return None
    before = stripped[:-1]
    suffix = _EXPRESSION_CHARS.search(before)
    start = suffix.start() + len(suffix.group()) - len(suffix.group().lstrip(" \t,"))
    if start > 0 and (before[start - 1].isalnum() or before[start - 1] == "_"):
        return None  # the arithmetic begins inside a word or a number we do not read (x2, 1e5)
    candidate = before[start:].strip()
    if candidate[:1] in ("+", "-") and _AFTER_A_WORD.search(before[:start]):
        return None  # an operator after a word: its left operand is not arithmetic (``apples - 5 * 2 =``)
    if not re.search(r"\d", candidate) or not re.search(r"\d\s*(?:[-+*/^×÷]|\*\*)\s*[-+(.\d]", candidate):
        return None
    value = evaluate(candidate)
    if value is None:
        return None
    return written(value) if line != stripped else " " + written(value)


_WRITTEN_RESULT = re.compile(r" ?-?\d[\d,]*(?:\.\d+)?")
_GSM8K_ANNOTATION = re.compile(r"<<[^<>\n]{0,200}>>")  # 48/2 = <<48/2=24>>24: the calculator's own note


def tool_form(text: str) -> tuple[str, list[tuple[int, int]]]:
    """A worked solution as the calculator would have written it, and the character spans it wrote:
    after each ``expr =`` it computes (``line_result``), the number written there is replaced by
    the calculator's (``7 + 2 =9`` -> ``7 + 2 = 9``; a wrong ``= 8`` -> ``= 9``), and GSM8K's
    calculator annotations are dropped (``48/2 = <<48/2=24>>24`` -> ``48/2 = 24``). SFT on this text
    learns the lines the model writes, not the results (the spans are left out of its loss)."""
    text = _GSM8K_ANNOTATION.sub("", text)
    out, spans, i = "", [], 0
    while (k := text.find("=", i)) >= 0:
        out += text[i : k + 1]
        i = k + 1
        result = line_result(out)
        if result is None:
            continue
        old = _WRITTEN_RESULT.match(text, i)
        i = old.end() if old else i
        spans.append((len(out), len(out) + len(result)))
        out += result
    return out + text[i:], spans

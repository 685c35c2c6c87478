"""Text normalisation shared by the classifier and decontamination.

Lower-case, one line, and math kept: operators, brackets, digits and LaTeX commands become tokens of
their own (``x^2+1=5`` -> ``x ^ 2 + 1 = 5``, ``\\frac{a}{b}`` -> ``\\frac { a } { b }``), so that
fastText's word n-grams see the notation that tells a math page from another page, and so that
``2+2`` and ``2 + 2`` are the same 10-gram.
"""
from __future__ import annotations

import re
import unicodedata

# A LaTeX command, a number, a word, or any single other visible character (operators, brackets, $).
_TOKEN = re.compile(r"\\[a-zA-Z]+|\d+(?:\.\d+)?|[^\W\d_]+|[^\s\w]", re.UNICODE)


def tokens(text: str) -> list[str]:
    """The normalised tokens of ``text`` (NFKC, lower case)."""
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).lower())


def normalize(text: str) -> str:
    """``text`` as one line of space-separated tokens (what fastText trains and predicts on)."""
    return " ".join(tokens(text))


def words(text: str) -> list[str]:
    """The tokens that carry words or numbers (punctuation dropped): the units of decontamination's
    n-grams, so that formatting differences do not hide a copied problem."""
    return [t for t in tokens(text) if t[0].isalnum() or t[0] == "\\"]


def ngrams(items: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(items[i : i + n]) for i in range(len(items) - n + 1)}

"""Text normalisation shared by the classifier and decontamination.

Lower-case, one line, and math kept: operators, brackets, digits and LaTeX commands become tokens of
their own (``x^2+1=5`` -> ``x ^ 2 + 1 = 5``, ``\\frac{a}{b}`` -> ``\\frac { a } { b }``), so that
fastText's word n-grams see the notation that tells a math page from another page, and so that
``2+2`` and ``2 + 2`` are the same 10-gram.
"""
from __future__ import annotations

import re
import unicodedata

# A word, a number, a LaTeX command, or any single other visible character (operators, brackets, $).
# Words first because they are the commonest match (the order is otherwise free: only the LaTeX
# command and the single character can start at the same backslash, and the command wins).
_TOKEN = re.compile(r"[^\W\d_]+|\d+(?:\.\d+)?|\\[a-zA-Z]+|[^\s\w]", re.UNICODE)


def tokens(text: str) -> list[str]:
    """The normalised tokens of ``text`` (NFKC, lower case)."""
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).lower())


# The classifier's tokens: the same, less sentence punctuation (, . ; ? "), which every kind of page
# has. It was 12% of the tokens of the shared corpus, and fastText's prediction time grows with them.
_CLASSIFIER_TOKEN = re.compile(r"[^\W\d_]+|\d+(?:\.\d+)?|\\[a-zA-Z]+|[^\s\w,.;?\"]", re.UNICODE)


def normalize(text: str) -> str:
    """``text`` as one line of space-separated tokens, sentence punctuation dropped: what fastText
    trains and predicts on."""
    return " ".join(_CLASSIFIER_TOKEN.findall(unicodedata.normalize("NFKC", text).lower()))


def words(text: str) -> list[str]:
    """The tokens that carry words or numbers (punctuation dropped): the units of decontamination's
    n-grams, so that formatting differences do not hide a copied problem."""
    return [t for t in tokens(text) if t[0].isalnum() or t[0] == "\\"]


def ngrams(items: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(items[i : i + n]) for i in range(len(items) - n + 1)}

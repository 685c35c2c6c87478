"""Text normalisation: the classifier's (``normalize``: whitespace only) and decontamination's.

Decontamination's tokens are lower-case, one line, and math kept: operators, brackets, digits and
LaTeX commands become tokens of their own (``x^2+1=5`` -> ``x ^ 2 + 1 = 5``, ``\\frac{a}{b}`` ->
``\\frac { a } { b }``), so that ``2+2`` and ``2 + 2`` are the same 10-gram.
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


def collapse_whitespace(text: str) -> str:
    """The text with whitespace collapsed to single spaces, nothing else changed: bare fastText's input."""
    return " ".join(text.split())


# What the classifier trains and predicts on. Splitting math notation into tokens of its own and
# dropping sentence punctuation (as it once did) made the classifier lean on notation:
# on sources it never saw it missed word problems without symbols and flagged short computing entries
# with brackets (leave-one-source-out, one change at a time: experiments/corpus_normalisation.py).
normalize = collapse_whitespace


def words(text: str) -> list[str]:
    """The tokens that carry words or numbers (punctuation dropped): the units of decontamination's
    n-grams, so that formatting differences do not hide a copied problem."""
    return [t for t in tokens(text) if t[0].isalnum() or t[0] == "\\"]


def ngrams(items: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(items[i : i + n]) for i in range(len(items) - n + 1)}

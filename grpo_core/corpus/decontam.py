"""Benchmark decontamination (DeepSeekMath §2.1): drop any document that shares a 10-gram with a
benchmark question or answer; a benchmark text shorter than 10 words (but of at least 3: a word or
two would match everything) is matched as an exact substring of normalised tokens instead,
punctuation and operators included (``What is 3 + 4?`` is not in ``What is 3 + 4 + 2?``).

Words are the normalised word and number tokens of ``corpus.text.words``, so ``2+2=4`` in a document
matches ``2 + 2 = 4`` in a benchmark. The index holds hashes of the benchmark n-grams: memory grows
with the benchmarks, not with the corpus.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from grpo_core.corpus.text import ngrams, tokens, words


def _exact_tokens(text: str, strip_period: bool = False) -> list[str]:
    """Tokens for exact matching: operators and punctuation count, LaTeX's ``$`` delimiters do not
    (formatting), nor does the benchmark text's own final period (a page may go on)."""
    out = [t for t in tokens(text) if t != "$"]
    return out[:-1] if strip_period and out and out[-1] == "." else out


@dataclass
class BenchmarkIndex:
    """The n-grams (and short texts) of one or more benchmarks, each remembering its benchmark."""

    n: int = 10
    min_short: int = 3
    grams: dict[int, str] = field(default_factory=dict)  # hash of an n-gram -> benchmark
    short: dict[str, str] = field(default_factory=dict)  # a short text, normalised -> benchmark
    texts: Counter = field(default_factory=Counter)  # texts indexed per benchmark

    def add(self, benchmark: str, text: str) -> None:
        w = words(text)
        if len(w) < self.min_short:
            return
        self.texts[benchmark] += 1
        if len(w) < self.n:
            self.short.setdefault(" ".join(_exact_tokens(text, strip_period=True)), benchmark)
            return
        for gram in ngrams(w, self.n):
            self.grams.setdefault(hash(gram), benchmark)

    def match(self, text: str) -> str | None:
        """The benchmark ``text`` is contaminated by, or None."""
        w = words(text)
        for gram in ngrams(w, self.n):
            hit = self.grams.get(hash(gram))
            if hit is not None:
                return hit
        if self.short:
            joined = f" {' '.join(_exact_tokens(text))} "
            for short, benchmark in self.short.items():
                if f" {short} " in joined:
                    return benchmark
        return None

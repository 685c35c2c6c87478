"""Scoring a shard: what a worker process runs. It imports fastText and the corpus helpers only (no
torch, no MLflow), so that a process pool starts its workers quickly."""
from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path
from typing import Iterable, Iterator

from grpo_core.corpus import classifier
from grpo_core.corpus.docs import Doc, read_shard


HUGE_PAGES = "glibc.malloc.hugetlb=1"


def prefer_huge_pages() -> None:
    """Ask glibc to back the large allocations of processes started from now on with transparent
    huge pages. Prediction looks up a row of the classifier's 2 GB embedding matrix for every word
    and n-gram; with 4 KB pages nearly each lookup misses the TLB, and on the shared corpus huge
    pages made ``predict`` about 25% faster (``bench/corpus_scoring.py``). glibc reads the setting
    at process start, so it reaches the scoring workers a process pool spawns, not this process;
    other C libraries ignore it."""
    current = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in current:
        os.environ["GLIBC_TUNABLES"] = f"{current}:{HUGE_PAGES}" if current else HUGE_PAGES


@functools.lru_cache(maxsize=1)
def _cached_model(path: str, mtime_ns: int):
    """One load per process and classifier: a worker scoring many shards reads the model once."""
    return classifier.load(Path(path))


def scored(model, docs: Iterable[Doc], batch: int = 4096) -> Iterator[tuple[Doc, float]]:
    """(page, P(math)) for a stream of pages, predicted ``batch`` at a time: at most one batch of
    texts is in memory."""
    pages = iter(docs)
    while chunk := list(itertools.islice(pages, batch)):
        yield from zip(chunk, classifier.math_scores(model, [d.text for d in chunk]))


def score_shard(model_path: Path, shard: Path, out_file: Path) -> Path:
    """``url<TAB>P(math)`` for every page of one shard, written through a temporary file."""
    model = _cached_model(str(model_path), Path(model_path).stat().st_mtime_ns)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(out_file.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for d, s in scored(model, read_shard(shard)):
            f.write(f"{d.url}\t{s:.6f}\n")
    tmp.replace(out_file)
    return out_file

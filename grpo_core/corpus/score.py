"""Scoring a shard: what a worker process runs. It imports fastText and the corpus helpers only (no
torch, no MLflow), so that a process pool starts its workers quickly."""
from __future__ import annotations

import functools
from pathlib import Path

from grpo_core.corpus import classifier
from grpo_core.corpus.docs import Doc, read_shard


@functools.lru_cache(maxsize=1)
def _cached_model(path: str, mtime_ns: int):
    """One load per process and classifier: a worker scoring many shards reads the model once."""
    return classifier.load(Path(path))


def score_shard(model_path: Path, shard: Path, out_file: Path) -> Path:
    """``url<TAB>P(math)`` for every page of one shard (one shard's texts in memory at a time)."""
    model = _cached_model(str(model_path), Path(model_path).stat().st_mtime_ns)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(out_file.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        batch: list[Doc] = []
        for doc in [*read_shard(shard), None]:
            if doc is not None:
                batch.append(doc)
            if batch and (doc is None or len(batch) == 4096):
                for d, s in zip(batch, classifier.math_scores(model, [d.text for d in batch])):
                    f.write(f"{d.url}\t{s:.6f}\n")
                batch = []
    tmp.replace(out_file)
    return out_file

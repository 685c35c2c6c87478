"""The corpus flow's mapped task: one shard scored. Its module imports Prefect and the scorer only, so
each process of a process pool (or a Dask / Ray worker) starts without torch or MLflow."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from prefect import task

from grpo_core.corpus.score import prefer_huge_pages, score_shard


@functools.lru_cache(maxsize=4)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, once per version of it: the paper-size classifier is 2 GB."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def model_digest(model_path: Path) -> str:
    st = model_path.stat()
    return _file_digest(str(model_path.resolve()), st.st_size, st.st_mtime_ns)


def _shard_key(context, parameters: dict) -> str:
    """Scores depend on the classifier's bytes (its digest, computed once by the caller rather than
    in every worker) and the shard's content (path, size, mtime)."""
    shard = Path(parameters["shard"])
    st = shard.stat()
    h = hashlib.sha256(parameters["model_digest"].encode())
    h.update(f"{shard.resolve()}|{st.st_size}|{st.st_mtime_ns}|{parameters['out_file']}".encode())
    return f"score-{h.hexdigest()}"


@task(name="score-shard", cache_key_fn=_shard_key, persist_result=True)
def score_shard_task(model_path: str, model_digest: str, shard: str, out_file: str) -> str:
    return str(score_shard(Path(model_path), Path(shard), Path(out_file)))


def score_mapped(model_path: Path, pool: list[Path], out_dir: Path) -> list[Path]:
    prefer_huge_pages()  # before the task runner spawns its workers: they inherit the environment
    futures = score_shard_task.map(model_path=str(model_path), model_digest=model_digest(model_path),
                                   shard=[str(p) for p in pool],
                                   out_file=[str(out_dir / f"{i:05d}.tsv") for i in range(len(pool))])
    return [Path(f.result()) for f in futures]

"""Document pools as streams: sharded JSONL (optionally .gz) or Parquet with at least ``url`` and
``text``. A pool larger than memory works: documents are read one shard at a time, Parquet in
record batches. A malformed document stops the stream with the file, line (or row) and field.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")


class CorpusError(ValueError):
    pass


@dataclass(frozen=True)
class Doc:
    url: str
    text: str
    label: str | None = None


def shards(spec: str | list[str]) -> list[Path]:
    """The shard files of a pool, sorted: a file, a folder (every JSONL / JSONL.gz / Parquet file
    in it), or a glob; several of them as a list."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    out: list[Path] = []
    for s in specs:
        p = Path(s)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES))
        elif any(c in s for c in "*?["):
            found = sorted(Path(f) for f in glob.glob(s, recursive=True) if f.endswith(SUFFIXES))
        elif p.is_file():
            found = [p]
        else:
            raise CorpusError(f"{s}: no such file or folder")
        if not found:
            raise CorpusError(f"{s}: no {', '.join(SUFFIXES)} files")
        out += found
    return out


def _record(path: Path, where: str, obj, label_field: str | None) -> Doc:
    if not isinstance(obj, dict):
        raise CorpusError(f"{path}:{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("url", "text"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise CorpusError(f"{path}:{where}: field {key!r} is missing, empty or not a string")
    label = None
    if label_field is not None:
        label = obj.get(label_field)
        if not isinstance(label, str):
            raise CorpusError(f"{path}:{where}: field {label_field!r} is missing or not a string")
    return Doc(obj["url"], obj["text"], label)


def read_shard(path: Path, label_field: str | None = None) -> Iterator[Doc]:
    """The documents of one shard, in order."""
    if path.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        row = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for obj in batch.to_pylist():
                row += 1
                yield _record(path, f"row {row}", obj, label_field)
        return
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:  # bytes, decoded line by line: an error names its own line
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CorpusError(f"{path}:{line_no}: not UTF-8 ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{line_no}: invalid JSON ({e.msg})") from None
            yield _record(path, str(line_no), obj, label_field)


def read_docs(spec: str | list[str], label_field: str | None = None) -> Iterator[Doc]:
    for path in shards(spec):
        yield from read_shard(path, label_field)


def write_jsonl(path: Path, rows) -> int:
    """Write dicts as JSONL (gzipped when the name ends in .gz) through a temporary file renamed
    into place; returns the count."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "wb") as raw:
        # mtime=0: the same pages give the same bytes, so digests (cache keys, resume identities) hold.
        binary = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if path.name.endswith(".gz") else raw
        with io.TextIOWrapper(binary, encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                n += 1
    os.replace(tmp, path)
    return n

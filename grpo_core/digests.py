"""Content digests of folders (a model, a dataset, an adapter's base): what a cache key, a run's
identity and an adapter's check of its base compare."""

from __future__ import annotations

import hashlib
from pathlib import Path


def digest_dir(path: Path, pattern: str = "*") -> str:
    """sha256 over the names and contents of the files of a folder (a model, a dataset)."""
    return digest_files(path, Path(path).rglob(pattern))


def digest_files(root: Path, files) -> str:
    """sha256 over the names (relative to ``root``) and contents of ``files``, in name order."""
    h = hashlib.sha256()
    for p in sorted(files):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()

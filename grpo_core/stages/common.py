"""Plumbing shared by the training stages: reading splits, manifests, digests, validation."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from grpo_core.data import Example, load_jsonl

CODE_ROOT = Path(__file__).resolve().parents[1]


def read_split(data_dir: Path, split: str) -> list[Example]:
    return load_jsonl(str(Path(data_dir) / f"{split}.jsonl"))


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write ``manifest.json`` last, atomically: its presence means the stage finished."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, out_dir / "manifest.json")
    return manifest


def digest_dir(path: Path) -> str:
    """sha256 over the names and contents of the files of a folder (a model, a dataset)."""
    h = hashlib.sha256()
    for p in sorted(Path(path).rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def code_version() -> str:
    """Hash of the library's source: a cached stage reruns when the code that made it changed."""
    h = hashlib.sha256()
    for p in sorted(CODE_ROOT.rglob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


class Stopwatch:
    """Wall time that survives a resume: ``offset`` is the time spent before the restart."""

    def __init__(self, offset: float = 0.0) -> None:
        self.start = time.perf_counter() - offset

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

"""GRPO's checked rollouts, kept as reward-model data for the next RL round.

Every GRPO step samples G solutions of each of its questions and checks them: fresh samples of the
policy with a verdict, which is what the paper's iterative loop samples to retrain its reward models
anyway. GRPO appends them here (one JSON line per completion, tagged with the step); the next
round's reward-data stage reads them back as labelled solutions of their round of origin.

Crash safety: lines of steps after the checkpoint a run resumes from are dropped on resume (the
resumed run samples those steps again, identically), so the log never holds a step twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FIELDS = ("step", "question", "gold", "completion", "correct")


def log_path(out_dir: Path, rank: int = 0) -> Path:
    """Each process of a torchrun stage logs its own share of the questions."""
    return Path(out_dir) / ("rollouts.jsonl" if rank == 0 else f"rollouts.rank{rank}.jsonl")


def truncate_after(path: Path, step: int) -> None:
    """Keep only the lines of steps <= ``step`` (the checkpoint being resumed); written atomically."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def append(path: Path, step: int, rows: list[dict]) -> None:
    """One step's ``rows`` (``question``, ``gold``, ``completion``, ``correct``), flushed to disk."""
    with open(path, "a") as fh:
        fh.writelines(json.dumps({"step": step, **r}) + "\n" for r in rows)
        fh.flush()
        os.fsync(fh.fileno())


def read_logs(out_dir: str | Path) -> list[dict]:
    """Every process's rollouts of a GRPO stage folder, in (step, process) order."""
    rows = []
    for path in sorted(Path(out_dir).glob("rollouts*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows.append({k: row[k] for k in FIELDS})
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a rollout record ({e})") from None
    return sorted(rows, key=lambda r: r["step"])

"""Crash-safe checkpoints: written to a temporary folder, marked complete, fsynced, then renamed.

A ``step-*`` folder therefore appears whole or not at all; one without the ``COMPLETE`` marker
(written by an older version, or damaged) is never loaded, and a leftover temporary folder is
replaced when the same step is written again. Rewriting a step moves the old folder aside first,
so a crash at any moment leaves at least the previous complete checkpoints.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from grpo_core.lm.modeling import save_model

MARKER = "COMPLETE"
STATE = "trainer_state.pt"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def rng_state() -> dict[str, Any]:
    import numpy as np

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:  # checkpoints of earlier versions have none
        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(root: Path, step: int, model, tokenizer, state: dict[str, Any], keep: int,
                    weights: dict | None = None) -> Path:
    """Write ``root/step-<step>`` atomically; keep the newest ``keep`` complete checkpoints.

    ``state`` holds everything else a resume needs: optimizer, scheduler, counters, RNG, data order.
    ``weights``: the model's whole state dict where the model is sharded (FSDP), else None.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tokenizer, tmp, weights)
    torch.save(state, tmp / STATE)
    (tmp / MARKER).write_text(str(step))
    _fsync_tree(tmp)
    aside = root / f".old-step-{step:08d}"
    if final.exists():  # the same step written again: keep the old one until the new one is in place
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(tmp, final)
    _fsync_dir(root)  # the rename itself is durable
    shutil.rmtree(aside, ignore_errors=True)
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _finish_interrupted_rewrite(root: Path) -> None:
    """A same-step rewrite stopped between its two renames left ``step-N`` missing: put the new copy
    in place if it was complete (its marker is written before the renames), else the old one."""
    for aside in root.glob(".old-step-*"):
        final = root / aside.name.removeprefix(".old-")
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
            continue
        new = root / aside.name.replace(".old-", ".tmp-", 1)
        os.replace(new if (new / MARKER).exists() else aside, final)
        shutil.rmtree(aside, ignore_errors=True)  # gone already if it was the one restored


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first; half-written temporary folders are ignored."""
    if not root.is_dir():
        return []
    _finish_interrupted_rewrite(root)
    return sorted(p for p in root.glob("step-*") if (p / MARKER).exists())


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def load_state(checkpoint: Path) -> dict[str, Any]:
    # weights_only=False: the state holds Python RNG tuples; it is our own file, never downloaded.
    # map_location cpu: every rank would otherwise load the optimizer state onto the GPU it was saved from.
    return torch.load(checkpoint / STATE, weights_only=False, map_location="cpu")

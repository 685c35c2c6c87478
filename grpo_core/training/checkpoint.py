"""Crash-safe checkpoints: written to a temporary folder, marked complete, fsynced, then renamed
(``write_whole``, which also writes the published ``best/`` and ``model/`` folders).

A ``step-*`` folder therefore appears whole or not at all; one without the ``COMPLETE`` marker
(written by an older version, or damaged) is never loaded, and a leftover temporary folder is
replaced when the same step is written again. Rewriting a step moves the old folder aside first,
so a crash at any moment leaves at least the previous complete checkpoints. The marker records
every file's size: a checkpoint damaged later (a file truncated or removed, a state that does not
load) is set aside and the one before it resumed (``resume_point``). A full disk removes the partial
copy and says how much space is needed (``DiskFull``).
"""

from __future__ import annotations

import errno
import json
import os
import random
import sys
import shutil
from pathlib import Path
from typing import Any, Callable

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


class DiskFull(OSError):
    """No space left for a folder being written: the partial copy is gone, the previous one is kept."""


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _no_space(error: Exception, folder: Path) -> bool:
    """Whether a failed write ran out of disk: Python's own writes say ENOSPC / EDQUOT, safetensors
    "No space left on device (os error 28)" in its message, ``shutil.copytree`` lists them, and
    ``torch.save`` only "unexpected pos": then the file system's free space (under 1 MiB) says it."""
    text = str(error)
    return (
        getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        or "No space left" in text
        or "Disk quota exceeded" in text
        or shutil.disk_usage(folder).free < 2**20
    )


def write_whole(final: Path, write: Callable[[Path], Any], marker: str | None = None) -> Path:
    """Write the folder ``final`` so that it appears whole or not at all: ``write(tmp)`` fills
    ``.tmp-<name>`` beside it; ``marker`` (a file name) then records every file's size; the folder is
    fsynced and renamed into place, an older copy moved aside until the new one is there.

    A full disk (``_no_space``) removes the partial copy and raises ``DiskFull`` naming the folder,
    the free space and about what is needed (the size of the copy it replaces, else of what was written
    before the disk filled: a lower bound); the previous copy and older checkpoints are untouched."""
    tmp, aside = final.with_name(f".tmp-{final.name}"), final.with_name(f".old-{final.name}")
    finish_interrupted_rewrites(final.parent)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        if marker:
            files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
            (tmp / marker).write_text(json.dumps({"files": files}))
        _fsync_tree(tmp)
    except Exception as e:
        if not _no_space(e, final.parent):
            raise
        written = _size(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        previous = max([_size(final)] + ([_size(p) for p in complete_checkpoints(final.parent)] if marker else []))
        need = (
            f"about {previous / 2**20:,.1f} MiB, as the last complete copy"
            if previous
            else f"more than {written / 2**20:,.1f} MiB (written before the disk filled)"
        )
        free = shutil.disk_usage(final.parent).free
        raise DiskFull(
            errno.ENOSPC,
            f"{final}: no space left on the device while writing it ({free / 2**20:,.1f} MiB "
            f"free there; it needs {need}). The partial copy was removed and what was there "
            f"before is kept: free some space and run the same command, which resumes from "
            f"the last complete checkpoint",
        ) from None
    if final.exists():  # written again: keep the old one until the new one is in place
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(tmp, final)
    _fsync_dir(final.parent)  # the rename itself is durable
    shutil.rmtree(aside, ignore_errors=True)
    return final


def save_checkpoint(
    root: Path, step: int, model, tokenizer, state: dict[str, Any], keep: int, weights: dict | None = None
) -> Path:
    """Write ``root/step-<step>`` atomically (``write_whole``); keep the newest ``keep`` complete checkpoints.

    ``state`` holds everything else a resume needs: optimizer, scheduler, counters, RNG, data order.
    ``weights``: the model's whole state dict where the model is sharded (FSDP), else None.
    """
    root.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        save_model(model, tokenizer, tmp, weights)
        torch.save(state, tmp / STATE)

    final = write_whole(root / f"step-{step:08d}", write, marker=MARKER)
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def damage(checkpoint: Path) -> str | None:
    """Why a complete checkpoint cannot be trusted (a file missing or not the size it was written
    with), or None. Checkpoints of earlier versions record no sizes: only their state file is checked."""
    try:
        written = json.loads((checkpoint / MARKER).read_text())["files"]
    except (ValueError, KeyError, TypeError):
        written = {STATE: None}
    for name, size in written.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if size is not None and path.stat().st_size != size:
            return f"{name} is {path.stat().st_size:,} bytes, written as {size:,}"
    return None


def resume_point(root: Path) -> tuple[Path | None, dict[str, Any] | None]:
    """The newest checkpoint that is whole and whose state loads, with its state; (None, None) if none.
    A damaged one (``damage``, or a state file that does not load) is moved to ``damaged-step-N``
    beside it, kept for inspection, with a warning naming it and why, and the one before it is tried."""
    for checkpoint in reversed(complete_checkpoints(root)):
        why = damage(checkpoint)
        if why is None:
            try:
                return checkpoint, load_state(checkpoint)
            except MemoryError:
                raise
            except Exception as e:  # a truncated or garbled pickle: torch raises several kinds
                why = f"{STATE} does not load ({type(e).__name__}: {str(e)[:120]})"
        aside = checkpoint.with_name(f"damaged-{checkpoint.name}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(checkpoint, aside)
        print(
            f"warning: checkpoint {checkpoint} is damaged ({why}): moved to {aside}; resuming from the one "
            f"before it, if any",
            file=sys.stderr,
            flush=True,
        )
    return None, None


def finish_interrupted_rewrites(folder: Path) -> None:
    """A rewrite (``write_whole``) stopped between its two renames left ``X`` missing beside
    ``.old-X``: put the new copy in place if it was whole (written and fsynced before the renames; a
    checkpoint's marker says so), else the old one. Run before every listing of checkpoints and every
    ``write_whole`` (so also before ``publish`` copies ``best/``)."""
    for aside in folder.glob(".old-*"):
        final = folder / aside.name.removeprefix(".old-")
        if not final.exists():
            new = final.with_name(f".tmp-{final.name}")
            whole = new.is_dir() and (not final.name.startswith("step-") or (new / MARKER).exists())
            os.replace(new if whole else aside, final)
        shutil.rmtree(aside, ignore_errors=True)  # gone already if it was the one restored


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first; half-written temporary folders are ignored."""
    if not root.is_dir():
        return []
    finish_interrupted_rewrites(root)
    return marked_checkpoints(root)


def marked_checkpoints(root: Path) -> list[Path]:
    """The checkpoints marked complete, oldest first, as they lie (nothing is finished or moved: a
    look from outside the stage)."""
    return sorted(p for p in root.glob("step-*") if (p / MARKER).exists())


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def load_state(checkpoint: Path) -> dict[str, Any]:
    # weights_only=False: the state holds Python RNG tuples; it is our own file, never downloaded.
    # map_location cpu: every rank would otherwise load the optimizer state onto the GPU it was saved from.
    return torch.load(checkpoint / STATE, weights_only=False, map_location="cpu")

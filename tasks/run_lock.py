"""One run folder, one writer. The pipeline, ``rl-rounds`` and the experiment flows (compare, study,
baseline) hold ``runs/<run_name>/.lock`` while they run: a second one started on the same folder (a
schedule firing while the last run still goes, a second terminal) refuses at once, naming the process
that holds it. The lock is the operating system's (``flock``): it goes with the process that held it,
however that process ended, and the next run takes the folder over, saying whose lock it found.
Within one process the lock is re-entrant (``rl-rounds`` runs the pipeline flow on its own folder).
``flock`` is per machine: on a file system shared by several machines it does not see the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

LOCK = ".lock"
_HELD: dict[Path, int] = {}  # run folders this process holds, with their nesting depth


class RunInUse(RuntimeError):
    """Another process is writing the run folder."""


def _holder(text: str) -> str:
    try:
        h = json.loads(text)
        return (
            f"process {h['pid']} on {h['host']} ({h['command']}, since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(h['since']))})"
        )
    except (ValueError, KeyError, TypeError):
        return "another process"


def in_use(run_dir: Path) -> str | None:
    """Why ``run_dir`` cannot be taken now (``RunInUse``'s words), or None: a look before anything
    starts, taking the lock for an instant only where it is free (the folder is not made)."""
    path = Path(run_dir).resolve() / LOCK
    if not path.exists() or path.parent in _HELD:
        return None
    with open(path, "r", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _in_use_by(path.parent, _holder(f.read()))
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def _in_use_by(run_dir: Path, holder: str) -> str:
    return f"{run_dir} is in use by {holder}: wait for it to finish, or give this run another run_name"


@contextlib.contextmanager
def run_lock(run_dir: Path, command: str, log: logging.Logger | None = None) -> Iterator[str | None]:
    """Hold ``run_dir``'s lock for the block (``RunInUse`` if another process holds it); yields the
    note on a lock taken over from a process that is gone (also logged), else None."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _HELD:
        _HELD[run_dir] += 1
        try:
            yield None
        finally:
            _HELD[run_dir] -= 1
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    f = open(run_dir / LOCK, "a+", encoding="utf-8")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = _holder(f.read())
        f.close()
        raise RunInUse(_in_use_by(run_dir, holder)) from None
    f.seek(0)
    left = f.read()
    note = None
    if left.strip():  # written by a process that ended without releasing it (a kill, a crash)
        note = f"{run_dir}: taking over the lock left by {_holder(left)}, which is no longer running"
        (log or logging.getLogger("grpo_pipeline")).warning(note)
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": time.time()}))
    f.flush()
    _HELD[run_dir] = 1
    try:
        yield note
    finally:
        del _HELD[run_dir]
        f.seek(0)
        f.truncate()  # released cleanly: nothing for the next run to report
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()

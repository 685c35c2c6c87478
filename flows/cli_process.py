"""The life of a ``grpo-pipeline`` process: SIGTERM raised as an exception (so that exit handlers run),
Prefect's temporary server started so that Ctrl-C does not kill it before the run reports, and what a
stopped command leaves, in one line."""

from __future__ import annotations

import argparse
import atexit
import signal
from pathlib import Path

from grpo_core.recipe import ConfigError, load_config


class Terminated(BaseException):
    """SIGTERM, raised in the main thread: the process unwinds (Prefect marks the flow run crashed,
    then hands the signal back to this handler), so that exit handlers run and Prefect's temporary
    server, a child process, is stopped instead of left running without a parent."""


def on_sigterm(signum, frame) -> None:
    raise Terminated


def prefect_server() -> None:
    """Prefect's temporary server, started now by Prefect's own class (the instance its client
    uses), with SIGINT and SIGTERM blocked in the server process. Ctrl-C in a terminal, ``timeout``,
    a scheduler or a container stop signal the whole process group: without this the server died
    with the run's main process, and the run then spent minutes retrying a dead API to report its
    flow run crashed. With it, the run reports to a server still answering and stops the server at
    exit. A child inherits its parent's signal mask across exec, so blocking the two around the
    start is all it takes; since the server no longer heeds SIGTERM, the exit stops it with SIGKILL
    (``_stop``: once every report is in, before Prefect's own stop, which would wait 5 s for a
    SIGTERM). Nothing to do with a real server (PREFECT_API_URL)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        server = SubprocessASGIServer()
        server.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal during the start arrives now
    atexit.register(_stop, server)  # after Prefect's own: run before it


def _stop(server) -> None:
    """Prefect's temporary server stopped at exit (it ignores SIGTERM: ``prefect_server``)."""
    if server.server_process is not None:
        server.server_process.kill()
        server.server_process.wait()
        server.server_process = None
    server.stop()  # Prefect's own bookkeeping; the process is gone


def run_folder(a: argparse.Namespace) -> Path | None:
    """The run folder a command works in: its argument, or its recipe's (None if it has neither)."""
    if getattr(a, "run_dir", None):
        return Path(a.run_dir)
    if getattr(a, "config", None):
        try:
            return load_config(a.config, a.overrides).run_dir
        except ConfigError:
            return None
    return None


STAGE_FOLDERS = ("data", "pretrain", "sft", "reward_data", "orm", "prm", "grpo", "eval")  # and replay/v<k>


def stopped(folder: Path | None, since: float) -> str:
    """What a stopped command leaves, in one line: the stages finished and cached (their manifests;
    those of this command first) and where the same command resumes each unfinished stage (its newest
    whole checkpoint, or its start where it wrote none)."""
    from grpo_core.training.checkpoint import marked_checkpoints

    if folder is None or not folder.is_dir():
        return "nothing had started; the same command starts it"
    name = lambda stage: str(stage.relative_to(folder))  # noqa: E731
    # A stage's folder: one with a manifest or checkpoints (an experiment's variant/seed-<i> too), or named
    # as the pipeline names them (a stage stopped before its first checkpoint).
    stages = {m.parent for m in folder.rglob("manifest.json") if m.parent != folder}
    stages |= {c.parent for c in folder.rglob("checkpoints") if c.is_dir()}
    stages |= {f for f in folder.rglob("*") if f.is_dir() and (f.name in STAGE_FOLDERS or f.parent.name == "replay")}
    finished = [f for f in stages if (f / "manifest.json").is_file()]
    now = sorted(name(f) for f in finished if (f / "manifest.json").stat().st_mtime >= since)
    before = sorted(name(f) for f in finished if name(f) not in now)
    unfinished = [f for f in stages if f not in finished]
    # The stages this command touched (another command's leftovers in the folder are not its news);
    # if it touched none, every unfinished one.
    touched = lambda f: max((p.stat().st_mtime for p in f.rglob("*")), default=f.stat().st_mtime) >= since  # noqa: E731
    unfinished = [f for f in unfinished if touched(f)] or unfinished
    resumes = []
    for stage in sorted(unfinished):
        steps = marked_checkpoints(stage / "checkpoints") if (stage / "checkpoints").is_dir() else []
        where = f"from step {int(steps[-1].name.removeprefix('step-'))}" if steps else "from its start"
        resumes.append(f"{name(stage)} {where}")
    listed = lambda names: ", ".join(names) if len(names) <= 8 else f"{len(names)} stages"  # noqa: E731
    done = "; ".join(
        part
        for part in (
            f"finished now: {listed(now)}" if now else "",
            f"finished before: {listed(before)}" if before else "",
        )
        if part
    )
    return (
        (done or "no stage had finished")
        + "; the same command takes the finished ones from the cache and "
        + (f"resumes {'; '.join(resumes)}" if resumes else "goes on from there")
    )

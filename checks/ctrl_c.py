"""Ctrl-C as a terminal sends it, at chosen stages of a command, then the same command again.

    .venv/bin/python checks/ctrl_c.py --run-dir runs/demo --at sft --at round-1/grpo \\
        --compare /elsewhere/runs/demo -- make demo
    .venv/bin/python checks/ctrl_c.py --run-dir runs/demo --at round-3/grpo -- make rounds

Starts COMMAND in a session of its own (a terminal's foreground job: its own process group). Each
time a stage folder given by ``--at`` (under ``--run-dir``) has written a whole checkpoint since the
last start, sends SIGINT to the whole group, as Ctrl-C does, and records the seconds to exit, the
exit code, the last line printed and the processes of the command left behind (the group's, and
any child it had started in a session of its own); then starts the same command again. At the end,
the digests of the finished run's weights (SFT, each round's policy and reward models) against
those of ``--compare``, an uninterrupted run of the same recipe. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil


def digests(run_dir: Path) -> dict[str, str]:
    """The weights' digests a finished run's manifest records: equal digests, equal weights."""
    m = json.loads((run_dir / "manifest.json").read_text())
    out = {"sft": m["stages"]["sft"]["digest"]}
    for r in m["rounds"]:
        out[f"round-{r['round']}/policy"] = r["policy_digest"]
        out |= {f"round-{r['round']}/{kind}": rm["digest"] for kind, rm in r["reward_models"].items()}
    return out


def checkpointed_since(stage: Path, since: float) -> bool:
    return any(p.stat().st_mtime >= since for p in stage.glob("checkpoints/step-*/COMPLETE"))


def interrupt(command: list[str], stage: Path, log: Path) -> dict:
    """Start ``command``; Ctrl-C it once ``stage`` has checkpointed; what happened."""
    started, t0 = time.time(), time.monotonic()  # (the file system's clock stamps the checkpoints)
    with open(log, "a") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while not checkpointed_since(stage, started):
            if proc.poll() is not None:
                raise RuntimeError(f"{command} ended ({proc.returncode}) before {stage} checkpointed: see {log}")
            time.sleep(0.5)
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - sent
    time.sleep(2)
    left = [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    last = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return {
        "at": str(stage),
        "after_start_s": round(sent - t0, 1),
        "exit_s": round(took, 1),
        "exit_code": code,
        "processes_left": left,
        "said": next((line for line in reversed(last) if line.startswith("interrupted:")), last[-1]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, required=True, help="the run folder COMMAND writes (runs/demo)")
    p.add_argument("--at", action="append", required=True, help="a stage folder under --run-dir, in order")
    p.add_argument("--compare", type=Path, help="an uninterrupted run folder of the same recipe")
    p.add_argument("--log", type=Path, default=Path("ctrl_c.log"))
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    # A terminal's foreground job has Ctrl-C's default disposition; a command started in the
    # background by a shell without job control inherits SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler: a handler here gives the command the default back at its exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    clock = time.monotonic()
    stops = [interrupt(command, a.run_dir / stage, a.log) for stage in a.at]
    with open(a.log, "a") as out:
        final = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    resumed = [line for line in a.log.read_text(errors="replace").splitlines() if "resuming from step" in line]
    result = {
        "command": " ".join(command),
        "stops": stops,
        "final_exit_code": final.returncode,
        "resumed": resumed,
        "wall_s": round(time.monotonic() - clock, 1),
    }
    if a.compare:
        mine, theirs = digests(a.run_dir), digests(a.compare)
        result["equal_to_uninterrupted"] = {k: mine[k] == theirs.get(k) for k in mine}
    print(json.dumps(result, indent=1))
    sys.exit(final.returncode)


if __name__ == "__main__":
    main()

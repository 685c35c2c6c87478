"""The memory a whole command takes: every process of its tree read once a second (``Rss`` and
``Pss`` from ``/proc/PID/smaps_rollup``, Linux), summed, and the peaks of both sums with the
processes at each peak. ``Pss`` divides the pages processes share (torch's libraries, loaded by the
flow, each stage's process and Prefect's server) among them: its sum is what the command takes from
the machine; the sum of ``Rss`` counts each shared page once per process (an upper bound).

    python bench/tree_memory.py -- make real        # `make real`'s whole command, as a user runs it

Prints one JSON object (the command's exit status, seconds and both peaks) when the command ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def memory_kib(pid: int) -> dict[str, int]:
    """A process's ``Rss`` and ``Pss`` in KiB (zeros where it is gone)."""
    out = {"Rss": 0, "Pss": 0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, value = line.split()[:2]
            if key.rstrip(":") in out:
                out[key.rstrip(":")] = int(value)
    except (OSError, ValueError):
        pass
    return out


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()[:120]
    except OSError:
        return ""


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "--":
        sys.exit("usage: python bench/tree_memory.py -- COMMAND [ARGS...]")
    if not Path("/proc/self/smaps_rollup").exists():
        sys.exit("needs Linux's /proc/PID/smaps_rollup")
    started = time.time()
    child = subprocess.Popen(sys.argv[2:])
    peaks = {"pss": {"mib": 0.0}, "rss": {"mib": 0.0}}
    while child.poll() is None:
        per = {pid: memory_kib(pid) for pid in tree(child.pid)}
        for key, field in (("pss", "Pss"), ("rss", "Rss")):
            total = sum(m[field] for m in per.values()) / 1024
            if total > peaks[key]["mib"]:
                processes = [
                    {"pss_mib": round(m["Pss"] / 1024), "rss_mib": round(m["Rss"] / 1024), "command": command_line(p)}
                    for p, m in sorted(per.items(), key=lambda kv: -kv[1]["Pss"])
                    if m["Rss"] > 10 * 1024
                ]
                peaks[key] = {"mib": round(total), "after_s": round(time.time() - started), "processes": processes}
        time.sleep(1)
    print(
        json.dumps(
            {
                "command": sys.argv[2:],
                "returncode": child.returncode,
                "wall_s": round(time.time() - started, 1),
                "peak_sum_of_pss": peaks["pss"],
                "peak_sum_of_rss": peaks["rss"],
            },
            indent=1,
        )
    )
    sys.exit(child.returncode)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

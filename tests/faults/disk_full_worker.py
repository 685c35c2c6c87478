"""Tiny SFT onto a disk that fills, for tests/faults/test_faults.py: run inside a mount namespace
(``unshare``) where OUT is a small tmpfs.

    python tests/faults/disk_full_worker.py ROOT OUT REPORT.json

Trains with a checkpoint every step until the tmpfs is full, records what the failure left, grows the
tmpfs (``mount -o remount``) and runs the same stage again; writes what it saw to REPORT.json (outside
the tmpfs, so that the test can read it once the namespace is gone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(root: Path, out: Path, report_path: Path) -> None:
    from grpo_core.env import setup_environment

    setup_environment(root)
    import torch

    torch.set_num_threads(1)
    from grpo_core.stages.prepare import run_prepare
    from grpo_core.stages.sft import run_sft
    from grpo_core.tracking import NullLogger
    from grpo_core.training.checkpoint import DiskFull, resume_point
    from tests.conftest import make_tiny_cfg

    cfg = make_tiny_cfg(root, sft__max_steps=12, sft__checkpoint_every=1, sft__eval_every=1000, sft__keep_checkpoints=3)
    run_prepare(cfg, root / "data")
    report: dict = {}
    try:
        run_sft(cfg, root / "data", out / "sft", NullLogger())
        report["error"] = None
    except DiskFull as e:
        report["error"] = str(e)
    ckpts = out / "sft" / "checkpoints"
    report["left"] = sorted(os.listdir(ckpts))
    checkpoint, state = resume_point(ckpts)
    report["resume_point"] = checkpoint and [checkpoint.name, state["counters"]["step"]]
    subprocess.run(["mount", "-o", "remount,size=64m", str(out)], check=True)
    again = NullLogger()
    manifest = run_sft(cfg, root / "data", out / "sft", again)
    report["again"] = {
        "steps": manifest["steps"],
        "first_logged_step": min(s for s, _ in again.history if s),
        "model": sorted(os.listdir(manifest["model"])),
    }
    report_path.write_text(json.dumps(report))


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:4]))

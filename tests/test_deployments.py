"""``prefect.yaml`` against a real local Prefect server: ``bench/check_deployments.sh`` starts one,
deploys, starts a process worker and runs ``recipe/demo`` and ``rl-rounds/demo-rounds -p rounds=2``.
Slow (about two minutes) and it needs the project's ``.venv`` (the worker runs flows with it)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "prefect").exists(), reason="needs the project's .venv (make venv)")
def test_deployments_run_against_a_local_server():
    done = subprocess.run(["bash", str(ROOT / "bench" / "check_deployments.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["rounds"] == [1, 2, 3] and result["invalid_rounds_refused"]

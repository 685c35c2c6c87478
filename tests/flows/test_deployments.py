"""``prefect.yaml`` against a real local Prefect server: ``checks/check_deployments.sh`` starts one,
deploys, starts a process worker and runs ``recipe/demo`` and ``rl-rounds/demo-rounds -p rounds=2``.
Slow (about two minutes) and it needs the project's ``.venv`` (the worker runs flows with it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "prefect").exists(), reason="needs the project's .venv (make venv)")
def test_deployments_run_against_a_local_server():
    done = subprocess.run(
        ["bash", str(ROOT / "checks" / "check_deployments.sh")], cwd=ROOT, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["rounds"] == [1, 2, 3] and result["invalid_rounds_refused"]


def _blocks(page: Path) -> list[str]:
    """The ```bash blocks of a docs page, in order."""
    return re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


def project_copy(project: Path) -> Path:
    """The project's tracked files copied to ``project``, with its ``.venv`` linked: a newcomer's folder."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, project / name)
    (project / ".venv").symlink_to(ROOT / ".venv")
    return project


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "prefect").exists(), reason="needs the project's .venv (make venv)")
def test_the_prefect_journey_runs_as_written_in_the_docs(tmp_path):
    """docs/prefect.md's commands, read from the page, in a copy of the project: the server, the pool,
    the deployments, the worker, the one-minute recipe, then the stop block; no process is left."""
    project = project_copy(tmp_path / "project")
    start, stop = _blocks(ROOT / "docs" / "prefect.md")[:2]
    port = "4391"  # not the page's 4300, which a person may be using
    # The page's commands up to and including the one-minute run (the 13-minute demo is not run here).
    lines = start.replace("4300", port).splitlines()
    first_run = next(i for i, line in enumerate(lines) if "configs/minute.yaml" in line)
    # set -m: job control, as in the terminal the page is written for (a script without it starts
    # background jobs with SIGINT ignored, and Prefect's worker then never stops on SIGTERM).
    # What the UI will ask for its data (a person's browser): this server's API, not port 4200's.
    ui = f"curl -s http://127.0.0.1:{port}/ui-settings > ui-settings.json"
    script = "\n".join(["set -m", "set -euo pipefail", *lines[: first_run + 1], ui, "set +e", stop])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path}/mlflow.db"
    done = subprocess.run(["bash", "-c", script], cwd=project, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert json.loads((project / "ui-settings.json").read_text())["api_url"] == f"http://127.0.0.1:{port}/api"
    manifest = json.loads((project / "runs" / "minute" / "manifest.json").read_text())
    assert manifest["eval"]["policy"]["n"] == 10
    left = subprocess.run(["pgrep", "-f", f"port {port}|{project}"], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left running: {left}"

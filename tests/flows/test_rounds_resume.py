"""A pipeline process killed (SIGKILL) in the middle of RL round 2 and run again: rounds already done
come from the cache, and round 2's GRPO resumes from its last complete checkpoint. Slow: two
processes, each starting a temporary Prefect server (~30-60 s in all on 2 cores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpo_core.training.checkpoint import complete_checkpoints

pytestmark = pytest.mark.slow


def _recipe(tmp_path: Path) -> Path:
    from tests.conftest import make_tiny_cfg

    cfg = make_tiny_cfg(
        tmp_path,
        run_name="killed",
        rounds__count=2,
        grpo__max_steps=150,
        grpo__checkpoint_every=1,
        grpo__eval_every=1000,
        sft__max_steps=2,
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def _run(recipe: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", str(recipe)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_killed_mid_round_resumes_without_redoing_finished_rounds(tmp_path):
    recipe = _recipe(tmp_path)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)  # each process starts its own temporary server on this home
    ckpts = tmp_path / "runs" / "killed" / "round-2" / "grpo" / "checkpoints"

    proc = _run(recipe, env)
    deadline = time.monotonic() + 600
    while not (ckpts.is_dir() and len(complete_checkpoints(ckpts)) >= 1):
        assert proc.poll() is None, f"the run ended before round 2 checkpointed:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, "round 2 never checkpointed"
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # a hard kill: no exception handler, no cleanup runs
    proc.wait()
    killed_at = int(complete_checkpoints(ckpts)[-1].name.split("-")[1])
    assert not (tmp_path / "runs" / "killed" / "manifest.json").exists()

    again = _run(recipe, env)  # the same recipe, unchanged
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out[-3000:]
    manifest = json.loads((tmp_path / "runs" / "killed" / "manifest.json").read_text())
    first, second = manifest["rounds"]
    assert {"data", "sft"} <= set(manifest["cached_stages"])
    assert sorted(first["cached_stages"]) == ["eval", "grpo"]  # round 1 is not redone
    assert second["cached_stages"] == []
    assert 1 <= killed_at <= second["grpo"]["resumed_from_step"] < 150
    assert second["grpo"]["steps"] == 150

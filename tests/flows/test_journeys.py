"""The rounds and MLflow journey (docs/mlflow.md): the page's commands, read from it and run as
written in a copy of the project (``make ui`` aside), then what the page says MLflow shows."""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flows.test_deployments import ROOT, _blocks, project_copy

PAGE = ROOT / "docs" / "mlflow.md"


def _commands(page: Path) -> list[str]:
    """The first ```bash block of a page, its commands without comments, ``make ui`` left out."""
    block = _blocks(page)[0]
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("make ui")]


@pytest.mark.slow
@pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "grpo-pipeline").exists(), reason="needs the project's .venv (make venv)"
)
def test_the_rounds_and_mlflow_journey_runs_as_written_in_the_docs(tmp_path):
    from mlflow.tracking import MlflowClient

    project = project_copy(tmp_path / "project")
    commands = _commands(PAGE)
    assert any(c.startswith("grpo-pipeline rounds") for c in commands), commands
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    script = "\n".join(["set -euo pipefail", *commands])
    done = subprocess.run(["bash", "-c", script], cwd=project, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])

    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")  # the project's own store, as `make ui` opens it
    exp = client.get_experiment_by_name("grpo-pipeline")
    parents = {
        r.info.run_name: r for r in client.search_runs([exp.experiment_id], "tags.pipeline = 'deepseekmath-grpo'")
    }
    assert set(parents) == {"minute", "minute: to round 2", "minute-lr"}
    first, more, other = parents["minute"], parents["minute: to round 2"], parents["minute-lr"]
    assert more.data.tags["continues"] == first.info.run_id

    def children(run) -> dict:
        return {
            r.info.run_name: r
            for r in client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
        }

    assert sorted(children(more)) == ["round-2"]  # round 1 (and the SFT model's eval) not logged again
    round1, round2 = children(first)["round-1"], children(more)["round-2"]
    assert more.data.tags["round_run.1"] == round1.info.run_id and more.data.tags["round_run.2"] == round2.info.run_id
    # Two rounds: the headline metrics first, round 2 against round 1 with its interval; the settings differ in round.
    names = sorted(round2.data.metrics)
    assert names[:6] == [
        "headline/kl",
        "headline/minus_previous_round",
        "headline/minus_previous_round_high",
        "headline/minus_previous_round_low",
        "headline/reward_mean",
        "headline/test_accuracy",
    ]
    differ = {
        k
        for k in round1.data.params.keys() | round2.data.params.keys()
        if round1.data.params.get(k) != round2.data.params.get(k)
    }
    assert differ == {"round"}
    # Two recipes: the parents' parameters differ in grpo.lr and run_name; the gain over SFT leads the metrics.
    differ = {
        k
        for k in first.data.params.keys() | other.data.params.keys()
        if first.data.params.get(k) != other.data.params.get(k)
    }
    assert differ == {"grpo.lr", "run_name"}
    assert sorted(other.data.metrics)[0].startswith("eval/gain_over_sft")
    assert {"test_accuracy.png", "grpo_curves.png"} <= {
        Path(a.path).name for a in client.list_artifacts(first.info.run_id, "figures")
    }
    # What `rounds` printed: round 2 against round 1, with its interval.
    manifest = json.loads((project / "runs" / "minute" / "manifest.json").read_text())
    assert [r["round"] for r in manifest["rounds"]] == [1, 2]
    assert set(manifest["rounds"][1]["minus_previous_round"]) >= {"mean", "low", "high", "n"}

    # The project moves: copied to another folder, the original deleted, one more round there. Every
    # run, old and new, keeps its artifacts beside the moved database (mlflow_runs.relocate).
    moved = tmp_path / "moved"
    shutil.copytree(project, moved, symlinks=True)
    shutil.rmtree(project)
    more = subprocess.run(
        [sys.executable, "-m", "flows.cli", "rounds", "runs/minute", "--rounds", "1", "--json"],
        cwd=moved,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert more.returncode == 0, more.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{moved / 'mlflow.db'}")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) > len(parents) + 1 and all(
        r.info.artifact_uri.startswith((moved / "mlartifacts").as_uri()) for r in runs
    )
    parents = client.search_runs([exp.experiment_id], "tags.pipeline = 'deepseekmath-grpo'")
    assert {r.info.run_name for r in parents} == {"minute", "minute: to round 2", "minute-lr", "minute: to round 3"}
    for run in parents:
        figures = client.list_artifacts(run.info.run_id, "figures")
        assert figures, run.info.run_name
        assert (
            Path(client.download_artifacts(run.info.run_id, figures[0].path, str(tmp_path / run.info.run_id)))
            .stat()
            .st_size
        )


def test_a_moved_project_re_points_its_environment_on_the_next_make(tmp_path):
    """`make` in a moved project: the #! line of every command in .venv/bin, activate and the editable
    install of the project's packages name the new folder, not the old one (which may be gone, or,
    worse, still there with other code)."""
    old, new = tmp_path / "old", tmp_path / "new"
    site = old / ".venv" / "lib" / "python3.11" / "site-packages"
    for folder in (old / ".venv" / "bin", site / "grpo_pipeline-0.1.0.dist-info", old / "grpo_core"):
        folder.mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", old)
    for name in ("requirements.txt", "pyproject.toml", "grpo_core/__init__.py"):
        (old / name).touch()
    files = {
        old / ".venv" / "bin" / "tool": f"#!{old}/.venv/bin/python3\nprint(1)\n",
        old / ".venv" / "bin" / "activate": f'VIRTUAL_ENV="{old}/.venv"\n',
        site / "__editable___grpo_pipeline_0_1_0_finder.py": f"MAPPING = {{'grpo_core': '{old}/grpo_core'}}\n",
        site / "grpo_pipeline-0.1.0.dist-info" / "direct_url.json": f'{{"url": "file://{old}"}}\n',
    }
    for path, text in files.items():
        path.write_text(text)
    stamp = old / ".venv" / "bin" / ".installed"
    stamp.touch()
    os.utime(stamp, (stamp.stat().st_mtime + 5,) * 2)  # installed after its inputs: no reinstall here
    subprocess.run(["make", "-s", "venv"], cwd=old, check=True, capture_output=True)
    assert (old / ".venv" / "project").read_text().strip() == str(old)
    old.rename(new)
    done = subprocess.run(["make", "-s", "venv"], cwd=new, check=True, capture_output=True, text=True)
    assert f"installed in {old}" in done.stdout
    for path, text in files.items():
        moved = new / path.relative_to(old)
        assert moved.read_text() == text.replace(str(old), str(new)), moved
    assert (new / ".venv" / "project").read_text().strip() == str(new)


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / ".venv" / "project").exists(), reason="needs the project's .venv made by make venv")
def test_a_copied_project_whose_original_is_deleted_runs_its_own_code_from_its_own_environment(tmp_path):
    """As a user copies a project: the tracked files and .venv (hard links where the file system allows,
    so nothing of the source changes) to ``first``, where ``make`` makes it that folder's; ``first``
    copied again to ``second`` and deleted. In ``second`` one ``make`` says it re-points the
    environment, then every way in runs the copy's own code: ``.venv/bin/grpo-pipeline``, an
    activated shell, ``check`` and a one-minute run, and ``ui`` (its servers answer, then stop)."""
    first, second = tmp_path / "first", tmp_path / "second"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        (first / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, first / name)
    for source, dest in ((ROOT / ".venv", first / ".venv"), (first, second)):
        if subprocess.run(["cp", "-al", str(source), str(dest)], capture_output=True).returncode:
            subprocess.run(["cp", "-a", str(source), str(dest)], check=True)
        if dest == first / ".venv":
            made = subprocess.run(["make", "-s", "venv"], cwd=first, capture_output=True, text=True, check=True)
            assert f"re-pointing it at {first}" in made.stdout
    shutil.rmtree(first)

    made = subprocess.run(["make", "-s", "venv"], cwd=second, capture_output=True, text=True)
    assert made.returncode == 0 and f"was installed in {first}: re-pointing it at {second}" in made.stdout, made
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "VIRTUAL_ENV"))}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}

    def sh(script: str) -> str:
        done = subprocess.run(["bash", "-c", script], cwd=second, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    where = "import grpo_core, flows; print(grpo_core.__file__, flows.__file__)"
    assert sh(f".venv/bin/python -c '{where}'").split() == [
        str(second / "grpo_core" / "__init__.py"),
        str(second / "flows" / "__init__.py"),
    ]
    assert "usage: grpo-pipeline" in sh(".venv/bin/grpo-pipeline --help")
    activated = sh("source .venv/bin/activate && echo $VIRTUAL_ENV && grpo-pipeline check configs/minute.yaml")
    assert activated.splitlines()[0] == str(second / ".venv") and '"ok": true' in activated
    ran = json.loads(sh(".venv/bin/grpo-pipeline run configs/minute.yaml --json"))
    assert ran["run_dir"] == "runs/minute" and (second / "runs" / "minute" / "manifest.json").exists()
    ui = subprocess.Popen(
        [".venv/bin/grpo-pipeline", "ui", "--mlflow-port", "5391", "--prefect-port", "4392"],
        cwd=second,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        import time
        import urllib.request

        answered = set()
        for _ in range(240):
            for port in (5391, 4392):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
                    answered.add(port)
                except OSError:
                    pass
            if answered == {5391, 4392} or ui.poll() is not None:
                break
            time.sleep(0.5)
        assert answered == {5391, 4392}, ui.stdout.read() if ui.poll() is not None else "no answer in 2 minutes"
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=60)

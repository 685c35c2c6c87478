"""Faults of the infrastructure during a run, each injected for real (docs/reliability.md, "Faults
during a run"): a tracking server that stops answering (a closed port; a real ``mlflow server`` on
127.0.0.1 killed during GRPO), ... Nothing finished is lost and the message says what to do."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ the tracking store stops answering


def test_a_tracking_store_that_stops_answering_loses_nothing(tmp_path, monkeypatch):
    """A logger whose server is gone (connections refused) keeps every record, in order, with its step
    and time, after one failed try; ``send_unsent`` later delivers them all, and the run ends as it
    would have. A request the store refuses (not an outage) still raises."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from grpo_core.tracking import Journal, MlflowLogger, send_unsent, unsent_count

    from grpo_core.mlflow_runs import experiment_id, start_run

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the project's 2 retries cost ~4 s here
    store = f"sqlite:///{tmp_path}/mlflow.db"
    run = start_run(store, experiment_id(store, "faults"), "grpo")
    unsent = tmp_path / "mlflow-unsent"
    gone = MlflowLogger(f"http://127.0.0.1:{_free_port()}", run, "grpo", unsent=unsent)
    t0 = time.perf_counter()
    for step in range(1, 31):
        gone.log_metrics({"train/kl": step / 100}, step=step)
    gone.log_params({"grpo.beta": 0.04})
    gone.set_tags({"phase": "down"})
    gone.log_table([{"question": "1+1", "correct": True}], "samples.json")
    gone.terminate("FINISHED")
    logged_by_ms = int(time.time() * 1000)
    assert time.perf_counter() - t0 < 20  # one failed try (MLflow's client: 2 retries), then kept at once
    assert unsent_count(unsent) == 34
    with open(Journal(unsent / f"{run}.jsonl").path, "a") as f:
        f.write('{"op": "metrics", "metr')  # a crash in the middle of an append
    gone.log_metrics({"train/kl": 0.31}, step=31)  # kept on a line of its own
    logged_by_ms = int(time.time() * 1000)
    Journal(unsent / "0123456789abcdef.jsonl").append({"op": "tags", "tags": {"a": "b"}})  # a run the store lacks

    assert send_unsent(store, unsent) == (35, 0)
    assert len((unsent / "0123456789abcdef.refused.jsonl").read_text().splitlines()) == 1  # set aside, named
    client = MlflowClient(store)
    history = client.get_metric_history(run, "train/kl")
    assert [(m.step, m.value) for m in history] == [(s, s / 100) for s in range(1, 32)]
    assert all(m.timestamp <= logged_by_ms for m in history)  # the time of the step, not of the sending
    done = client.get_run(run)
    assert done.data.params == {"grpo.beta": "0.04"} and done.data.tags["phase"] == "down"
    assert done.info.status == "FINISHED" and done.info.end_time <= logged_by_ms
    assert "samples.json" in [a.path for a in client.list_artifacts(run)]
    assert unsent_count(unsent) == 0

    live = MlflowLogger(store, run, "grpo", unsent=unsent)
    with pytest.raises(MlflowException, match="[Cc]hang"):  # a refused request is a bug, not an outage
        live.log_params({"grpo.beta": 0.08})
    assert unsent_count(unsent) == 0


def test_kept_metrics_are_sent_in_batches():
    """Consecutive kept metric records go in one call of at most 1000 metrics (MLflow's limit); any
    other record, or a torn line, alone and in order."""
    from grpo_core.tracking import batches

    def metrics(n: int) -> str:
        return json.dumps({"op": "metrics", "metrics": [["train/kl", 0.1, 0, i] for i in range(n)]})

    lines = [metrics(600), metrics(300), metrics(200), '{"op": "tags", "tags": {"a": "b"}}', '{"op": "metr', metrics(1)]
    got = [(len(lines_), record and len(record.get("metrics", []))) for lines_, record in batches(lines)]
    assert got == [(2, 900), (1, 200), (1, 0), (1, None), (1, 1)]


@contextmanager
def server(command: list[str], health: str, env: dict | None = None):
    """A real server process (``command``, listening on 127.0.0.1) that answers ``health`` once up;
    yields a function that kills it (SIGKILL, its whole process group) and one that starts it again."""
    import urllib.request

    procs: list[subprocess.Popen] = []

    def start() -> None:
        procs.append(
            subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
            )
        )
        deadline = time.monotonic() + 180
        while True:
            try:
                return urllib.request.urlopen(health, timeout=2).close()
            except OSError:
                assert time.monotonic() < deadline and procs[-1].poll() is None, f"{command[:4]} did not start"
                time.sleep(0.5)

    def kill() -> None:
        os.killpg(procs[-1].pid, signal.SIGKILL)
        procs[-1].wait()

    start()
    try:
        yield kill, start
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def mlflow_server(root: Path, port: int):
    """A real MLflow tracking server on 127.0.0.1:``port`` with a sqlite store under ``root``."""
    return server(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{root}/server.db",
            "--default-artifact-root",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        f"http://127.0.0.1:{port}/health",
    )


def _until_checkpointed(proc: subprocess.Popen, root: Path, pattern: str) -> None:
    """Wait, ``proc`` running, until a checkpoint folder ``root.glob(pattern)`` holds a complete checkpoint."""
    from grpo_core.training.checkpoint import complete_checkpoints

    deadline = time.monotonic() + 600
    while not any(complete_checkpoints(folder) for folder in root.glob(pattern)):
        assert proc.poll() is None, f"the process ended before it checkpointed:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint in 10 minutes"
        time.sleep(0.1)


def _pipeline(recipe: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", str(recipe), "--json"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_mlflow_server_killed_during_grpo(tmp_path):
    """The tracking server is SIGKILLed while GRPO trains: GRPO finishes (its model and manifest whole)
    with its metrics kept in the run folder; the flow waits ``tracking.wait_s`` for the next stage's
    run, then stops (exit 2) saying what is kept and what to do. With the server back, the same
    command serves the finished stages from the cache and sends the kept metrics: MLflow ends with
    every GRPO step."""
    from mlflow.tracking import MlflowClient

    from tests.conftest import make_tiny_cfg

    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    cfg = make_tiny_cfg(
        tmp_path,
        run_name="faults",
        grpo__max_steps=40,
        grpo__checkpoint_every=5,
        grpo__eval_every=1000,
        sft__max_steps=2,
        tracking__tracking_uri=uri,
        tracking__wait_s=15,
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)  # each run starts its own temporary Prefect server
    run_dir = tmp_path / "runs" / "faults"
    grpo = run_dir / "round-1" / "grpo"

    with mlflow_server(tmp_path / "mlflow", port) as (kill, start):
        proc = _pipeline(recipe, env)
        _until_checkpointed(proc, grpo, "checkpoints")
        kill()
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 2, out[-3000:]
        assert "could not start eval's MLflow run within tracking.wait_s (15 s)" in out, out[-3000:]
        assert "Run the same command once the server answers" in out, out[-3000:]
        manifest = json.loads((grpo / "manifest.json").read_text())  # GRPO finished while the server was down
        assert manifest["steps"] == 40 and (Path(manifest["model"]) / "config.json").exists()
        kept = {p.stem: len(p.read_text().splitlines()) for p in (run_dir / "mlflow-unsent").glob("*.jsonl")}
        assert kept.get(manifest["mlflow_run_id"], 0) > 0, kept

        start()
        again = _pipeline(recipe, env)
        out, _ = again.communicate(timeout=600)
        assert again.returncode == 0, out[-3000:]
        summary = json.loads(out[out.index("{\n") :])
        assert summary["tracking_unsent"] == 0
        final = json.loads((run_dir / "manifest.json").read_text())
        assert "grpo" in final["rounds"][0]["cached_stages"]
        client = MlflowClient(uri)
        steps = [m.step for m in client.get_metric_history(manifest["mlflow_run_id"], "train/lr")]
        assert steps == list(range(1, 41))  # every step, those logged while the server was down included
        assert client.get_run(manifest["mlflow_run_id"]).info.status == "FINISHED"


# ------------------------------------------------------------------ the disk fills


def _can_mount_tmpfs(tmp_path: Path) -> str | None:
    """Why a private tmpfs cannot be mounted here (``unshare``: a user and mount namespace), or None."""
    import shutil

    if shutil.which("unshare") is None:
        return "no unshare command (util-linux)"
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {probe}"], capture_output=True, text=True
    )
    return None if done.returncode == 0 else f"cannot mount a tmpfs in a user namespace: {done.stderr.strip()}"


def test_a_full_disk_during_a_checkpoint_keeps_the_last_one(tmp_path):
    """SFT checkpoints every step onto a 700 KiB tmpfs (a real ENOSPC from the kernel): the write
    that does not fit fails with the folder, the free space and the space needed named; its partial
    copy is gone, the complete checkpoints before it load; once the disk has room the same stage
    resumes from the last of them and finishes."""
    why = _can_mount_tmpfs(tmp_path)
    if why:
        pytest.skip(why)
    out, report = tmp_path / "disk", tmp_path / "report.json"
    out.mkdir()
    worker = f"{sys.executable} {ROOT / 'tests' / 'faults' / 'disk_full_worker.py'} {tmp_path / 'root'} {out} {report}"
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=700k tmpfs {out} && exec {worker}"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(report.read_text())
    error = seen["error"]
    assert error is not None, "the run fit on the disk: make the tmpfs smaller"
    assert "no space left on the device" in error and "MiB free" in error and "needs about" in error, error
    failed = int(error.split("step-")[1][:8])  # the checkpoint that did not fit, named by its folder
    assert not [name for name in seen["left"] if name.startswith(".")], seen["left"]  # no partial copy
    assert seen["left"] and all(int(name.split("-")[1]) < failed for name in seen["left"]), seen
    assert seen["resume_point"] == [seen["left"][-1], failed - 1]  # the last complete one loads
    assert seen["again"]["steps"] == 12 and seen["again"]["first_logged_step"] == failed
    assert "model.safetensors" in seen["again"]["model"]


def test_a_full_disk_stops_the_command_with_exit_2(tmp_path, monkeypatch, capsys):
    """What ``DiskFull`` says reaches the command line as its error, exit 2 (the real ENOSPC is above)."""
    import errno

    import flows.pipeline
    from flows.cli import main
    from grpo_core.training.checkpoint import DiskFull

    def full(config):
        raise DiskFull(errno.ENOSPC, "runs/demo/sft/checkpoints/step-00000004: no space left on the device ...")

    monkeypatch.setattr(flows.pipeline, "pipeline", full)
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "configs/demo.yaml",
                "--set",
                f"output_dir={tmp_path / 'runs'}",
                "--set",
                f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            ]
        )
    assert exc.value.code == 2 and "step-00000004: no space left on the device" in capsys.readouterr().err


# ------------------------------------------------------------------ corrupted artefacts


def _garble(path: Path, how: str) -> None:
    if how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    elif how == "removed":
        path.unlink()
    else:  # the same size, other bytes: only reading it can tell
        path.write_bytes(b"\0" * path.stat().st_size)


@pytest.mark.parametrize(
    "file, how", [("model.safetensors", "truncated"), ("trainer_state.pt", "removed"), ("trainer_state.pt", "zeroed")]
)
def test_a_damaged_checkpoint_is_set_aside_and_the_one_before_resumed(tmp_path, tiny_model_dir, file, how):
    from grpo_core.lm.modeling import load_model
    from grpo_core.training.checkpoint import complete_checkpoints, resume_point, save_checkpoint

    model, tokenizer = load_model(tiny_model_dir)
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        save_checkpoint(root, step, model, tokenizer, {"counters": {"step": step}}, keep=2)
    _garble(root / "step-00000002" / file, how)

    checkpoint, state = resume_point(root)
    assert checkpoint == root / "step-00000001" and state["counters"]["step"] == 1
    assert (root / "damaged-step-00000002" / "COMPLETE").exists()  # kept for a look, never loaded again
    assert complete_checkpoints(root) == [root / "step-00000001"]
    _garble(root / "step-00000001" / "model.safetensors", "truncated")
    assert resume_point(root) == (None, None)  # nothing whole is left: a fresh start, not garbage


def test_a_cached_stage_whose_output_changed_is_not_served(tmp_path):
    """A replay buffer version with a shard gone, a manifest that is not JSON: ``trusted`` says why
    and the flow runs the stage again; untouched, the cache is served."""
    from grpo_core.manifests import write_manifest
    from grpo_core.rewards.replay import write_version
    from grpo_core.stages.outputs import FolderOutput, ReplayOutput, arrow_digest
    from grpo_core.stages.reward_data import COLUMNS
    from tasks.stage_tasks import trusted

    version = tmp_path / "replay" / "v1"
    rows = [{"prompt": f"q{i}", "completion": "a", "correct": i % 2 == 0} for i in range(6)]
    write_version(None, {"solutions": rows}, 1, version, {"solutions": COLUMNS["solutions"]})
    write_manifest(
        version, {"stage": "replay", "dir": str(version), "round": 1, "digest": arrow_digest(version), "cache_key": "k"}
    )
    assert trusted(version / "manifest.json", "k", ReplayOutput) is None
    assert trusted(version / "manifest.json", "other", ReplayOutput) == ""  # another recipe's: nothing to say
    next(version.rglob("*.arrow")).unlink()
    assert "is not what the stage wrote" in trusted(version / "manifest.json", "k", ReplayOutput)

    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text('{"stage": "data", "dir": ')  # cut short
    why = trusted(data / "manifest.json", "k", FolderOutput)
    assert str(data / "manifest.json") in why and "not a readable manifest" in why


# ------------------------------------------------------------------ the study and compare flows killed


@pytest.mark.slow
def test_compare_killed_part_way_resumes_where_it_stopped(tmp_path):
    """``grpo-pipeline compare`` SIGKILLed in its last (variant, seed), mid-GRPO, and run again: the
    finished variants and seeds are served from the cache (their models untouched), the interrupted
    GRPO resumes from its last complete checkpoint, and the table is made."""
    from tests.conftest import make_tiny_cfg

    cfg = make_tiny_cfg(
        tmp_path, run_name="cmp", sft__max_steps=2, grpo__max_steps=2, grpo__checkpoint_every=1, grpo__eval_every=1000
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(recipe)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run_dir = tmp_path / "runs" / "cmp"
    compare = [
        sys.executable,
        "-m",
        "flows.cli",
        "compare",
        str(run_dir),
        "--variants",
        "continued-sft,rule-outcome",
        "--seeds",
        "2",
        "--steps",
        "60",
    ]

    proc = subprocess.Popen(
        compare, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    _until_checkpointed(proc, run_dir, "compare/*/rule-outcome/seed-1/checkpoints")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    [root] = run_dir.glob("compare/*/rule-outcome/..")
    finished = {
        f"{v}/seed-{i}": root / v / f"seed-{i}" / "model" / "model.safetensors"
        for v, i in (("continued-sft", 0), ("rule-outcome", 0), ("continued-sft", 1))
    }
    written = {name: path.stat().st_mtime_ns for name, path in finished.items()}
    assert not (root / "rule-outcome" / "seed-1" / "manifest.json").exists()

    again = subprocess.run(compare, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert {name: path.stat().st_mtime_ns for name, path in finished.items()} == written  # not trained again
    last = json.loads((root / "rule-outcome" / "seed-1" / "manifest.json").read_text())
    assert 1 <= last["resumed_from_step"] < 60 and last["steps"] == 60
    table = json.loads((root / "manifest.json").read_text())
    assert [r["variant"] for r in table["rows"]] == ["sft", "continued-sft", "rule-outcome"]
    assert all(r["seeds"] == 2 for r in table["rows"][1:])


# ------------------------------------------------------------------ the Prefect server goes away


@pytest.mark.slow
def test_prefect_server_killed_mid_flow(tmp_path):
    """The flow's Prefect API server (a real ``prefect server start`` on 127.0.0.1) is SIGKILLed while
    GRPO trains: the run stops saying so, and what had finished stays finished (manifests,
    checkpoints). With the server back, the same command serves the finished stages from the cache
    and GRPO resumes from its last checkpoint."""
    from grpo_core.training.checkpoint import complete_checkpoints
    from tests.conftest import make_tiny_cfg

    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    cfg = make_tiny_cfg(
        tmp_path,
        run_name="prefect",
        grpo__max_steps=60,
        grpo__checkpoint_every=1,
        grpo__eval_every=1000,
        sft__max_steps=2,
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": api}
    server_env = {**env, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server_env.pop("PREFECT_API_URL")
    grpo = tmp_path / "runs" / "prefect" / "round-1" / "grpo"
    command = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-ui",
        "--no-services",
    ]

    with server(command, f"{api}/health", server_env) as (kill, start):
        proc = _pipeline(recipe, env)
        _until_checkpointed(proc, grpo, "checkpoints")
        kill()
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 2, out[-3000:]
        assert f"the Prefect API at {api} stopped answering" in out and "run the same command" in out, out[-3000:]
        assert (tmp_path / "runs" / "prefect" / "sft" / "manifest.json").exists()
        assert complete_checkpoints(grpo / "checkpoints")

        start()
        again = _pipeline(recipe, env)
        out, _ = again.communicate(timeout=600)
        assert again.returncode == 0, out[-3000:]
        final = json.loads((tmp_path / "runs" / "prefect" / "manifest.json").read_text())
        assert {"data", "sft"} <= set(final["cached_stages"])
        grpo_done = final["rounds"][0]["stages"]["grpo"]
        assert grpo_done["steps"] == 60 and (
            grpo_done["resumed_from_step"] >= 1 or "grpo" in final["rounds"][0]["cached_stages"]
        )


def test_sync_sends_what_a_run_kept(tmp_path, monkeypatch, capsys):
    """``grpo-pipeline sync RUN_DIR`` sends a run's kept records; a store that does not answer exits 2
    and keeps them."""
    from flows.cli import main
    from grpo_core.mlflow_runs import experiment_id, start_run
    from grpo_core.tracking import MlflowLogger, unsent_count, unsent_dir

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    store = f"sqlite:///{tmp_path}/mlflow.db"
    run = start_run(store, experiment_id(store, "faults"), "grpo")
    run_dir = tmp_path / "runs" / "demo"
    gone = f"http://127.0.0.1:{_free_port()}"
    MlflowLogger(gone, run, unsent=unsent_dir(run_dir)).log_metrics({"train/kl": 0.1}, step=1)
    with pytest.raises(SystemExit) as exc:
        main(["sync", str(run_dir), "--tracking-uri", gone])
    assert exc.value.code == 2 and "unreachable" in capsys.readouterr().err
    assert unsent_count(unsent_dir(run_dir)) == 1
    main(["sync", str(run_dir), "--tracking-uri", store])
    assert json.loads(capsys.readouterr().out) == {"run_dir": str(run_dir), "tracking_uri": store, "sent": 1, "kept": 0}

"""Tracking and servers: an unreachable tracking server fails at start (seconds, exit 2, nothing
written), credentials and environment values never reach the logged params, and the UIs listen on
127.0.0.1 unless told otherwise."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from flows.cli import main


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_tracking_server_fails_at_start(tmp_path, capsys):
    uri = f"http://alice:s3cret-pw@127.0.0.1:{_closed_port()}"
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "configs/demo.yaml",
                "--set",
                f"output_dir={tmp_path / 'runs'}",
                "--set",
                f"tracking.tracking_uri={uri}",
            ]
        )
    assert exc.value.code == 2
    assert time.perf_counter() - t0 < 30  # not MLflow's minutes of retries
    err = capsys.readouterr().err
    assert "unreachable" in err and "127.0.0.1" in err
    assert "s3cret-pw" not in err  # credentials are redacted
    assert not (tmp_path / "runs").exists()  # nothing started


def test_a_live_server_with_credentials_in_its_uri_passes(tmp_path):
    """user:password@ in the URI reaches the server as Basic auth (as MLflow's client sends it)."""
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from grpo_core.tracking import check_tracking

    seen = []

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_tracking(f"http://alice:s3cret%40pw@127.0.0.1:{server.server_port}/")
    finally:
        server.shutdown()
    login = "Basic " + base64.b64encode(b"alice:s3cret@pw").decode()
    assert seen == [("/health", login), ("/api/2.0/mlflow/experiments/search?max_results=1", login)]


def test_a_tracking_folder_that_cannot_be_created_fails_at_start(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "configs/demo.yaml",
                "--set",
                f"output_dir={tmp_path / 'runs'}",
                "--set",
                f"tracking.tracking_uri=sqlite:///{blocker}/sub/mlflow.db",
            ]
        )
    assert exc.value.code == 2
    assert "cannot create its folder" in capsys.readouterr().err


def test_run_params_hold_no_credentials_or_environment_values(monkeypatch, tiny_cfg, tmp_path):
    from grpo_core.mlflow_runs import run_params

    secret = "tok-3f9a1c77e2b84d0c"
    for name in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD", "WANDB_API_KEY"):
        monkeypatch.setenv(name, secret)
    cfg = tiny_cfg(tmp_path, tracking__tracking_uri="https://bob:hunter2-pw@mlflow.example.org")
    params = run_params(cfg)
    assert params["tracking.tracking_uri"] == "https://***@mlflow.example.org"
    assert not any(secret in v or "hunter2" in v for v in params.values())


def test_uis_listen_on_localhost_by_default(monkeypatch, tmp_path):
    import flows.ui as ui

    started = []

    class Exited:  # a server that stops at once, so serve_uis returns
        pid = -1

        def __init__(self, cmd, **kwargs):
            started.append(cmd)

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(ui.subprocess, "Popen", Exited)
    monkeypatch.setattr(ui.os, "killpg", lambda pid, sig: None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    ui.serve_uis()
    assert len(started) == 2
    for cmd in started:
        assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    # A remote tracking server has its own UI: only Prefect's is started.
    started.clear()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.example.org")
    ui.serve_uis()
    assert len(started) == 1 and started[0][1:3] == ["-m", "prefect"]  # python -m: wherever .venv now is


def test_metric_names_are_made_valid_for_mlflow():
    from grpo_core.tracking import metric_name

    assert metric_name("eval/rule+prm-process/seed-0/maj@8") == "eval/rule_prm-process/seed-0/maj_at_8"
    assert metric_name("train/kl") == "train/kl"


@pytest.mark.slow
def test_a_shared_server_behind_mlflows_basic_auth(tmp_path, monkeypatch):
    """``mlflow server --app-name basic-auth`` (a real one, on 127.0.0.1): without a login the run
    fails at start naming what to set; with ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` it logs, and
    the password reaches no param or tag."""
    from mlflow.tracking import MlflowClient

    from grpo_core.tracking import MlflowLogger, TrackingError, check_tracking

    from grpo_core.mlflow_runs import experiment_id, start_run
    from tests.faults.test_faults import _free_port, server

    password = "s3cret-Adm1n-pw"
    (tmp_path / "auth.ini").write_text(
        f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{tmp_path}/users.db\nadmin_username = admin\n"
        f"admin_password = {password}\nauthorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "auth.ini"),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only",
    }
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--app-name",
        "basic-auth",
        "--backend-store-uri",
        f"sqlite:///{tmp_path}/store.db",
        "--default-artifact-root",
        str(tmp_path / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with server(command, f"{uri}/health", env):
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
        with pytest.raises(TrackingError, match="refused this client's login .*MLFLOW_TRACKING_USERNAME"):
            check_tracking(uri)
        with pytest.raises(SystemExit) as exc:  # the command line: exit 2, nothing started
            main(
                [
                    "run",
                    "configs/demo.yaml",
                    "--set",
                    f"output_dir={tmp_path / 'runs'}",
                    "--set",
                    f"tracking.tracking_uri={uri}",
                ]
            )
        assert exc.value.code == 2 and not (tmp_path / "runs").exists()

        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
        with pytest.raises(TrackingError, match="HTTP 401"):
            check_tracking(uri)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
        check_tracking(uri)
        run = start_run(uri, experiment_id(uri, "shared"), "grpo")
        MlflowLogger(uri, run, "grpo").log_metrics({"train/kl": 0.5}, step=1)
        logged = MlflowClient(uri).get_run(run)
        assert logged.data.metrics == {"train/kl": 0.5}
        assert not any(password in v for v in [*logged.data.params.values(), *logged.data.tags.values()])


@pytest.mark.parametrize("copied", ["project", "database"])
def test_a_moved_project_keeps_its_artifacts_beside_its_database(tmp_path, caplog, copied):
    """MLflow stores artifact locations as absolute paths for good. A project copied elsewhere (with
    its artifacts, or its database alone while the original exists) and its original then deleted:
    its runs, old and new, read and write their artifacts beside the copy's database; the original's
    own store still points at itself."""
    import logging
    import shutil

    from mlflow.tracking import MlflowClient

    from grpo_core.mlflow_runs import experiment_id

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    made = experiment_id(f"sqlite:///{a}/mlflow.db", "demo")
    client = MlflowClient(f"sqlite:///{a}/mlflow.db")
    old = client.create_run(made).info.run_id
    (tmp_path / "figure.png").write_bytes(b"png")
    client.log_artifact(old, str(tmp_path / "figure.png"), "figures")
    if copied == "project":
        shutil.copytree(a, b)
    else:
        b.mkdir()
        shutil.copy2(a / "mlflow.db", b / "mlflow.db")
    with caplog.at_level(logging.WARNING, logger="grpo_pipeline.tracking"):
        assert experiment_id(f"sqlite:///{b}/mlflow.db", "demo") == made
        assert experiment_id(f"sqlite:///{b}/mlflow.db", "demo") == made  # once moved, nothing more to do
    assert [r.getMessage() for r in caplog.records if r.name == "grpo_pipeline.tracking"] == [
        f"the project moved or was copied: its MLflow store {b / 'mlflow.db'} now keeps artifacts at "
        f"{b / 'mlartifacts'} (they were at {a / 'mlartifacts'})"
    ]
    assert (
        MlflowClient(f"sqlite:///{a}/mlflow.db").get_experiment(made).artifact_location == (a / "mlartifacts").as_uri()
    )
    shutil.rmtree(a)
    client = MlflowClient(f"sqlite:///{b}/mlflow.db")
    assert client.get_experiment(made).artifact_location == (b / "mlartifacts").as_uri()
    new = client.create_run(made).info.run_id
    client.log_artifact(new, str(tmp_path / "figure.png"), "figures")
    for run_id in (old, new):
        assert client.get_run(run_id).info.artifact_uri.startswith((b / "mlartifacts").as_uri() + "/")
        assert Path(client.download_artifacts(run_id, "figures/figure.png", str(tmp_path))).read_bytes() == b"png"


def test_the_ui_re_points_a_copied_store_before_it_serves_it(tmp_path):
    """`make ui` as the first command in a copy: its runs' artifacts are the copy's, not the original's."""
    import shutil

    from mlflow.tracking import MlflowClient

    from grpo_core.mlflow_runs import experiment_id, place_artifacts

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    made = experiment_id(f"sqlite:///{a}/mlflow.db", "demo")
    shutil.copytree(a, b)
    assert place_artifacts(f"sqlite:///{b}/mlflow.db") == (b / "mlartifacts").as_uri()
    assert (
        MlflowClient(f"sqlite:///{b}/mlflow.db").get_experiment(made).artifact_location == (b / "mlartifacts").as_uri()
    )
    assert place_artifacts("http://127.0.0.1:5000") is None  # a tracking server keeps its own


def test_a_signal_during_a_tracking_write_waits_for_the_write(tmp_path):
    """Ctrl-C arriving while a record is written to MLflow's store is raised when the write is done:
    the record is whole, the handler in place before is back, and the next write does not wait."""
    import signal

    from mlflow.tracking import MlflowClient

    import grpo_core.mlflow_runs as mlflow_runs
    import grpo_core.tracking as tracking

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run = client.create_run(mlflow_runs.experiment_id(uri, "demo")).info.run_id
    real = tracking._send_now
    # As in a terminal: Python's Ctrl-C handler (a test run started in the background by a shell
    # without job control inherits SIGINT ignored, and Python then installs none).
    outside = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupted_midway(client, run_id, record):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, between two statements of the write
        real(client, run_id, {"op": "params", "params": {"a": "1"}})
        real(client, run_id, record)

    tracking._send_now = interrupted_midway
    try:
        with pytest.raises(KeyboardInterrupt):
            tracking._send(client, run, {"op": "tags", "tags": {"b": "2"}})
    finally:
        tracking._send_now = real
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    started = time.monotonic()
    tracking._send(client, run, {"op": "tags", "tags": {"c": "3"}})
    assert time.monotonic() - started < 5
    signal.signal(signal.SIGINT, outside)
    data = client.get_run(run).data
    assert data.params == {"a": "1"} and {("b", "2"), ("c", "3")} <= set(data.tags.items())

"""``grpo-pipeline ui`` with real servers on loopback ports: SIGTERM, SIGHUP or one server dying stops
both, and their ports close within seconds (the servers' own worker processes included)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.25)
    return condition()


def _listener_pid(port: int) -> int:
    """The pid of a process whose command line names ``--port <port>``."""
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if proc.name.isdigit() and b"--port" in args and args[args.index(b"--port") + 1 :][:1] == [str(port).encode()]:
            return int(proc.name)
    raise LookupError(port)


@pytest.fixture
def ui(tmp_path):
    ports = {"mlflow": _free_port(), "prefect": _free_port()}
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "ui",
            "--mlflow-port",
            str(ports["mlflow"]),
            "--prefect-port",
            str(ports["prefect"]),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert _wait(lambda: all(map(_answers, ports.values())) or proc.poll() is not None, 180), (
            "servers never answered"
        )
        assert proc.poll() is None, proc.stdout.read()
        yield proc, ports
    finally:
        if proc.poll() is None:
            proc.kill()
            for port in ports.values():  # do not leave servers behind when a test fails
                try:
                    os.killpg(_listener_pid(port), signal.SIGKILL)
                except (LookupError, ProcessLookupError):
                    pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_a_stop_signal_stops_both_servers(ui, sig):
    proc, ports = ui
    # The Prefect UI asks for its API on the port it was given, not Prefect's default 4200.
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['prefect']}/ui-settings", timeout=10) as r:
        assert json.load(r)["api_url"] == f"http://127.0.0.1:{ports['prefect']}/api"
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 0
    assert _wait(lambda: not any(map(_answers, ports.values())), 5), "a port still answers"
    out = proc.stdout.read()
    assert f"{signal.Signals(sig).name}: stopping both servers" in out
    assert f"MLflow UI:  http://127.0.0.1:{ports['mlflow']}/#/?workflowType=machine_learning" in out


@pytest.mark.slow
def test_one_server_dying_stops_the_other(ui):
    proc, ports = ui
    os.killpg(_listener_pid(ports["mlflow"]), signal.SIGKILL)
    assert proc.wait(timeout=30) == 0
    assert _wait(lambda: not _answers(ports["prefect"]), 5), "the Prefect server still answers"
    assert "server exited; stopping the other" in proc.stdout.read()

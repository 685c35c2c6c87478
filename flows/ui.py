"""Start the MLflow UI and the Prefect UI on 127.0.0.1 and keep them up until stopped.

Both read the project's local stores: MLflow the SQLite database the pipeline writes, Prefect the
database in PREFECT_HOME that the flows' temporary server used, so past runs are all there.

Ctrl-C, ``kill`` (SIGTERM) and a closing terminal (SIGHUP) stop both servers, and so does either
server dying: each runs in a process group of its own (the servers start worker processes of their
own), and the whole group is stopped, SIGTERM first, SIGKILL after ``GRACE_S``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from grpo_core.env import default_tracking_uri
from grpo_core.mlflow_runs import MODEL_TRAINING_VIEW, place_artifacts
from grpo_core.tracking import redact

GRACE_S = 10.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """A stop signal arrived."""


def _raise_stopped(signum: int, _frame) -> None:
    raise Stopped(signal.Signals(signum).name)


def _signal_groups(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:  # the whole group has exited
            pass


def stop_groups(procs: list[subprocess.Popen], grace_s: float = GRACE_S) -> None:
    """SIGTERM every process group, wait up to ``grace_s`` for the leaders, then SIGKILL what is left
    (a leader past its grace, or workers that outlived their leader)."""
    _signal_groups(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    _signal_groups(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


def experiments(uri: str) -> list[tuple[str, str]]:
    """(name, id) of the experiments with runs in a local store that exists (none otherwise)."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return [
        (e.name, e.experiment_id)
        for e in client.search_experiments()
        if client.search_runs([e.experiment_id], max_results=1)
    ]


def serve_uis(host: str = "127.0.0.1", mlflow_port: int = 5000, prefect_port: int = 4200) -> None:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    artifacts = Path.cwd().resolve() / "mlartifacts"
    remote = uri.startswith(("http://", "https://"))  # a tracking server has its own UI already
    place_artifacts(uri)  # a moved or copied project's runs keep their figures, shown from the first command
    # ``python -m``: this interpreter, wherever the environment now is (an entry point's #! line keeps
    # the folder it was installed in).
    commands = [[sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(prefect_port)]]
    # The Prefect UI asks for its API at PREFECT_UI_API_URL, which defaults to port 4200 whatever --port says.
    env = {**os.environ, "PREFECT_UI_API_URL": f"http://{host}:{prefect_port}/api"}
    if not remote:
        commands.append(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                host,
                "--port",
                str(mlflow_port),
                "--backend-store-uri",
                uri,
                "--default-artifact-root",
                artifacts.as_uri(),
                "--workers",
                "1",
            ]
        )
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOP_SIGNALS}
    procs: list[subprocess.Popen] = []
    try:
        procs = [subprocess.Popen(c, start_new_session=True, env=env) for c in commands]
        print(
            f"MLflow UI:  {redact(uri)}"
            if remote
            else f"MLflow UI:  http://{host}:{mlflow_port}/#/?{MODEL_TRAINING_VIEW}   (tracking {uri})"
        )
        if not remote:
            for name, exp_id in experiments(uri):
                print(f"            {name}: http://{host}:{mlflow_port}/#/experiments/{exp_id}?{MODEL_TRAINING_VIEW}")
        print(f"Prefect UI: http://{host}:{prefect_port}   (PREFECT_HOME {os.environ.get('PREFECT_HOME')})")
        print("Ctrl-C stops both.", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        dead = next(c[2] for c, p in zip(commands, procs) if p.poll() is not None)
        print(f"{dead} server exited; stopping the other.", file=sys.stderr, flush=True)
    except Stopped as why:
        print(f"{why}: stopping both servers.", file=sys.stderr, flush=True)
    finally:
        for sig in STOP_SIGNALS:  # a second signal while stopping must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        stop_groups(procs)
        for sig, handler in previous.items():
            signal.signal(sig, handler)

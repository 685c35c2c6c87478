"""Start the MLflow UI and the Prefect UI on 127.0.0.1 and keep them up until Ctrl-C.

Both read the project's local stores: MLflow the SQLite database the pipeline writes, Prefect the
database in PREFECT_HOME that the flows' temporary server used, so past runs are all there.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from grpo_core.env import default_tracking_uri
from grpo_core.tracking import redact


def serve_uis(host: str = "127.0.0.1", mlflow_port: int = 5000, prefect_port: int = 4200) -> None:
    bin_dir = Path(sys.executable).parent
    uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    artifacts = Path.cwd().resolve() / "mlartifacts"
    remote = uri.startswith(("http://", "https://"))  # a tracking server has its own UI already
    commands = [[str(bin_dir / "prefect"), "server", "start", "--host", host, "--port", str(prefect_port)]]
    if not remote:
        commands.append([str(bin_dir / "mlflow"), "server", "--host", host, "--port", str(mlflow_port),
                         "--backend-store-uri", uri, "--default-artifact-root", artifacts.as_uri(), "--workers", "1"])
    procs = [subprocess.Popen(c) for c in commands]
    print(f"MLflow UI:  {redact(uri)}" if remote else f"MLflow UI:  http://{host}:{mlflow_port}   (tracking {uri})")
    print(f"Prefect UI: http://{host}:{prefect_port}   (PREFECT_HOME {os.environ.get('PREFECT_HOME')})")
    print("Ctrl-C stops both.", flush=True)
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()

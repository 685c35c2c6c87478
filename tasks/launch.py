"""A training stage as torchrun / accelerate processes, from inside a Prefect task: the processes'
output goes to the task's log line by line, rank 0 logs metrics into the task's MLflow run
(``MLFLOW_RUN_ID``), and the stage's manifest is read back from its folder."""
from __future__ import annotations

import collections
import json
import logging
import os
import signal
import subprocess
from pathlib import Path

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from grpo_core.config import PipelineConfig
from grpo_core.launch import launch_command, write_resolved
from grpo_core.stages.inputs import StageInputs, write_inputs

TAIL_LINES = 40


def run_launched(stage: str, cfg: PipelineConfig, out_dir: str, inputs: StageInputs, uri: str, run_id: str) -> dict:
    """Run ``stage`` on ``inputs`` as ``cfg.launch`` says (the resolved recipe and the inputs are
    written beside its outputs); returns its manifest. A failing launch fails the task with the
    processes' last lines."""
    try:
        log = get_run_logger()
    except MissingContextError:  # called outside a flow (a script, a test)
        log = logging.getLogger("grpo_pipeline.launch")
    resolved = write_resolved(cfg, Path(out_dir) / "resolved.yaml")
    args = ["--inputs", str(write_inputs(inputs, Path(out_dir) / "inputs.json")), "--out", out_dir]
    cmd = launch_command(cfg.launch, stage, ["--config", str(resolved), *args])
    log.info("launching %s: %s", stage, " ".join(cmd))
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    # A session of its own: a cancelled or failing task takes the whole torchrun tree down with it.
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True) as proc:
        try:
            for line in proc.stdout:
                tail.append(line.rstrip())
                log.info("[%s] %s", stage, tail[-1])
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            raise
    if proc.returncode != 0:
        raise RuntimeError(f"{stage}: {' '.join(cmd)} exited with {proc.returncode}; last lines:\n" + "\n".join(tail))
    return json.loads((Path(out_dir) / "manifest.json").read_text())

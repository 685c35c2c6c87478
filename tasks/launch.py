"""A training stage as torchrun / accelerate processes, from inside a Prefect task. torchrun and
``accelerate launch`` do the process management (rendezvous, ranks, restarts of the group on
failure); this module says which stage, with which recipe and inputs, streams the processes' output
to the task's log line by line (rank 0 logs metrics into the task's MLflow run, ``MLFLOW_RUN_ID``)
and reads the stage's manifest back from its folder."""
from __future__ import annotations

import collections
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from grpo_core.config import LaunchConfig, PipelineConfig
from grpo_core.stages.inputs import StageInputs, write_inputs

# The stages whose work is data-parallel training; the others run in the task's own process.
LAUNCHABLE = ("sft", "grpo", "pretrain", "orm", "prm")
MODULE = "grpo_core.stages"  # the one stage entry point: --config, --inputs, --out


def write_resolved(cfg: PipelineConfig, path: Path) -> Path:
    """The validated recipe as plain YAML: what every process loads, overrides included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path


def launch_command(launch: LaunchConfig, stage: str, args: list[str]) -> list[str]:
    """``torchrun ... -m grpo_core.stages ARGS`` (or ``accelerate launch``), with the interpreter
    of this process so that the processes see the same environment."""
    if stage not in LAUNCHABLE:
        raise ValueError(f"stage {stage!r} cannot be launched as processes; launchable: {', '.join(LAUNCHABLE)}")
    if not launch.distributed:  # launch.own_process: one plain process, no rendezvous
        return [sys.executable, "-m", MODULE, *args]
    if launch.launcher == "accelerate":
        cmd = [sys.executable, "-m", "accelerate.commands.launch"]
        if launch.accelerate_config:
            cmd += ["--config_file", launch.accelerate_config]
        cmd += ["--num_processes", str(launch.nproc * launch.nnodes), "--num_machines", str(launch.nnodes)]
        if launch.nnodes > 1:
            host, port = launch.rdzv_endpoint.rsplit(":", 1)
            cmd += ["--main_process_ip", host, "--main_process_port", port]
        return cmd + ["-m", MODULE, *args]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(launch.nproc)]
    if launch.nnodes > 1:
        cmd += ["--nnodes", str(launch.nnodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", launch.rdzv_endpoint]
    else:
        cmd += ["--standalone"]  # a local rendezvous on a free port
    return cmd + ["-m", MODULE, *args]


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
    if cfg.launch.nnodes > 1:  # what `grpo-pipeline join` on the other machines runs
        announce(Path(out_dir), stage, cfg.launch, ["--config", str(resolved), *args])
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


# ---------------------------------------------------------------------------- several machines
# The flow runs on one machine and starts each launched stage's torchrun agent there; every other
# machine runs `grpo-pipeline join RUN_DIR`, which starts the same stage's agent on that machine when
# the flow announces it (`launch.json` in the stage's folder, on the file system the machines share).
# torchrun's c10d rendezvous at launch.rdzv_endpoint then joins the agents into one process group.

ANNOUNCE = "launch.json"


def announce(out_dir: Path, stage: str, launch: LaunchConfig, args: list[str]) -> Path:
    """Tell the joining machines to start ``stage``'s agent: each launch has an id of its own (a
    relaunch after a failure is joined again)."""
    import uuid

    path = Path(out_dir) / ANNOUNCE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"id": uuid.uuid4().hex, "stage": stage, "launch": launch.model_dump(mode="json"),
                               "args": args}))
    tmp.replace(path)
    return path


def pending_launches(run_dir: Path, joined: set[str]) -> list[dict]:
    """Announced launches under ``run_dir`` that this machine has not joined and that have not
    finished (a manifest newer than the announcement)."""
    out = []
    for path in sorted(Path(run_dir).rglob(ANNOUNCE)):
        try:
            spec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # being replaced: seen on the next look
        done = path.parent / "manifest.json"
        if spec["id"] in joined or (done.exists() and done.stat().st_mtime_ns >= path.stat().st_mtime_ns):
            continue
        out.append(spec)
    return out


def join(run_dir: Path, timeout_s: float = 24 * 3600, poll_s: float = 2.0, log=None) -> list[str]:
    """This machine's part of a several-machine run: start the agent of every stage the flow launches
    under ``run_dir`` (one at a time, as the flow runs them) until the run's manifest is written after
    this call began, or ``timeout_s``. Returns the stages joined. A failing agent raises, naming
    the stage and its last lines, as the flow's own launch does."""
    import time

    log = log or logging.getLogger("grpo_pipeline.join")
    start, joined, stages = time.time(), set(), []
    finished = Path(run_dir) / "manifest.json"
    while time.time() - start < timeout_s:
        for spec in pending_launches(Path(run_dir), joined):
            joined.add(spec["id"])
            cmd = launch_command(LaunchConfig(**spec["launch"]), spec["stage"], spec["args"])
            log.info("joining %s: %s", spec["stage"], " ".join(cmd))
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
            if done.returncode != 0:
                tail = "\n".join(done.stdout.splitlines()[-TAIL_LINES:])
                raise RuntimeError(f"{spec['stage']}: {' '.join(cmd)} exited with {done.returncode}; last lines:\n{tail}")
            stages.append(spec["stage"])
        if finished.exists() and finished.stat().st_mtime >= start:
            return stages
        time.sleep(poll_s)
    raise TimeoutError(f"{run_dir}: the run did not finish within {timeout_s:.0f} s of joining")

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
import re
import signal
import subprocess
import sys
from pathlib import Path

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from grpo_core.config import LaunchConfig, PipelineConfig
from grpo_core.stages.inputs import MODULE, StageInputs, stage_args
from grpo_core.tracking import UNSENT_ENV, redact, unsent_dir

# The stages that may run outside the task's own process (``runs_apart``): the training stages,
# data-parallel under torchrun / accelerate, and the evaluation, one process of its own at most.
LAUNCHABLE = ("sft", "grpo", "pretrain", "orm", "prm")
ALONE = ("eval",)


def runs_apart(launch: LaunchConfig, stage: str) -> bool:
    """Whether ``stage`` runs as processes of its own: a training stage when the run is launched
    (torchrun, accelerate, or ``own_process``), an evaluation with ``own_process``."""
    return (launch.launched and stage in LAUNCHABLE) or (launch.own_process and stage in ALONE)


def launch_command(launch: LaunchConfig, stage: str, args: list[str], rdzv_id: str | None = None) -> list[str]:
    """``torchrun ... -m grpo_core.stages ARGS`` (or ``accelerate launch``), with the interpreter
    of this process so that the processes see the same environment. ``rdzv_id``: the launch's id on
    several machines, so that only the agents of one launch of one stage meet."""
    if stage not in LAUNCHABLE + ALONE:
        raise ValueError(
            f"stage {stage!r} cannot be launched as processes; launchable: {', '.join(LAUNCHABLE + ALONE)}"
        )
    if not launch.distributed or stage in ALONE:  # one plain process, no rendezvous
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
        cmd += ["--rdzv_id", rdzv_id] if rdzv_id else []
    else:
        cmd += ["--standalone"]  # a local rendezvous on a free port
    return cmd + ["-m", MODULE, *args]


TAIL_LINES = 40


def stream(cmd: list[str], env: dict, log, label: str) -> tuple[int, list[str]]:
    """Run ``cmd`` with its output sent to ``log`` line by line, each marked ``[label]`` (once: a
    stage's own progress line is marked already); returns its exit status and last lines. It runs in
    a session of its own: a cancelled or failing caller takes the whole torchrun tree down with it."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    ) as proc:
        try:
            for line in proc.stdout:
                tail.append(line.rstrip())
                log.info("%s", tail[-1] if tail[-1].startswith(f"[{label}]") else f"[{label}] {tail[-1]}")
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            raise
    return proc.returncode, list(tail)


def run_launched(stage: str, cfg: PipelineConfig, out_dir: str, inputs: StageInputs, uri: str, run_id: str) -> dict:
    """Run ``stage`` on ``inputs`` as ``cfg.launch`` says (the resolved recipe and the inputs are
    written beside its outputs); returns its manifest. A failing launch fails the task with the
    processes' last lines. On several machines the launch is announced for ``join`` while it runs."""
    import uuid

    try:
        log = get_run_logger()
    except MissingContextError:  # called outside a flow (a script, a test)
        log = logging.getLogger("grpo_pipeline.launch")
    args = stage_args(cfg, inputs, out_dir)
    launch_id = uuid.uuid4().hex if cfg.launch.nnodes > 1 and stage in LAUNCHABLE else None
    cmd = launch_command(cfg.launch, stage, args, launch_id)
    tracking = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run_id, UNSENT_ENV: str(unsent_dir(cfg.run_dir.resolve()))}
    announced = announce(Path(out_dir), launch_id, stage, cfg.launch, args, tracking) if launch_id else None
    log.info("launching %s: %s", stage, " ".join(cmd))
    try:
        code, last = stream(cmd, {**os.environ, **tracking, "PYTHONUNBUFFERED": "1"}, log, stage)
    finally:
        if announced:
            announced.unlink(missing_ok=True)  # over: no machine joins it any more
    if code != 0:
        raise RuntimeError(
            f"{stage}: its processes exited with {code}: {cause(last)}\n{' '.join(cmd)}; last lines:\n"
            + "\n".join(last)
        )
    return json.loads((Path(out_dir) / "manifest.json").read_text())


# The last line of a Python traceback (torchrun prefixes a worker's with ``[rank0]:``); torchrun's own
# report of the failure (``ChildFailedError``) and its process bookkeeping are not the cause.
_ERROR = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Exit)\b(?::.*)?)$")


def cause(lines: list[str]) -> str:
    """The error a launched stage's processes died of, from their last lines: the last exception line
    that is not torchrun's own (else the last line)."""
    for line in reversed(lines):
        found = _ERROR.match(line.strip())
        if found and "ChildFailedError" not in line and "torch.distributed.elastic" not in line:
            return found.group(1)
    return lines[-1].strip() if lines else "no output"


# ---------------------------------------------------------------------------- several machines
# The flow runs on one machine and starts each launched stage's torchrun agent there; every other
# machine runs `grpo-pipeline join RUN_DIR`, which starts the same stage's agent on that machine
# while the flow announces it (`launch.json` in the stage's folder, on the file system the machines
# share, removed when the flow's agent exits). torchrun's c10d rendezvous at launch.rdzv_endpoint,
# under the launch's own id, joins the agents into one process group; whichever machine gets rank 0
# logs to the stage's MLflow run and writes the stage's outputs.

ANNOUNCE = "launch.json"


def announce(
    out_dir: Path, launch_id: str, stage: str, launch: LaunchConfig, args: list[str], tracking: dict[str, str]
) -> Path:
    """Tell the joining machines to start ``stage``'s agent (``launch_id``: this launch; a relaunch
    after a failure has another). ``tracking``: the stage's MLflow run, for rank 0 wherever it lands;
    a tracking URI that holds credentials is left out (set MLFLOW_TRACKING_URI on those machines)."""
    env = {k: v for k, v in tracking.items() if k != "MLFLOW_TRACKING_URI" or redact(v) == v}
    path = Path(out_dir) / ANNOUNCE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(
        json.dumps(
            {"id": launch_id, "stage": stage, "launch": launch.model_dump(mode="json"), "args": args, "env": env}
        )
    )
    tmp.replace(path)
    return path


def pending_launches(run_dir: Path, joined: set[str]) -> list[dict]:
    """Announced launches under ``run_dir`` that this machine has not joined."""
    out = []
    for path in sorted(Path(run_dir).rglob(ANNOUNCE)):
        try:
            spec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # removed or being replaced: seen on the next look
        if spec["id"] not in joined:
            out.append(spec)
    return out


def join(run_dir: Path, timeout_s: float = 24 * 3600, poll_s: float = 2.0, log=None) -> dict[str, list[str]]:
    """This machine's part of a several-machine run: start the agent of every stage the flow launches
    under ``run_dir`` (one at a time, as the flow runs them), its output to ``log``, until the run's
    manifest is (re)written, or ``timeout_s``. A failing agent is logged and the loop goes on (the
    flow's own launch fails the stage, and its relaunch is announced again). Returns the stages
    joined and those whose agent failed here."""
    import time

    log = log or logging.getLogger("grpo_pipeline.join")
    finished = Path(run_dir) / "manifest.json"

    def stamp():  # (this file system's clock only)
        return finished.stat().st_mtime_ns if finished.exists() else None

    before, start, joined = stamp(), time.monotonic(), set()
    out: dict[str, list[str]] = {"joined": [], "failed": []}
    while time.monotonic() - start < timeout_s:
        for spec in pending_launches(Path(run_dir), joined):
            joined.add(spec["id"])
            cmd = launch_command(LaunchConfig(**spec["launch"]), spec["stage"], spec["args"], spec["id"])
            log.info("joining %s: %s", spec["stage"], " ".join(cmd))
            code, last = stream(cmd, {**os.environ, **spec["env"], "PYTHONUNBUFFERED": "1"}, log, spec["stage"])
            if code != 0:
                log.warning(
                    "%s: this machine's agent exited with %d; last lines:\n%s", spec["stage"], code, "\n".join(last)
                )
            out["failed" if code else "joined"].append(spec["stage"])
        if stamp() != before:
            return out
        time.sleep(poll_s)
    raise TimeoutError(f"{run_dir}: the run did not finish within {timeout_s:.0f} s of joining")

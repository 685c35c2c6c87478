"""The ``join`` flow: a machine's part of a run on several machines (``launch.nnodes`` > 1). The
pipeline flow runs on one machine; deploy this flow to a work pool on each other machine and run it
with the run's folder (on the file system the machines share): it starts each training stage's
torchrun agent there as the pipeline launches it, until the run finishes (``tasks.launch.join``).

    prefect deploy flows/join.py:join --name machine-1 --pool machine-1   # once, per machine
    prefect deployment run join/machine-1 -p run_dir=/shared/runs/my-run   # beside the pipeline's run
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from tasks.launch import join as join_launches


@flow(name="join", flow_run_name="join-{run_dir}")
def join(run_dir: str, timeout_s: float = 24 * 3600) -> dict[str, list[str]]:
    return join_launches(Path(run_dir), timeout_s, log=get_run_logger())

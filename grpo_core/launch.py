"""The command that starts a training stage as data-parallel processes, and the resolved recipe they
read. torchrun and ``accelerate launch`` do the process management (rendezvous, ranks, restarts
of the group on failure); this module only says which stage, with which recipe and arguments."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from grpo_core.config import LaunchConfig, PipelineConfig

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

"""``launch``: how the training stages run (processes, machines, device, precision)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_core.config.base import Section


TrainedStage = Literal["pretrain", "sft", "reward_model", "grpo"]


class LaunchConfig(Section):
    """How the training stages (pretrain, SFT, GRPO) run: inside the Prefect task's process
    (``nproc`` 1 on one machine), or as ``nproc`` data-parallel processes per machine started by
    torchrun or ``accelerate launch``. Not part of any cache key: the global batch means the same
    thing for any number of processes."""

    nproc: int = Field(1, ge=1, description="processes per machine (one per GPU); > 1 launches torchrun / accelerate")
    launcher: Literal["torchrun", "accelerate"] = Field(
        "torchrun", description="torchrun, or accelerate launch with accelerate_config"
    )
    accelerate_config: str | None = Field(
        None, description="accelerate config file (configs/accelerate/) for launcher accelerate"
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description=(
            "ddp: every process holds the whole model; fsdp: parameters, gradients and optimizer state sharded over "
            "the processes (FSDP2), gathered for sampling, evaluation and saving"
        ),
    )
    nnodes: int = Field(
        1,
        ge=1,
        description=(
            "machines; > 1 needs rdzv_endpoint: the flow runs on one, `grpo-pipeline join RUN_DIR` on each other "
            "(docs/scaling.md)"
        ),
    )
    rdzv_endpoint: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+:[0-9]+$", description="host:port of the torchrun rendezvous (nnodes > 1)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: the process's GPU (cuda:LOCAL_RANK) when there is one, else the CPU"
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="bf16: autocast forward passes to bfloat16 (weights and optimizer stay fp32)"
    )
    gradient_checkpointing: bool | list[TrainedStage] = Field(
        False,
        description=(
            "recompute each layer in backward, prompts still shared (less memory, more time, the same gradients): "
            "true in every trained stage, or the stages named ([sft])"
        ),
    )
    cuda_graphs: bool = Field(
        True,
        description=(
            "on a GPU, replay each decode step as a CUDA graph (faster sampling, the same greedy tokens: "
            "docs/scaling.md); false: the eager loop"
        ),
    )
    own_process: bool = Field(
        False,
        description="one process: still run each training stage and each evaluation in a process of its own "
        "(its peak memory is its own, and freed when it ends; the study does)",
    )

    @property
    def distributed(self) -> bool:
        return self.nproc > 1 or self.nnodes > 1

    def checkpointed(self, stage: TrainedStage) -> bool:
        """Whether ``stage`` recomputes each layer in backward (``gradient_checkpointing``)."""
        g = self.gradient_checkpointing
        return g is True or (isinstance(g, list) and stage in g)

    @property
    def launched(self) -> bool:
        """Whether the training stages run as processes of their own (torchrun, accelerate or plain)."""
        return self.distributed or self.own_process

    @model_validator(mode="after")
    def _endpoint_for_several_machines(self) -> "LaunchConfig":
        if self.strategy == "fsdp" and not self.distributed:
            raise ValueError(
                "launch.strategy=fsdp shards the model over processes: set launch.nproc (or nnodes) above 1"
            )
        if self.nnodes > 1 and self.launcher == "accelerate":
            raise ValueError(
                "launch.nnodes > 1 runs torchrun's rendezvous (grpo-pipeline join starts the other machines' "
                "agents): set launch.launcher to torchrun"
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("launch.nnodes > 1 needs launch.rdzv_endpoint (host:port reachable from every machine)")
        return self

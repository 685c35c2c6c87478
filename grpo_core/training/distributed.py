"""torch.distributed for the training stages, the way torchrun and ``accelerate launch`` start them:
one process per device, told its place by RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR. Without
those variables ``init()`` returns the single-process ``Dist`` and every method here is the
identity, so a stage's code is the same on a laptop and on N GPUs.

Data parallelism (DDP) only: every rank holds the whole model, takes a contiguous shard of each
global batch, and the gradients are averaged. Rank 0 alone logs, evaluates and writes files.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from grpo_core.config import LaunchConfig
from grpo_core.lm.runtime import device_for, model_device


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    comm: str = "cpu"  # where collectives run: NCCL only moves CUDA tensors, gloo CPU ones

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int, what: str) -> slice:
        """This rank's contiguous share of ``n`` global items; ``n`` must split evenly so that every
        rank's share weighs the same in the averaged gradient."""
        if n % self.world:
            raise ValueError(f"{what} = {n} does not split evenly over {self.world} processes")
        per = n // self.world
        return slice(self.rank * per, (self.rank + 1) * per)

    def split(self, n: int) -> slice:
        """This rank's contiguous share of ``n`` items, as even as it goes (shares differ by at most
        one; a loss normalised by the global count stays exact)."""
        return slice(n * self.rank // self.world, n * (self.rank + 1) // self.world)

    def sum(self, x: torch.Tensor | float) -> torch.Tensor:
        """Sum over ranks (a copy; ``x`` is untouched)."""
        t = torch.as_tensor(x, dtype=torch.float64).detach().clone()
        if self.world > 1:
            t = t.to(self.comm)
            dist.all_reduce(t)
        return t.cpu()

    def max(self, x: int) -> int:
        t = torch.tensor(x, dtype=torch.long, device=self.comm)
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)

    def mean(self, metrics: dict[str, float]) -> dict[str, float]:
        """The mean over ranks of each metric (the ranks must pass the same keys in the same order)."""
        if self.world == 1 or not metrics:
            return metrics
        t = torch.tensor(list(metrics.values()), dtype=torch.float64, device=self.comm)
        dist.all_reduce(t)
        return dict(zip(metrics, (t / self.world).tolist()))

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[n, ...] per rank -> [world * n, ...] in rank order (equal shapes on every rank)."""
        if self.world == 1:
            return x
        x = x.to(self.comm).contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x)
        return torch.cat(parts).cpu()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (a picklable value: a decision, a metric)."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def main_first(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on rank 0, then on the others: for steps with side effects on disk (setting
        stale checkpoints aside) that the other ranks must then see."""
        if self.main:
            out = fn()
        self.barrier()
        if not self.main:
            out = fn()
        return out

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def wrap(self, model):
        """The model to train: DDP-wrapped across ranks (gradients averaged in backward)."""
        if self.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        device = model_device(model)
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)


# Rank 0 validates and writes checkpoints while the others wait in a collective: far longer than
# NCCL's default 10-minute watchdog allows on a large validation set or model.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)


def init(launch: LaunchConfig | None = None) -> Dist:
    """Join the process group that the launcher described in the environment (NCCL when the stage
    computes on CUDA, ``runtime.device_for``; gloo otherwise), or return the single-process ``Dist``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if not dist.is_initialized():
        cuda = device_for(launch or LaunchConfig()).type == "cuda"
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    comm = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    return Dist(dist.get_rank(), dist.get_world_size(), comm)


def finish() -> None:
    """Leave the process group together (rank 0 may still be writing the stage's outputs) and tear
    it down, so that no rank exits with gloo's threads still running."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

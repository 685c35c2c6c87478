"""torch.distributed for the training stages, the way torchrun and ``accelerate launch`` start them:
one process per device, told its place by RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR. Without
those variables ``init()`` returns the single-process ``Dist`` and every method here is the
identity, so a stage's code is the same on a laptop and on N GPUs.

Data parallelism: every rank takes a contiguous shard of each global batch, and the gradients are
averaged. ``launch.strategy``: ``ddp`` keeps the whole model on every rank (DistributedDataParallel);
``fsdp`` shards parameters, gradients and optimizer state over the ranks (FSDP2's ``fully_shard`` on
each transformer block and the root), and gathers the whole parameters for the work whose forward
passes differ between ranks (sampling, rank 0's evaluation: ``gathered``) and for saving
(``full_state``), as DeepSpeed ZeRO-3 gathers them for generation. Rank 0 alone logs, evaluates and
writes files.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
from collections.abc import Iterator
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
    strategy: str = "ddp"  # launch.strategy

    @property
    def sharded(self) -> bool:
        return self.world > 1 and self.strategy == "fsdp"

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
        """The model to train: DDP-wrapped across ranks (gradients averaged in backward), or with FSDP
        its parameters sharded in place (the same module returned)."""
        if self.world == 1:
            return model
        if self.strategy == "fsdp":
            return _fully_shard(model)
        from torch.nn.parallel import DistributedDataParallel

        device = model_device(model)
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    @contextlib.contextmanager
    def gathered(self, root) -> Iterator[None]:
        """With FSDP, every parameter group of ``root`` (what ``wrap`` returned) whole on every rank
        for the block, kept whole across forward passes: every rank enters (an all-gather), then
        each may run its own number of forward passes (a rank's rollouts, rank 0's evaluation)
        with no collective; resharded on leaving. Otherwise nothing to do."""
        if not self.sharded or root is None:
            yield
            return
        from torch.distributed.fsdp import FSDPModule

        groups = [m for m in root.modules() if isinstance(m, FSDPModule)]
        for m in groups:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            yield
        finally:
            for m in groups:
                m.reshard()
                m.set_reshard_after_forward(m is not root, recurse=False)  # FSDP keeps the root whole after forward

    def full_state(self, model) -> dict | None:
        """With FSDP, ``model``'s whole state dict on CPU for rank 0 to save (every rank calls: an
        all-gather per tensor; the others get an empty dict). None otherwise: the model is whole."""
        if not self.sharded:
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def optimizer_state(self, model, opt) -> dict:
        """The optimizer's state to checkpoint (every rank calls). With FSDP the whole state, keyed by
        parameter name (``"fqn": True``), so that any number of processes can resume it."""
        if not self.sharded:
            return opt.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        whole = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {**whole, "fqn": True}

    def load_optimizer_state(self, model, opt, state: dict) -> None:
        """``optimizer_state``'s output from a checkpoint written by any number of processes."""
        if not self.sharded and not state.get("fqn"):
            opt.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        state = {k: v for k, v in state.items() if k != "fqn"} if state.get("fqn") else _by_name(model, opt, state)
        set_optimizer_state_dict(model, opt, state, options=StateDictOptions(full_state_dict=True))


SINGLE = Dist()  # one process


def _fully_shard(model):
    """FSDP2: each transformer block (the classes a Hugging Face model lists in ``_no_split_modules``)
    a parameter group of its own, the rest (embeddings, final norm, head) the root's."""
    from torch.distributed.fsdp import fully_shard

    blocks = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or ())}
    for m in list(model.modules()):
        if type(m).__name__ in blocks:
            fully_shard(m)
    root = fully_shard(model)
    # FSDP sets up its root at the root's first forward; a gathered pass that calls a submodule first
    # (rank 0's evaluation of the model inside ScoreHead) would make that submodule a root instead.
    # FSDP2 has no public call for this set-up, so the root's own is called here.
    root._get_fsdp_state()._lazy_init()
    return root


def _by_name(model, opt, state: dict) -> dict:
    """A ``torch.optim`` state dict keyed by parameter index (one process, DDP) keyed by parameter
    name instead, as the distributed state-dict functions read it."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    names = [name_of[id(p)] for g in opt.param_groups for p in g["params"]]
    return {
        "state": {names[i]: v for i, v in state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
    }


# Rank 0 validates and writes checkpoints while the others wait in a collective: far longer than
# NCCL's default 10-minute watchdog allows on a large validation set or model.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)


def _world() -> int:
    """How many processes the launcher started (torchrun and ``accelerate launch`` say so in WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init(launch: LaunchConfig | None = None) -> Dist:
    """Join the process group that the launcher described in the environment (NCCL when the stage
    computes on CUDA, ``runtime.device_for``; gloo otherwise), or return the single-process ``Dist``."""
    if _world() == 1:
        return Dist()
    if not dist.is_initialized():
        cuda = device_for(launch or LaunchConfig()).type == "cuda"
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    comm = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    return Dist(dist.get_rank(), dist.get_world_size(), comm, (launch or LaunchConfig()).strategy)


def finish() -> None:
    """Leave the process group together (rank 0 may still be writing the stage's outputs) and tear
    it down, so that no rank exits with gloo's threads still running."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_rank() -> None:
    """End a data-parallel rank's process here, its outputs written and its streams flushed, without
    the interpreter's finalization; a single process returns and exits as usual. FSDP2's functional
    collectives keep gloo's process group, and its threads, alive after ``destroy_process_group``
    (PyTorch holds the reference, not us), and those threads running into finalization abort a
    finished rank now and then (``terminate called without an active exception``, exit -6)."""
    if _world() > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

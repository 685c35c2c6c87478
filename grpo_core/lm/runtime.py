"""Where and in what precision a stage computes: the device (the process's GPU under torchrun, else
the CPU), bf16 autocast, gradient checkpointing. The stages move a model here once and move each
batch to its model's device at the few places batches are made (``policy``, ``stages.common.lm_loss``), so
the math functions never think about devices."""
from __future__ import annotations

import contextlib
import os

import torch

from grpo_core.config import LaunchConfig


def device_for(launch: LaunchConfig) -> torch.device:
    """cuda:LOCAL_RANK when asked for (or ``auto`` and one is present), else the CPU."""
    if launch.device == "cpu" or (launch.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("launch.device is cuda but torch sees no CUDA device (a CPU build of torch, or no GPU)")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def place(model, launch: LaunchConfig, train: bool = False):
    """``model`` on the stage's device; with gradient checkpointing when it is trained and asked for."""
    model.to(device_for(launch))
    if train and launch.gradient_checkpointing:
        model.activation_checkpointing_enable()  # transformers 5: the new name of gradient checkpointing
        model.config.use_cache = False  # the cache is useless with checkpointing, and transformers warns
    return model


def autocast(launch: LaunchConfig, device: torch.device):
    """bf16 autocast of the forward passes when ``launch.precision`` is bf16; weights, gradients and
    the optimizer stay fp32 (mixed precision, as the paper's runs did)."""
    if launch.precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def model_device(model) -> torch.device:
    """The device of a model's parameters (also through a DDP wrapper)."""
    return next(model.parameters()).device


def peak_memory() -> dict[str, float]:
    """This process's peak memory in MiB: its resident set (Linux ``ru_maxrss``) and, where it used a
    GPU, torch's peak CUDA allocation. Meaningful for a stage in a process of its own."""
    import resource

    out = {"rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out

"""Where and in what precision a stage computes: the device (the process's GPU under torchrun, else
the CPU), bf16 autocast, gradient checkpointing. The stages move a model here once and move each
batch to its model's device at the few places batches are made (``policy``, ``stages.lm_step.lm_loss``), so
the math functions never think about devices."""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

import torch

from grpo_core.config import LaunchConfig
from grpo_core.config.launch import TrainedStage
from grpo_core.env import numerics_settings
from grpo_core.lm import decode
from grpo_core.lm.attention import use_grouped_sdpa


def device_for(launch: LaunchConfig) -> torch.device:
    """cuda:LOCAL_RANK when asked for (or ``auto`` and one is present), else the CPU."""
    if launch.device == "cpu" or (launch.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("launch.device is cuda but torch sees no CUDA device (a CPU build of torch, or no GPU)")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def place(model, launch: LaunchConfig, train: TrainedStage | None = None):
    """``model`` on the stage's device; with gradient checkpointing where it is trained (``train``: the
    stage) and ``launch.gradient_checkpointing`` names that stage;
    grouped-query attention over a mask without repeated keys and values (``attention``: the same
    numbers, less memory). Also where the process takes ``launch.cuda_graphs`` (how ``generate``
    decodes on a GPU)."""
    decode.CUDA_GRAPHS = launch.cuda_graphs
    model.to(device_for(launch))
    use_grouped_sdpa(model)
    if train and launch.checkpointed(train):
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


# The process's peaks from before the last reset by ``stage_peak_memory``, so that resetting the
# high-water mark for one stage never loses the process's own.
_EARLIER_PEAK = {"rss_mib": 0.0, "cuda_mib": 0.0}


def _high_water_mib() -> float:
    """The resident high-water mark in MiB. On Linux ``VmHWM``, the mark of the address space the
    process has had since it started its program (or since ``stage_peak_memory`` reset it); not
    ``ru_maxrss``, which a process started from another inherits (the peak of the address space it
    replaced at exec), so that a small stage launched from a large flow would read the flow's peak.
    Elsewhere ``ru_maxrss`` (kilobytes, bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _cuda_used() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def peak_rss_mib() -> float:
    """This process's own peak resident set in MiB over its whole life."""
    return max(_EARLIER_PEAK["rss_mib"], _high_water_mib())


def peak_memory() -> dict[str, float]:
    """This process's peak memory in MiB: its resident set (``peak_rss_mib``) and, where it used a
    GPU, torch's peak CUDA allocation. A stage's own where the stage has the process to itself."""
    out = {"rss_mib": round(peak_rss_mib(), 1)}
    if _cuda_used():
        out["cuda_mib"] = round(max(_EARLIER_PEAK["cuda_mib"], torch.cuda.max_memory_allocated() / 2**20), 1)
    return out


def _reset_high_water() -> bool:
    """Set Linux's resident high-water mark back to the current resident set (``clear_refs``'s 5);
    False where the kernel offers no such reset (macOS, Windows, an old or locked-down kernel)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def stage_peak_memory():
    """The peak memory of the work inside the block, for a stage that runs in the flow's process:
    a dict filled on leaving, ``rss_mib`` (the resident high-water mark, reset on entering) and, where
    a GPU was used, ``cuda_mib`` (torch's peak allocation, reset likewise). The process's own peak over
    its life stays what ``peak_memory`` reports. Where the mark cannot be reset, the dict holds the
    process's peak so far as ``process_rss_mib``: an upper bound, not the stage's own. Two blocks at
    once (threads) would each read both; a flow's stages run one at a time."""
    _EARLIER_PEAK["rss_mib"] = peak_rss_mib()
    reset = _reset_high_water()
    if _cuda_used():
        _EARLIER_PEAK["cuda_mib"] = peak_memory()["cuda_mib"]
        torch.cuda.reset_peak_memory_stats()
    peaks: dict[str, float] = {}
    try:
        yield peaks
    finally:
        if reset:
            peaks["rss_mib"] = round(_high_water_mib(), 1)
        else:
            peaks["process_rss_mib"] = round(peak_rss_mib(), 1)
        if _cuda_used():
            peaks["cuda_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)


# MKL's conditional-numerical-reproducibility modes as its mkl_cbwr_get reports them (mkl_service.h).
_MKL_MODES = {
    1: "OFF",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    11: "AVX512_MIC",
    12: "AVX512",
    13: "AVX512_MIC_E1",
    14: "AVX512_E1",
}
_MKL_STRICT, _MKL_ALL = 0x10000, -1


def mkl_mode() -> str | None:
    """The mode MKL computes in, read from MKL itself: ``OFF`` (alignment-dependent results), ``AUTO``,
    ``COMPATIBLE``, a code path (``AVX2``...; MKL replaces one this CPU lacks by AUTO), with
    ``,STRICT``; None where this torch has no MKL. MKL fixes its mode at its first call (this is one)."""
    import ctypes

    try:  # torch links MKL statically; its service functions are exported under mkl_serv_ names
        get = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
    mode = get(_MKL_ALL)
    name = _MKL_MODES.get(mode & ~_MKL_STRICT, str(mode & ~_MKL_STRICT))
    return name + (",STRICT" if mode & _MKL_STRICT else "")


def numerics() -> dict:
    """The numerics this process computes with, for manifests (the thread count is the recipe's):
    the project's settings (``env.NUMERICS``, each with who set it), MKL's mode in effect, and
    torch's CPU kernel set (``AVX512``, ``AVX2``...). Warns where MKL's mode is not what ``MKL_CBWR``
    asks (MKL had already computed when the setting came: torch did arithmetic before ``grpo_core``
    was imported)."""
    mode = mkl_mode()
    wanted = os.environ.get("MKL_CBWR", "").strip()
    if mode is not None and (mode != "OFF") != bool(wanted):
        warnings.warn(
            f"MKL computes in mode {mode} but MKL_CBWR is {wanted or 'empty'!r}: MKL fixed its mode at its "
            "first call, before the setting; import grpo_core before computing with torch, or set "
            "MKL_CBWR in the environment. Results may differ in the last bits across resumes.",
            RuntimeWarning,
            stacklevel=2,
        )
    return {
        "settings": numerics_settings(),
        "mkl_mode": mode,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": cpu_model(),
    }


def cpu_model() -> str:
    """The CPU's vendor and model (``GenuineIntel: Intel(R) Xeon(R) ...``), so that two runs' manifests
    say whether they computed on the same kind of machine."""
    import platform

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()[:30]  # the first processor's
        info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in lines if ":" in line)}
        return f"{info['vendor_id']}: {info['model name']}"
    except (OSError, KeyError):
        return platform.processor() or platform.machine()


def probe_cases(trials: int = 150, seed: int = 0):
    """``trials`` random small cases of the operations a training step is made of, as
    ``(name, op, inputs)``: fp32 linear layers (MKL's GEMM), causal attention and log-softmax (torch's
    own kernels). The same cases for a seed, whatever the machine."""
    import random

    import torch.nn.functional as F

    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    size = lambda: rng.randint(1, 200)  # noqa: E731
    for _ in range(trials):
        k = size()
        yield "linear", F.linear, (torch.randn(size(), k, generator=gen), torch.randn(size(), k, generator=gen))
        yield (
            "causal_attention",
            lambda q: F.scaled_dot_product_attention(q, q * 0.5, q + 1, is_causal=True),
            (torch.randn(2, 2, size(), 16, generator=gen),),
        )
        yield "log_softmax", lambda x: torch.log_softmax(x, -1), (torch.randn(size(), 16 * size(), generator=gen),)


def alignment_mismatches(trials: int = 150, seed: int = 0) -> dict[str, int]:
    """The check behind ``env.NUMERICS``: each of ``probe_cases`` repeated with its inputs moved by 1,
    3 and 8 floats in memory; per operation, how many results differ from the first in any bit.
    Expected 0 everywhere; with MKL_CBWR off, AMD EPYC gives some (docs/reliability.md)."""

    def moved(x: torch.Tensor, offset: int) -> torch.Tensor:  # the same values at another address
        buf = torch.empty(x.numel() + offset, dtype=x.dtype)
        buf[offset:] = x.reshape(-1)
        return buf[offset:].view(x.shape)

    out: dict[str, int] = {}
    for name, op, inputs in probe_cases(trials, seed):
        first = op(*inputs)
        out[name] = out.get(name, 0) + sum(
            not torch.equal(op(*(moved(x, k) for x in inputs)), first) for k in (1, 3, 8)
        )
    return out


def set_compute(threads: int | None) -> None:
    """How a stage's process computes: the recipe's thread count, and torch's deterministic
    algorithms. Without them the backward of the shared-prompt log-prob pass (the prompts' keys and
    values selected per row, ``policy.CompletionLogprobs``: an indexed accumulation) sums in the
    order the threads finish: on a busy CPU GRPO's weights differed between two runs of the same
    steps (docs/reliability.md). ``warn_only``: an operation without a deterministic kernel warns."""
    if threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)

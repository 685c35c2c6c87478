"""Device, precision and memory options of the training stages (``launch``): bf16 autocast and
gradient checkpointing run on the CPU here; the CUDA tests run where a GPU is (``pytest -m gpu``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_core.config import LaunchConfig
from grpo_core.lm.runtime import device_for, peak_rss_mib
from grpo_core.stages.sft import run_sft
from grpo_core.tracking import NullLogger


class Recorder(NullLogger):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def log_metrics(self, metrics, step=None) -> None:
        if "train/loss" in metrics:
            self.losses.append(metrics["train/loss"])


def _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, name: str, *launch: str) -> list[float]:
    log = Recorder()
    run_sft(
        tiny_cfg(tmp_path / name, *launch, sft__max_steps=3, sft__eval_every=3),
        tiny_data_dir,
        tmp_path / name / "sft",
        log,
    )
    return log.losses


def test_bf16_autocast_and_gradient_checkpointing_train_on_cpu(tiny_cfg, tiny_data_dir, tmp_path):
    fp32 = _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, "fp32")
    ckpt = _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, "ckpt", "launch.gradient_checkpointing=[sft]")
    bf16 = _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, "bf16", "launch.precision=bf16")
    assert len(fp32) == len(ckpt) == len(bf16) == 3
    # Recomputing activations changes no arithmetic.
    assert ckpt == pytest.approx(fp32, rel=1e-5)
    # bf16 forward passes: the same curve to bf16's ~3 significant digits, but not bit for bit.
    assert all(math.isfinite(x) for x in bf16) and bf16 != fp32
    assert bf16 == pytest.approx(fp32, rel=2e-2)


def test_device_choice():
    assert device_for(LaunchConfig(device="cpu")).type == "cpu"
    if not torch.cuda.is_available():
        assert device_for(LaunchConfig()).type == "cpu"
        with pytest.raises(RuntimeError, match="no CUDA device"):
            device_for(LaunchConfig(device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_grpo_step_on_gpu(precision, tiny_cfg, tiny_data_dir, tiny_model_dir, tmp_path):
    from grpo_core.stages.grpo import run_grpo

    cfg = tiny_cfg(tmp_path, f"launch.precision={precision}", "launch.device=cuda", grpo__max_steps=2)
    manifest = run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "grpo")
    assert manifest["steps"] == 2 and math.isfinite(manifest["last_10_steps"]["kl"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sft_on_gpu_in_bf16_tracks_fp32(tiny_cfg, tiny_data_dir, tmp_path):
    fp32 = _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, "g32", "launch.device=cuda")
    bf16 = _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, "g16", "launch.device=cuda", "launch.precision=bf16")
    assert bf16 == pytest.approx(fp32, rel=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_decoding_samples_what_the_eager_loop_samples(tiny_model_dir, monkeypatch):
    """``launch.cuda_graphs`` (the default on a GPU) against the eager loop: the same greedy and
    sampled completions (measured on an H100: 100% of greedy tokens, 3-5x faster)."""
    import grpo_core.lm.decode as fast_decode
    from grpo_core.data import prompt_text
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.policy import generate

    model, tok = load_model(tiny_model_dir)
    model.cuda()
    prompts = [prompt_text(q) for q in ("What is 1 + 2?", "What is 13 - 4 + 7 - 2?") for _ in range(4)]
    runs = {}
    for graphs in (True, False):
        monkeypatch.setattr(fast_decode, "CUDA_GRAPHS", graphs)
        runs[graphs] = [
            generate(model, tok, prompts, max_new_tokens=16).texts,
            generate(model, tok, prompts, max_new_tokens=16, temperatures=[1.0] * 8, seed=1).texts,
        ]
    assert runs[True] == runs[False]


def test_place_takes_the_cuda_graphs_switch(tiny_model_dir):
    import grpo_core.lm.decode as fast_decode
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.runtime import place

    model, _ = load_model(tiny_model_dir)
    place(model, LaunchConfig(device="cpu", cuda_graphs=False))
    assert fast_decode.CUDA_GRAPHS is False
    place(model, LaunchConfig(device="cpu"))
    assert fast_decode.CUDA_GRAPHS is True


@pytest.mark.parametrize("setting, checkpointed", [(False, set()), (True, {"sft", "grpo"}), (["sft"], {"sft"})])
def test_gradient_checkpointing_is_set_per_trained_stage(tiny_model_dir, setting, checkpointed):
    """``launch.gradient_checkpointing``: every trained stage, the stages named, or none; a model
    placed to be evaluated never."""
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.runtime import place

    launch = LaunchConfig(device="cpu", gradient_checkpointing=setting)
    for stage in ("sft", "grpo", None):
        model, _ = load_model(tiny_model_dir)
        place(model, launch, train=stage)
        assert model.is_gradient_checkpointing == (stage in checkpointed), stage


def test_an_unknown_stage_to_checkpoint_is_refused_naming_the_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="gradient_checkpointing"):
        LaunchConfig(gradient_checkpointing=["policy"])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's /proc; elsewhere ru_maxrss")
def test_a_stage_process_reports_its_own_peak_not_its_parents():
    """A process started from a large one (a stage from the flow) reads its own peak resident set:
    ``ru_maxrss`` would carry the parent's, giving every small stage the flow's size."""
    ballast = bytearray(1024 * 2**20)
    ballast[:: 2**12] = b"\x01" * len(range(0, len(ballast), 2**12))  # touched: resident
    parent_peak = peak_rss_mib()
    code = "from grpo_core.lm.runtime import peak_memory; print(peak_memory()['rss_mib'])"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    del ballast
    assert parent_peak > 1024
    assert float(child.stdout) < parent_peak - 512  # the child imports torch, a few hundred MiB


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the high-water reset is Linux's clear_refs")
def test_a_stage_in_the_flows_process_reports_its_own_peak_and_the_process_keeps_its():
    """Stages that run inside the flow's process: each reads the peak of its own work (a small stage
    after a large one is small), while the process's peak over its life is still the large one's."""
    code = """
import json
from grpo_core.lm.runtime import peak_memory, stage_peak_memory

def touch(mib):
    block = bytearray(mib * 2**20)
    block[:: 2**12] = b"\\x01" * len(range(0, len(block), 2**12))  # resident
    return block

with stage_peak_memory() as large:
    block = touch(768)
    del block
with stage_peak_memory() as small:
    block = touch(64)
    del block
print(json.dumps({"large": large, "small": small, "process": peak_memory()}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    large, small, process = out["large"]["rss_mib"], out["small"]["rss_mib"], out["process"]["rss_mib"]
    assert large > small + 600  # the second stage does not carry the first's 768 MiB
    assert small > 64 and process >= large

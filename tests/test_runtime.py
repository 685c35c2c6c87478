"""Device, precision and memory options of the training stages (``launch``): bf16 autocast and
gradient checkpointing run on the CPU here; the CUDA tests run where a GPU is (``pytest -m gpu``)."""
from __future__ import annotations

import math

import pytest
import torch

from grpo_core.config import LaunchConfig
from grpo_core.lm.runtime import device_for
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
    run_sft(tiny_cfg(tmp_path / name, *launch, sft__max_steps=3, sft__eval_every=3), tiny_data_dir,
            tmp_path / name / "sft", log)
    return log.losses


def test_bf16_autocast_and_gradient_checkpointing_train_on_cpu(tiny_cfg, tiny_data_dir, tmp_path):
    fp32 = _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, "fp32")
    ckpt = _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, "ckpt", "launch.gradient_checkpointing=true")
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

    cfg = tiny_cfg(tmp_path, f"launch.precision={precision}", "launch.device=cuda", grpo__steps=2)
    manifest = run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "grpo")
    assert manifest["steps"] == 2 and math.isfinite(manifest["last_10_steps"]["kl"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sft_on_gpu_in_bf16_tracks_fp32(tiny_cfg, tiny_data_dir, tmp_path):
    fp32 = _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, "g32", "launch.device=cuda")
    bf16 = _sft_losses(tiny_cfg, tiny_data_dir, tmp_path, "g16", "launch.device=cuda", "launch.precision=bf16")
    assert bf16 == pytest.approx(fp32, rel=2e-2)

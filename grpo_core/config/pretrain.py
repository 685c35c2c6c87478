"""``pretrain``: continued pretraining on the corpus before SFT."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grpo_core.config.base import BudgetField, Training


class PretrainConfig(Training):
    """Continued pretraining on the corpus stage's pages (paper §2.2 / DeepSeek LLM's schedule):
    AdamW(0.9, 0.95), weight decay 0.1, linear warmup, then the lr steps down to 31.6% of the peak
    at 80% of training and to 10% at 90%. Its model is where SFT starts when ``train`` is on."""

    train: bool = Field(False, description="run the corpus stage and continued pretraining before SFT")
    lr: float = Field(4.2e-4, gt=0, description="peak learning rate (DeepSeekMath-Base 7B: 4.2e-4)")
    schedule: Literal["multistep", "constant"] = Field(
        "multistep", description="lr schedule: DeepSeek LLM's multi-step"
    )
    warmup_steps: int = Field(2000, ge=0, description="linear warmup steps (paper: 2000)")
    max_steps: int = BudgetField(
        1000, ge=1, description="optimizer steps (the schedule's 80% / 90% marks are of these)"
    )
    max_seconds: float | None = BudgetField(
        None,
        gt=0,
        description=(
            "stop after this much training time, evaluations not counted (the schedule still follows max_steps)"
        ),
    )
    batch_size: int = Field(32, ge=1, description="packed rows per optimizer step")
    context_length: int = Field(4096, ge=16, description="packed row length")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay (paper: 0.1)")
    log_every: int = BudgetField(10, ge=1, description="steps between logged training metrics")

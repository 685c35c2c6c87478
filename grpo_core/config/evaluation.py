"""``eval``: how a model is evaluated: test questions, samples for maj@K / pass@K, completion length."""

from __future__ import annotations

from pydantic import Field

from grpo_core.config.base import Section


class EvalConfig(Section):
    n_questions: int | None = Field(None, ge=1, description="cap on test questions; None = all")
    samples: int = Field(1, ge=1, description="K for maj@K / pass@K (1 = greedy only)")
    temperature: float = Field(0.7, gt=0, description="sampling temperature for maj@K / pass@K")
    max_new_tokens: int = Field(1024, ge=1, description="completion length cap (also for validation)")
    batch_size: int = Field(64, ge=1, description="questions per generate call")
    log_examples: int = Field(20, ge=0, description="sample completions logged as an MLflow table")

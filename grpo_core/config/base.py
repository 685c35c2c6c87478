"""What every section shares: the frozen, closed ``Section``, ``Training`` (what the training loop
reads from every trained stage) and ``BudgetField`` (a field a resume may change)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def BudgetField(default: Any, **kwargs: Any) -> Any:  # noqa: N802 (a pydantic Field, named like one)
    """A field that only sets how long or how often a stage runs: changing it keeps a resume valid
    (extending a run is the point of resuming; ``stages.identity.run_identity``). Marked ``[budget]``
    in the config reference."""
    return Field(default, json_schema_extra={"budget": True}, **kwargs)


def budget_fields(section: type[BaseModel]) -> set[str]:
    return {k for k, f in section.model_fields.items() if (f.json_schema_extra or {}).get("budget")}


class Training(Section):
    """What the one training loop (``training/trainer.py``) reads from every trained stage: the
    optimiser (AdamW with the paper's betas), the schedule, clipping, budget and checkpoints."""

    lr: float = Field(1e-5, gt=0, description="peak learning rate")
    schedule: Literal["constant"] = Field("constant", description="lr schedule (training/schedules.py)")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas (paper: 0.9, 0.95)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    max_seconds: float | None = BudgetField(
        None, gt=0, description="stop after this much training time (evaluations not counted)"
    )
    checkpoint_every: int | None = BudgetField(100, ge=1, description="steps between checkpoints")
    keep_checkpoints: int = BudgetField(2, ge=1, description="complete checkpoints kept")

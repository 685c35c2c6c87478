"""``rounds``: iterative RL, the rounds of reward data, reward models and GRPO."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grpo_core.config.base import Section


class RoundsConfig(Section):
    """Iterative RL (paper §4.2): every round samples from the current policy, labels the samples,
    continues training the reward models on them plus a replay of earlier rounds' data, then runs
    GRPO from the current policy with the reference reset to it. Round 1 is the plain pipeline:
    reward models trained on the SFT model's samples, GRPO from the SFT model."""

    count: int = Field(
        1,
        ge=1,
        description=(
            "RL rounds (each: reward data, reward models, GRPO; steps per round are grpo.max_steps / grpo.max_seconds)"
        ),
    )
    replay_fraction: float = Field(
        0.1, ge=0, lt=1, description="share of each retraining set drawn from earlier rounds' data (paper: 10%)"
    )
    on_gate_failure: Literal["report", "exclude"] = Field(
        "report",
        description=(
            "a reward model that fails its quality gate: report it loudly and use it anyway, or also keep it out of "
            "that round's GRPO reward (process supervision falls back to outcome without the PRM)"
        ),
    )

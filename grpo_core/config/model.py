"""``model``: the starting model; and ``LoraSettings``, the adapter ``sft.lora`` and ``grpo.lora`` train."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_core.config.base import Section


class ModelConfig(Section):
    """``tiny`` builds a Llama from a config and a character tokenizer; otherwise a local HF folder."""

    init: Literal["tiny", "pretrained"] = Field("tiny", description="tiny Llama from config, or a local HF folder")
    path: str | None = Field(None, description="local HF model folder for init=pretrained")
    hidden_size: int = Field(128, ge=8, description="tiny model width")
    intermediate_size: int = Field(384, ge=8, description="tiny model MLP width")
    num_layers: int = Field(4, ge=1, description="tiny model depth")
    num_heads: int = Field(4, ge=1, description="tiny model attention heads")
    max_length: int = Field(256, ge=16, description="context length of the tiny model")
    calculator: bool = Field(
        False,
        description="the model writes with a calculator: where a line reaches an arithmetic expression and "
        "'=', the sampler writes the result (grpo_core/calculator.py) and the losses leave those tokens out; "
        "SFT trains on solutions in that form and saves the setting with the model, whose every sampler "
        "(evaluation, reward data, GRPO) then uses it",
    )

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.init == "pretrained" and not self.path:
            raise ValueError("init=pretrained needs path (a local Hugging Face model folder)")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        return self


class LoraSettings(Section):
    """A LoRA adapter (Hu et al. 2021) trained in place of the whole model, through ``peft`` (the
    transformers integration): the base's weights stay frozen, the stage saves the adapter alone
    (``lm/adapters.py``). rank 16 on every linear layer of SmolLM2-135M is ~4.9M parameters."""

    rank: int = Field(16, ge=1, description="r: the adapter's rank")
    alpha: float = Field(32.0, gt=0, description="lora_alpha: the update is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input (0 keeps a step deterministic)")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description=(
            "the layers given an adapter: all-linear (every linear layer but the output head) or their names, e.g. "
            "[q_proj, v_proj]"
        ),
    )

"""``PipelineConfig``: the whole recipe, a field per section, and the checks across sections."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from grpo_core.config.base import Section
from grpo_core.config.corpus import CorpusConfig
from grpo_core.config.data import DataConfig
from grpo_core.config.evaluation import EvalConfig
from grpo_core.config.grpo import GRPOConfig
from grpo_core.config.launch import LaunchConfig
from grpo_core.config.model import ModelConfig
from grpo_core.config.pretrain import PretrainConfig
from grpo_core.config.reward_models import ORMConfig, PRMConfig, RewardDataConfig
from grpo_core.config.rounds import RoundsConfig
from grpo_core.config.sft import SFTConfig
from grpo_core.config.tracking import TrackingConfig


class PipelineConfig(Section):
    run_name: str = Field("demo", pattern=r"^[A-Za-z0-9_.-]+$", description="runs/<run_name>, MLflow parent run name")
    seed: int = Field(0, description="seeds data, init and rollouts")
    output_dir: str = Field("runs", description="where run folders go")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; None = torch default")
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    sft: SFTConfig = SFTConfig()
    reward_data: RewardDataConfig = RewardDataConfig()
    orm: ORMConfig = ORMConfig()
    prm: PRMConfig = PRMConfig()
    grpo: GRPOConfig = GRPOConfig()
    rounds: RoundsConfig = RoundsConfig()
    eval: EvalConfig = EvalConfig()
    tracking: TrackingConfig = TrackingConfig()
    launch: LaunchConfig = LaunchConfig()
    corpus: CorpusConfig = CorpusConfig()
    pretrain: PretrainConfig = PretrainConfig()

    @model_validator(mode="after")
    def _reward_models_trained(self) -> "PipelineConfig":
        for kind in self.grpo.reward_models_used:
            if not getattr(self, kind).train:
                raise ValueError(f"grpo.reward_weights uses {kind} but {kind}.train is false")
        if self.grpo.prm_oracle and self.data.source != "arithmetic":
            raise ValueError(
                "grpo.prm_oracle checks steps against the arithmetic task's chain: data.source must be arithmetic"
            )
        if self.model.calculator:
            self._calculator_supported()
        if self.launch.strategy == "fsdp" and (self.sft.lora or self.grpo.lora):
            raise ValueError(
                "lora with launch.strategy=fsdp is not built (sharding the frozen base beside the adapter): "
                "use strategy ddp, which holds the base once per process"
            )
        return self

    def _calculator_supported(self) -> None:
        """``model.calculator`` where its tokens cannot be told from the model's is refused, not run."""
        if self.sft.lora is not None:
            raise ValueError(
                "model.calculator with sft.lora is not built: an adapter is saved without the model's config, "
                "so the models after SFT would sample without the calculator"
            )
        if self.grpo.algorithm == "ppo":
            raise ValueError(
                "model.calculator with grpo.algorithm=ppo is not built: its value model, GAE and per-token KL "
                "would read the calculator's tokens as the policy's"
            )
        if trained := [kind for kind in ("orm", "prm") if getattr(self, kind).train]:
            raise ValueError(
                f"model.calculator with {' and '.join(f'{k}.train' for k in trained)} is not built: the reward "
                "models' likelihood reading and their gate's baseline (the SFT model's token probabilities) "
                "would count the calculator's tokens as the model's"
            )

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

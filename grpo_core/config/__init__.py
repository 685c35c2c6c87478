"""The recipe as typed, frozen pydantic models: one ``PipelineConfig`` with a section per stage.

An invalid recipe fails here, before any work, with the field path and the reason. Defaults are the
DeepSeekMath paper's (arXiv 2402.03300) unless a comment says why the tiny task needs another value.

A module per section, named after it: data, corpus, pretrain, model (with the ``LoraSettings`` that
sft and grpo share), sft, reward_models (reward_data, orm, prm), grpo (with its ppo), rounds,
evaluation (eval), launch, tracking. ``base`` holds what they share (``Section``, ``Training``,
``BudgetField``); ``pipeline`` holds ``PipelineConfig`` and its checks across sections.
"""

from __future__ import annotations

from grpo_core.config.base import BudgetField, Section, Training, budget_fields
from grpo_core.config.corpus import CorpusConfig
from grpo_core.config.data import ArithmeticTask, BenchmarkData, DataConfig, HeldOutSet
from grpo_core.config.evaluation import EvalConfig
from grpo_core.config.grpo import GRPOConfig, PPOConfig
from grpo_core.config.launch import LaunchConfig
from grpo_core.config.model import LoraSettings, ModelConfig
from grpo_core.config.pretrain import PretrainConfig
from grpo_core.config.reward_models import ORMConfig, PRMConfig, RewardDataConfig, RewardModelConfig
from grpo_core.config.rounds import RoundsConfig
from grpo_core.config.sft import SFTConfig
from grpo_core.config.tracking import TrackingConfig
from grpo_core.config.pipeline import PipelineConfig

__all__ = [
    "ArithmeticTask",
    "BenchmarkData",
    "BudgetField",
    "CorpusConfig",
    "DataConfig",
    "EvalConfig",
    "GRPOConfig",
    "HeldOutSet",
    "LaunchConfig",
    "LoraSettings",
    "ModelConfig",
    "ORMConfig",
    "PPOConfig",
    "PRMConfig",
    "PipelineConfig",
    "PretrainConfig",
    "RewardDataConfig",
    "RewardModelConfig",
    "RoundsConfig",
    "SFTConfig",
    "Section",
    "TrackingConfig",
    "Training",
    "budget_fields",
]

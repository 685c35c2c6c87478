"""Reward functions: completion texts and gold answers in, one float per completion out.

Completions are untrusted model output; the rule reward only parses and compares (grpo_core.verify).
"""
from __future__ import annotations

import torch

from grpo_core.verify import is_correct


def rule_reward(completions: list[str], golds: list[str]) -> torch.Tensor:
    """[B] 1.0 where the completion's final answer equals the gold answer, else 0.0."""
    return torch.tensor([float(is_correct(c, g)) for c, g in zip(completions, golds)])

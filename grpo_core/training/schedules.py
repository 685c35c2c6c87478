"""Learning-rate schedules, one registry for every stage (verl's ``core_algos`` registry is the
model). Each maps (config section, 0-based optimizer step, the plateau controller's lr) to the lr;
a section names its schedule in ``schedule``."""

from __future__ import annotations

import math


def constant(sc, step: int, plateau_lr: float) -> float:
    """The paper's SFT and reward-model schedule."""
    return sc.lr


def cosine(sc, step: int, plateau_lr: float) -> float:
    """Cosine from ``lr`` to ``min_lr`` over ``max_steps``."""
    frac = min(step / sc.max_steps, 1.0)
    return sc.min_lr + 0.5 * (sc.lr - sc.min_lr) * (1 + math.cos(math.pi * frac))


def plateau(sc, step: int, plateau_lr: float) -> float:
    """Reduce on plateau: the training loop lowers ``plateau_lr`` after evaluations that do not improve."""
    return plateau_lr


def multistep(sc, step: int, plateau_lr: float) -> float:
    """DeepSeek LLM §2.3 (continued pretraining): linear warmup to the peak over ``warmup_steps``
    (the peak at step warmup_steps - 1), the peak until 80% of ``max_steps``, 31.6% of it until
    90%, then 10%."""
    if step < sc.warmup_steps:
        return sc.lr * (step + 1) / sc.warmup_steps
    if step < 0.8 * sc.max_steps:
        return sc.lr
    return sc.lr * (0.316 if step < 0.9 * sc.max_steps else 0.1)


def warmup(sc, step: int, plateau_lr: float) -> float:
    """GRPO: linear warmup from 0 over ``warmup_steps`` (the peak from step warmup_steps on), then
    constant (the paper states none; 0 steps is the paper's constant lr)."""
    return sc.lr * min(1.0, (step + 1) / (sc.warmup_steps + 1))


SCHEDULES = {f.__name__: f for f in (constant, cosine, plateau, multistep, warmup)}


def learning_rate(sc, step: int, plateau_lr: float) -> float:
    """The lr of optimizer step ``step`` under section ``sc``'s schedule."""
    return SCHEDULES[sc.schedule](sc, step, plateau_lr)

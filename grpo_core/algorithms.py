"""The RL algorithms of the ``grpo`` stage as peers (``grpo.algorithm``), one row each.

The paper's unified paradigm (§5.2.1) sets them apart by data source, reward function and gradient
coefficient; here each row says which model samples the rollouts, which advantage estimator gives the
coefficient (an ``Estimator``, one Enum of names as verl's ``core_algos`` has; the functions are
``stages/estimators.py``'s table), where ``grpo.beta``'s
KL to the reference goes, and which models it trains beside the policy. The rollout, the reward
sources, the clipped policy update and the step's metrics are shared (``stages/rl_step.py``). The recipe
validator (``config.GRPOConfig``) reads this table to refuse settings an algorithm would ignore;
the stage reads it to pick the sampler, the estimator and the models it loads.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal, NamedTuple


class Estimator(str, Enum):
    """The advantage estimators, by name."""

    GROUP = "group"  # GRPO (§4.1.2-4.1.3): group z-scores of the rewards, or the process credit of the steps'
    CORRECT = "correct"  # RFT and online RFT (§5.2.1): 1[correct]
    GAE = "gae"  # PPO (§4.1.1): GAE on a value model's estimates


class Algorithm(NamedTuple):
    samples: Literal["policy", "reference"]  # the rollouts' model: pi_old, or the frozen starting model
    advantage: Estimator  # the gradient coefficient
    kl: Literal["loss", "reward", "none"]  # grpo.beta: k3 KL term in the loss, per-token penalty in the reward, none
    trains: tuple[str, ...] = ()  # models trained beside the policy


class KL(NamedTuple):
    """``grpo.beta`` where the algorithm puts it: the weight of the k3 KL term in the policy loss, and
    of the per-token KL penalty in the reward (at most one of them nonzero)."""

    loss: float = 0.0
    reward: float = 0.0

    @property
    def reference(self) -> bool:
        """Whether the KL needs the frozen reference model."""
        return self.loss > 0 or self.reward > 0


ALGORITHMS: dict[str, Algorithm] = {
    "grpo": Algorithm("policy", Estimator.GROUP, "loss"),  # §4.1: group-normalised rewards, KL in the loss
    "ppo": Algorithm(
        "policy", Estimator.GAE, "reward", ("value",)
    ),  # §4.1.1 (eq. 1-2): value model, GAE, KL in the reward
    "online_rft": Algorithm("policy", Estimator.CORRECT, "none"),  # §5.2.1: the policy's correct samples
    "rft": Algorithm("reference", Estimator.CORRECT, "none"),  # §5.2.1: the starting model's correct samples
}


def kl_weights(algorithm: str, beta: float) -> KL:
    """``beta`` placed by ``algorithm``'s row (the one reading of ``grpo.beta``); a beta that the
    algorithm has no place for is refused, not dropped."""
    place = ALGORITHMS[algorithm].kl
    if place == "none" and beta > 0:
        raise ValueError(f"algorithm={algorithm} has no KL term: beta must be 0 (got {beta})")
    return KL(loss=beta if place == "loss" else 0.0, reward=beta if place == "reward" else 0.0)

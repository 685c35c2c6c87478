"""``grpo``: the RL stage (GRPO or a peer algorithm) and its ``ppo`` settings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo_core.algorithms import ALGORITHMS, KL, Estimator, kl_weights
from grpo_core.config.base import BudgetField, Section, Training
from grpo_core.config.model import LoraSettings


class PPOConfig(Section):
    """PPO's own settings (paper §4.1.1): GAE and the value model, trained beside the policy by the
    same trainer (same schedule; its lr a multiple of the policy's)."""

    gae_gamma: float = Field(1.0, ge=0, le=1, description="GAE discount gamma")
    gae_lambda: float = Field(1.0, ge=0, le=1, description="GAE lambda")
    value_clip: float = Field(0.2, gt=0, description="clip of the value update around the old values")
    value_lr: float | None = Field(
        None, gt=0, description="the value model's learning rate (scheduled as the policy's); None = grpo.lr"
    )


class GRPOConfig(Training):
    """GRPO (paper §4.1): G samples per question, group z-score advantages, k3 KL in the loss."""

    max_steps: int = BudgetField(
        100, ge=0, description="optimizer steps, i.e. exploration stages (each: rollout + mu updates)"
    )
    questions_per_step: int = Field(16, ge=1, description="questions per step (paper: 1024 / 64 = 16)")
    group_size: int = Field(64, ge=2, description="G: completions per question")
    lr: float = Field(1e-6, gt=0, description="policy learning rate (paper: 1e-6)")
    schedule: Literal["warmup"] = Field("warmup", description="lr schedule: linear warmup, then constant")
    warmup_steps: int = Field(0, ge=0, description="linear lr warmup from 0 (paper: none stated)")
    beta: float = Field(
        0.04,
        ge=0,
        description=(
            "KL coefficient to the reference: in the loss (grpo), in the per-token reward (ppo); refused for rft / "
            "online_rft, which have none; 0 loads no reference"
        ),
    )
    clip_eps: float = Field(0.2, gt=0, description="ratio clip epsilon")
    clip_eps_high: float | None = Field(None, gt=0, description="upper clip (DAPO clip-higher); None = clip_eps")
    loss_agg: Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"] = Field(
        "seq-mean-token-mean", description="paper | DAPO | Dr. GRPO aggregation"
    )
    inner_updates: int = Field(1, ge=1, description="mu: updates per exploration stage")
    minibatch_size: int | None = Field(None, ge=1, description="completions per update; None=all")
    micro_batch_rows: int | None = Field(
        None,
        ge=1,
        description="distinct completions per forward and backward pass of an update, their gradients summed "
        "into the update's one step: the same update holding a share of the activations; None: the whole "
        "minibatch in one pass",
    )
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the rollouts")
    # Optional spread across a group, e.g. [0.7, 1.0]: sample i uses temperatures[i % len].
    temperatures: tuple[float, ...] | None = Field(None, description="spread within a group: sample i uses [i % len]")
    max_new_tokens: int = Field(1024, ge=1, description="completion length cap (paper: 1024)")
    eval_every: int = BudgetField(50, ge=1, description="steps between validation accuracy checks")
    # Picking the best checkpoint by validation accuracy uses the answer checker; without a verifier
    # (a learned reward alone) the run's last policy is what a user would have.
    keep_best: bool = Field(
        True,
        description=(
            "publish the checkpoint with the best validation accuracy (the answer checker on the validation "
            "questions); false: the last one"
        ),
    )
    checkpoint_every: int = BudgetField(50, ge=1, description="steps between checkpoints")
    save_rollouts: bool = Field(
        True, description="keep every checked rollout (rollouts.jsonl): the next round's reward-model data"
    )
    # Reward of a solution = sum of weight x source. rule: answer checker (0/1); orm: sigmoid of the
    # ORM; prm: with outcome supervision the lowest step probability, with process supervision the
    # per-step probabilities (outcome sources then count as a reward on the last step).
    reward_weights: dict[Literal["rule", "orm", "prm"], float] = Field(
        {"rule": 1.0}, description="weighted reward sources: rule, orm, prm"
    )
    supervision: Literal["outcome", "process"] = Field(
        "outcome", description="outcome (one reward per solution) or process (PRM step rewards)"
    )
    # How process supervision turns step scores into token advantages (``advantages.PROCESS_CREDIT``):
    # centred, outcome GRPO's advantage plus the PRM's score of the token's own step centred among the
    # group's completions of the same checker verdict at that step (no position bias); or the paper's
    # form, every step of the group z-scored together with the outcome on the last step, a token
    # credited with the sum (the paper) or the minimum (PURE, arXiv 2504.15275) of those ahead.
    process_credit: Literal["centred", "sum", "min"] = Field(
        "centred",
        description=(
            "supervision=process: centred (outcome GRPO's advantage plus the PRM's step score centred within the "
            "group at each step position and checker verdict), or the paper's normalised step rewards of the steps "
            "at or after a token, summed (sum) or their minimum (min, PURE)"
        ),
    )
    prm_oracle: bool = Field(
        False,
        description=(
            "the arithmetic task's exact step checker stands in for the PRM (reward_weights.prm): a step scores 1 "
            "while every line so far is the reference chain's, else 0; the upper bound of process supervision"
        ),
    )
    # Sparse rewards (stages/questions.py): a group whose rewards are all equal gives no gradient.
    curriculum: float = Field(
        0.0,
        ge=0,
        le=1,
        description=(
            "share of each step's questions drawn from those the policy solved sometimes (0 < right < samples) in the "
            "round's reward-data samples, the rest uniformly (open-r1's pass-rate filter, softened); 0 = uniform "
            "(paper)"
        ),
    )
    redraws: int = Field(
        0,
        ge=0,
        description=(
            "dynamic sampling (DAPO §3.2): a question whose group has no reward spread (where the answer checker is "
            "weighted: whose verdicts are all alike) gives its place to another question's group, up to this many more "
            "groups per place (the bound on extra sampling); 0 = keep every group (paper)"
        ),
    )
    # The §5 comparison: the table of algorithms (``algorithms.ALGORITHMS``) says what each one
    # samples, its advantage, where the KL goes and what it trains beside the policy.
    algorithm: Literal["grpo", "ppo", "rft", "online_rft"] = Field(
        "grpo", description="grpo; or ppo, rft, online_rft (the §5 comparison, grpo_core/algorithms.py)"
    )
    ppo: PPOConfig | None = Field(
        None, description="algorithm=ppo only (filled with the defaults below when absent): the value model and GAE"
    )
    lora: LoraSettings | None = Field(
        None,
        description=(
            "train a LoRA adapter on the starting model instead of every weight; the reference is the policy with its "
            "adapter off (no second copy)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _algorithm_defaults(cls, data: Any) -> Any:
        """Defaults that depend on the algorithm: no KL weight where it has no KL term (RFT), and
        PPO's section for PPO."""
        if isinstance(data, dict) and data.get("algorithm") in ALGORITHMS:
            alg = ALGORITHMS[data["algorithm"]]
            data = {
                **data,
                **({"beta": data.get("beta", 0.0)} if alg.kl == "none" else {}),
                **({"ppo": data.get("ppo") or {}} if "value" in alg.trains else {}),
            }
        return data

    @field_validator("reward_weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        if any(w < 0 for w in v.values()) or not any(w > 0 for w in v.values()):
            raise ValueError("weights must be >= 0 with at least one > 0")
        return v

    @field_validator("temperatures")
    @classmethod
    def _positive(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and (not v or min(v) <= 0):
            raise ValueError("temperatures must be a non-empty list of positive numbers")
        return v

    @model_validator(mode="after")
    def _check(self) -> "GRPOConfig":
        if self.minibatch_size is not None:
            batch = self.questions_per_step * self.group_size
            if batch % self.minibatch_size:
                raise ValueError(
                    f"batch of {batch} completions (questions_per_step x group_size) is not "
                    f"divisible by minibatch_size={self.minibatch_size}"
                )
            if self.minibatch_size % self.group_size:
                raise ValueError("minibatch_size must hold whole groups (a multiple of group_size)")
        if self.supervision == "process" and not self.reward_weights.get("prm"):
            raise ValueError("supervision=process needs a PRM: give reward_weights.prm a weight > 0")
        if self.process_credit != "centred" and self.supervision != "process":
            raise ValueError(f"process_credit={self.process_credit} applies to supervision=process only")
        if self.prm_oracle and not self.reward_weights.get("prm"):
            raise ValueError("prm_oracle stands in for the PRM: give reward_weights.prm a weight > 0")
        alg, name = ALGORITHMS[self.algorithm], f"algorithm={self.algorithm}"
        kl_weights(self.algorithm, self.beta)  # refuses a beta the algorithm has no place for
        if alg.advantage == Estimator.CORRECT and (
            set(self.reward_weights) != {"rule"} or self.supervision != "outcome"
        ):
            raise ValueError(
                f"{name} learns from the answer checker's verdict (advantage 1[correct]): "
                f"reward_weights must be {{rule: ...}} with supervision=outcome"
            )
        if alg.advantage == Estimator.GAE and self.supervision == "process":
            raise ValueError(f"{name} takes outcome supervision (one reward per solution)")
        if self.redraws and alg.advantage != Estimator.GROUP:
            raise ValueError(
                f"redraws (dynamic sampling) keeps groups whose GRPO advantages have spread; {name} "
                f"has no group advantage: set redraws to 0"
            )
        if self.redraws and self.supervision == "process" and not self.reward_weights.get("rule"):
            raise ValueError(
                "redraws (dynamic sampling) under supervision=process keeps the groups whose answer "
                "checker verdicts differ (the PRM's step rewards give nearly every group spread): give "
                "reward_weights.rule a weight > 0, or set redraws to 0"
            )
        if self.ppo is not None and "value" not in alg.trains:
            raise ValueError(f"the ppo section applies to algorithm=ppo only ({name})")
        if self.lora is not None and ("value" in alg.trains or alg.samples == "reference"):
            raise ValueError(
                f"lora is built for algorithms that sample the policy and keep no value model; {name} "
                f"{'trains a value model from the policy' if 'value' in alg.trains else 'samples the reference'}: "
                f"remove grpo.lora"
            )
        return self

    @property
    def kl(self) -> KL:
        """``beta`` where the algorithm puts it (``algorithms.kl_weights``): in the loss, in the reward."""
        return kl_weights(self.algorithm, self.beta)

    @property
    def loads_reference(self) -> bool:
        """Whether the stage needs the frozen starting model: it samples (RFT) or anchors the KL."""
        return ALGORITHMS[self.algorithm].samples == "reference" or self.kl.reference

    @property
    def reward_models_used(self) -> tuple[str, ...]:
        """The learned reward models (``orm``, ``prm``) with a weight > 0 (the PRM unless the oracle stands in)."""
        return tuple(
            k for k in ("orm", "prm") if self.reward_weights.get(k, 0) > 0 and not (k == "prm" and self.prm_oracle)
        )

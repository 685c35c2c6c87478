"""``reward_data``, ``orm`` and ``prm``: the reward models' data and their training."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_core.config.base import BudgetField, Section, Training


class RewardDataConfig(Section):
    """Reward-model data sampled from the SFT policy on RL questions (Math-Shepherd step labels)."""

    questions: int = Field(512, ge=2, description="RL questions sampled for reward-model data")
    # Step labels cost mc_rollouts generations per step; outcome pairs cost nothing beyond sampling.
    step_questions: int | None = Field(
        None, ge=1, description="how many of those questions get Monte-Carlo step labels; None = all"
    )
    samples_per_question: int = Field(8, ge=2, description="k: solutions sampled per question")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of those solutions")
    max_new_tokens: int = Field(1024, ge=1, description="solution length cap")
    step_separator: str = Field("\n", min_length=1, description="a step is the text between separators")
    # mc: Math-Shepherd rollouts (any task); exact: the arithmetic step checker (demo task only).
    labeler: Literal["mc", "exact"] = Field(
        "mc", description="step labels: Monte-Carlo rollouts or the exact arithmetic checker"
    )
    mc_rollouts: int = Field(8, ge=1, description="n: completions rolled out from each step prefix (Math-Shepherd: 8)")
    max_pairs_per_question: int = Field(4, ge=1, description="chosen/rejected pairs kept per question")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="questions held out to measure the reward models")
    batch_size: int = Field(256, ge=1, description="sequences per generate call")
    # Round k+1 also learns from the solutions GRPO sampled and checked in round k (fresh policy
    # samples, free: no generation). Steps are labelled only by the exact checker (MC would cost
    # rollouts); held-out questions' rollouts are dropped, so the held-out set stays unseen.
    distinct_solutions: bool = Field(
        True,
        description=(
            "the ORM's training rows hold each different solution of a question once (repeats cost time, add little)"
        ),
    )
    # Arithmetic task only: solutions with one planted error (a result off by 1-3 or an operand
    # miscopied, carried on), labelled exactly; they teach the reward models to check each step
    # where the policy's own mistakes alone teach which questions are hard.
    planted_errors: int = Field(
        0,
        ge=0,
        description=(
            "per training question, this many solutions with one planted error, labelled exactly (arithmetic only)"
        ),
    )
    rollouts: int | None = Field(
        None,
        ge=0,
        description=(
            "the previous round's GRPO rollouts added to the training data (a random subset of this many; None = all, "
            "0 = none)"
        ),
    )


class RewardModelConfig(Training):
    """Training of one reward model: round 1 starts from ``init``, later rounds from the previous
    round's reward model."""

    train: bool = Field(False, description="train this reward model in the pipeline")
    # The paper initialises its reward models from the base model; a separate (wider, deeper) model
    # lets a user measure whether the reward model's capacity, not its data, is the limit.
    init: str = Field(
        "sft",
        min_length=1,
        description=(
            "round 1's starting model: sft (the SFT checkpoint), tiny (a fresh tiny Llama: the `model` section with "
            "`tiny` overrides, the SFT tokenizer) or a local HF folder with the SFT model's tokenizer"
        ),
    )
    # linear: a fresh one-output head on the starting model's hidden states (TRL's PRM, the usual
    # ORM); likelihood: the starting model's own token probabilities, calibrated (rewards/likelihood.py):
    # measured on the demo's round-1 data, it keeps and improves what the SFT model knows where a
    # fresh head fine-tuned on a few thousand solutions learns length and operand cues instead.
    # lm: Math-Shepherd's format, for a starting model that was trained to verify.
    head: Literal["linear", "likelihood", "lm"] = Field(
        "linear",
        description=(
            "linear (a fresh score head on the hidden states), likelihood (the model's own token probabilities, "
            "calibrated: a step scores its least likely token so far) or lm (Math-Shepherd: the logit of lm_tokens[0] "
            "minus lm_tokens[1] after a step)"
        ),
    )
    lm_tokens: tuple[str, str] = Field(
        ("+", "-"),
        description=(
            "head=lm: the tokens that read as a step being right and wrong (Math-Shepherd: + and -); each one token of "
            "the model's tokenizer"
        ),
    )
    tiny: dict[Literal["hidden_size", "intermediate_size", "num_layers", "num_heads"], int] = Field(
        {}, description="init=tiny: changes to the `model` section's shape, e.g. {hidden_size: 256}"
    )
    min_auc: float = Field(
        0.6,
        ge=0,
        le=1,
        description=(
            "quality gate: a reward model that drives GRPO with a held-out AUC within questions (what GRPO's "
            "group-normalised reward sees) below this, or no better than the SFT model's own likelihood, is reported "
            "loudly (log, MLflow tag, Prefect artifact)"
        ),
    )
    min_questions: int = Field(
        0,
        ge=0,
        description=(
            "quality gate: with fewer held-out questions than this that have right and wrong solutions, the verdict "
            "is undecided (the gate fails, saying the held-out set is too small)"
        ),
    )
    epochs: int = BudgetField(1, ge=1, description="passes over the training data")
    max_steps: int | None = BudgetField(
        None, ge=1, description="stop after this many updates, or after the epochs, whichever comes first"
    )
    batch_size: int = Field(32, ge=1, description="pairs (ORM) or solutions (PRM) per step")
    checkpoint_every: int | None = BudgetField(
        None, ge=1, description="also checkpoint every N steps within an epoch (None: at each epoch's end only)"
    )

    @model_validator(mode="after")
    def _tokens_only_for_lm(self):
        if self.lm_tokens != ("+", "-") and self.head != "lm":
            raise ValueError(f"lm_tokens={list(self.lm_tokens)} applies to head=lm only (head is {self.head})")
        return self


class ORMConfig(RewardModelConfig):
    # pointwise: BCE on every sampled solution's correctness (Math-Shepherd, the paper's ORM);
    # pairwise: Bradley-Terry on (right, wrong) pairs of one question; both: the two losses summed.
    objective: Literal["pointwise", "pairwise", "both"] = Field(
        "pointwise",
        description="pointwise (BCE on each solution's correctness), pairwise (Bradley-Terry pairs) or both",
    )


class PRMConfig(RewardModelConfig):
    label: Literal["hard", "soft"] = Field(
        "hard", description="train on hard (any rollout right) or soft (fraction) labels"
    )

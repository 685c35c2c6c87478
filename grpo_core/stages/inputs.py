"""What each stage consumes, typed: the flows build these, the cache key hashes them, and the one
stage entry point (``python -m grpo_core.stages --config C --inputs FILE --out DIR``, which
torchrun and accelerate start too) reads them from a JSON file, so the in-process and the launched
route run the same ``run``. Each ``run`` imports its stage's module when it runs (deferred: they import
torch, most of them transformers too; the flows and ``tasks.launch`` import these classes without them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from grpo_core.config import CorpusConfig, PipelineConfig
from grpo_core.data import held_out_sets
from grpo_core.digests import digest_files
from grpo_core.manifests import Ref
from grpo_core.stages.prepare import run_prepare
from grpo_core.stages.outputs import (
    CorpusOutput,
    EvalOutput,
    FolderOutput,
    GRPOOutput,
    ModelOutput,
    ReplayOutput,
    RewardDataOutput,
    RewardModelOutput,
    SFTOutput,
    StageOutput,
    reward_datasets,  # noqa: F401 - read from here by the stage worker and the benches
)
from grpo_core.tracking import MetricLogger


class StageInputs(BaseModel):
    """A stage's inputs; ``sections``: the recipe's sections (or keys) that decide its output, beside
    the inputs' digests (its cache key and the parameters of its MLflow run); ``output``: its class."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    stage: ClassVar[str]
    sections: ClassVar[tuple[str, ...]]
    output: ClassVar[type[StageOutput]]  # what it produces (``outputs.py``), read back from its manifest

    def run(self, cfg: PipelineConfig, out_dir: Path, logger: MetricLogger | None = None) -> dict | None:
        raise NotImplementedError

    def run_name(self, cfg: PipelineConfig) -> str:
        """The stage's MLflow run: its stage, or what it runs (``GRPOInputs``: the algorithm)."""
        return self.stage

    def also_reads(self) -> dict[str, str]:
        """Digests of what the stage reads beyond its inputs' own (part of its cache key when any)."""
        return {}


def held_out_digest(data: Ref) -> dict[str, str]:
    """The held-out sets' digest: not in the data's own (training stages do not read them)."""
    sets = held_out_sets(Path(data.path))
    return {"held_out": digest_files(Path(data.path), sets.values())} if sets else {}


class DataInputs(StageInputs):
    stage: ClassVar[str] = "data"
    output: ClassVar[type[StageOutput]] = FolderOutput
    sections: ClassVar[tuple[str, ...]] = ("seed", "data")

    def run(self, cfg, out_dir, logger=None):
        manifest = run_prepare(cfg, out_dir)
        if logger:
            logger.log_metrics(
                {k: v for k, v in manifest.items() if k.startswith("n_")}
                | {f"n_held_out/{k}": v for k, v in manifest["held_out"].items()}
            )
        return manifest


class CorpusInputs(StageInputs):
    stage: ClassVar[str] = "corpus"
    output: ClassVar[type[StageOutput]] = CorpusOutput
    # Where the passes run (corpus.runner, ...) is not what they compute: not part of the key.
    sections: ClassVar[tuple[str, ...]] = (
        "seed",
        *(f"corpus.{k}" for k in CorpusConfig.model_fields if k not in CorpusConfig.RUNNER_FIELDS),
    )
    data: Ref  # the pipeline's data: its test, validation and held-out questions are benchmarks to decontaminate

    def benchmarks(self) -> dict[str, str]:
        own = {f"own-{split}": Path(self.data.path) / f"{split}.jsonl" for split in ("test", "val")}
        held_out = {f"own-held_out-{name}": f for name, f in held_out_sets(Path(self.data.path)).items()}
        return {k: str(v) for k, v in (own | held_out).items()}

    def also_reads(self) -> dict[str, str]:
        return held_out_digest(self.data)

    def run(self, cfg, out_dir, logger=None):
        from grpo_core.corpus.stage import run_corpus

        return run_corpus(cfg, out_dir, logger, own_benchmarks={k: Path(v) for k, v in self.benchmarks().items()})


class PretrainInputs(StageInputs):
    stage: ClassVar[str] = "pretrain"
    output: ClassVar[type[StageOutput]] = ModelOutput
    sections: ClassVar[tuple[str, ...]] = ("seed", "model", "pretrain")
    corpus: Ref

    def run(self, cfg, out_dir, logger=None):
        from grpo_core.stages.pretrain import run_pretrain

        return run_pretrain(cfg, Path(self.corpus.path), out_dir, logger)


class SFTInputs(StageInputs):
    stage: ClassVar[str] = "sft"
    output: ClassVar[type[StageOutput]] = SFTOutput
    sections: ClassVar[tuple[str, ...]] = ("seed", "model", "sft", "eval.max_new_tokens")
    data: Ref
    init: Ref | None = None  # the continued-pretraining model; None: the recipe's model

    def run(self, cfg, out_dir, logger=None):
        from grpo_core.stages.sft import run_sft

        return run_sft(cfg, Path(self.data.path), out_dir, logger, init_from=self.init and self.init.path)


class RewardDataInputs(StageInputs):
    stage: ClassVar[str] = "reward_data"
    output: ClassVar[type[StageOutput]] = RewardDataOutput
    sections: ClassVar[tuple[str, ...]] = ("seed", "reward_data")
    data: Ref
    policy: Ref
    round: int = 1
    rollouts: Ref | None = None  # the previous round's GRPO stage folder

    def run(self, cfg, out_dir, logger=None):
        from grpo_core.stages.reward_data import run_reward_data

        return run_reward_data(
            cfg,
            Path(self.data.path),
            self.policy.path,
            out_dir,
            logger,
            round_=self.round,
            rollouts=self.rollouts and self.rollouts.path,
        )


class ReplayInputs(StageInputs):
    stage: ClassVar[str] = "replay"
    output: ClassVar[type[StageOutput]] = ReplayOutput
    sections: ClassVar[tuple[str, ...]] = ()
    reward_data: dict[str, Ref]
    previous: Ref | None = None  # buffer version k-1
    round: int = 1

    def run(self, cfg, out_dir, logger=None):
        from grpo_core.stages.reward_data import run_replay

        return run_replay(
            {k: r.path for k, r in self.reward_data.items()},
            self.previous and self.previous.path,
            self.round,
            out_dir,
            logger,
        )


class RewardModelInputs(StageInputs):
    """The ORM's or the PRM's (``ORMInputs`` / ``PRMInputs``)."""

    reward_data: dict[str, Ref]
    init: Ref  # the SFT model in round 1 (unless <kind>.init says otherwise), then last round's model
    round: int = 1
    replay: Ref | None = None  # buffer version round-1, replayed into the training set
    baseline: Ref | None = None  # the causal LM whose own likelihood every reward model must beat (the SFT model)

    def run(self, cfg, out_dir, logger=None):
        from grpo_core.stages.reward_model import run_reward_model

        return run_reward_model(
            cfg,
            self.stage,
            self.reward_data,
            self.init.path,
            out_dir,
            logger,
            self.round,
            self.replay,
            baseline=self.baseline and self.baseline.path,
        )


class ORMInputs(RewardModelInputs):
    stage: ClassVar[str] = "orm"
    output: ClassVar[type[StageOutput]] = RewardModelOutput
    sections: ClassVar[tuple[str, ...]] = ("seed", "orm", "reward_data.step_separator")


class PRMInputs(RewardModelInputs):
    stage: ClassVar[str] = "prm"
    output: ClassVar[type[StageOutput]] = RewardModelOutput
    sections: ClassVar[tuple[str, ...]] = ("seed", "prm", "reward_data.step_separator")


class GRPOInputs(StageInputs):
    stage: ClassVar[str] = "grpo"
    output: ClassVar[type[StageOutput]] = GRPOOutput
    sections: ClassVar[tuple[str, ...]] = ("seed", "grpo", "eval.max_new_tokens", "reward_data.step_separator")
    data: Ref
    init: Ref  # the policy to start from (and the reference): the SFT model in round 1
    reward_models: dict[str, Ref] = {}  # only those grpo.reward_weights uses
    round: int = 1
    pass_rates: Ref | None = None  # the round's reward-data pass rates (grpo.curriculum > 0 only)
    adapter: Ref | None = None  # grpo.lora: an adapter on ``init`` to train further (the last GPU window's policy)

    def run(self, cfg, out_dir, logger=None):
        from grpo_core.stages.grpo import run_grpo

        return run_grpo(
            cfg,
            Path(self.data.path),
            self.init.path,
            out_dir,
            logger,
            reward_models={k: r.path for k, r in self.reward_models.items()},
            round_=self.round,
            pass_rates=self.pass_rates and self.pass_rates.path,
            adapter=self.adapter and self.adapter.path,
        )

    def run_name(self, cfg):
        return cfg.grpo.algorithm  # grpo, ppo, rft, online_rft


class EvalInputs(StageInputs):
    stage: ClassVar[str] = "eval"
    output: ClassVar[type[StageOutput]] = EvalOutput
    sections: ClassVar[tuple[str, ...]] = ("eval",)
    data: Ref
    models: dict[str, Ref]

    def run(self, cfg, out_dir, logger=None):
        from grpo_core.evaluation import run_eval

        return run_eval(cfg, Path(self.data.path), {k: r.path for k, r in self.models.items()}, out_dir, logger)

    def also_reads(self) -> dict[str, str]:
        return held_out_digest(self.data)


INPUTS = {
    cls.stage: cls
    for cls in (
        DataInputs,
        CorpusInputs,
        PretrainInputs,
        SFTInputs,
        RewardDataInputs,
        ReplayInputs,
        ORMInputs,
        PRMInputs,
        GRPOInputs,
        EvalInputs,
    )
}


MODULE = "grpo_core.stages"  # the one stage entry point: --config, --inputs, --out


def write_inputs(inputs: StageInputs, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stage": inputs.stage, **inputs.model_dump(mode="json")}, indent=1))
    return path


def write_resolved(cfg: PipelineConfig, path: Path) -> Path:
    """The validated recipe as plain YAML: what every process loads, overrides included."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path


def stage_args(cfg: PipelineConfig, inputs: StageInputs, out_dir: str) -> list[str]:
    """``MODULE``'s arguments for ``inputs`` under ``cfg`` into ``out_dir``, the recipe and the inputs
    written beside its outputs (``resolved.yaml``, ``inputs.json``)."""
    resolved = write_resolved(cfg, Path(out_dir) / "resolved.yaml")
    return [
        "--config",
        str(resolved),
        "--inputs",
        str(write_inputs(inputs, Path(out_dir) / "inputs.json")),
        "--out",
        out_dir,
    ]


def read_inputs(path: Path) -> StageInputs:
    """A stage's inputs file; a malformed one is an error naming the file and the field."""
    raw = json.loads(Path(path).read_text())
    stage = raw.pop("stage", None)
    if stage not in INPUTS:
        raise ValueError(f"{path}: 'stage' must be one of {', '.join(INPUTS)}, got {stage!r}")
    try:
        return INPUTS[stage].model_validate(raw)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None

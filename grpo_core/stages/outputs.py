"""What each stage produces, typed: the ``manifest.json`` a stage writes (completed by its task with
the cache key, the model's digest and the MLflow run), read back as one class per stage beside its
inputs class (``StageInputs.output``). Flows read these fields, not a dict's keys; a manifest that
lacks one fails here, naming it. A stage's further measurements (its metrics) ride along as extra
fields (``model_extra``) for the reports."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict

from grpo_core.manifests import Ref

from grpo_core.digests import digest_dir

from grpo_core.data import splits_digest

Digest = Callable[[Path], str]  # how a folder's digest was computed


def arrow_digest(folder: Path) -> str:
    """A datasets folder's digest: its Arrow files (reward data, replay buffer versions)."""
    return digest_dir(folder, "*.arrow")


class StageOutput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")
    stage: str
    mlflow_run_id: str = ""
    cache_key: str = ""
    wall_s: float = 0.0  # the stage's own time, evaluations included
    # The stage's own peak RSS in MiB (CUDA's on a GPU), in its own process or in the flow's
    # (grpo_core.lm.runtime.stage_peak_memory; ``process_rss_mib`` where only the process's is known).
    peak_memory: dict[str, float] = {}

    def written(self) -> list[tuple[Ref, Digest]]:
        """The folders the stage wrote, with how their digests were computed."""
        return []

    def damaged(self) -> str | None:
        """Why the folders this output names no longer hold what the stage wrote (one removed, a file
        truncated, missing or changed since: its digest differs), or None."""
        for ref, digest in self.written():
            if not Path(ref.path).is_dir():
                return f"{ref.path} is missing"
            if digest(Path(ref.path)) != ref.digest:
                return f"{ref.path} is not what the stage wrote (its digest differs from the manifest's)"
        return None


class FolderOutput(StageOutput):
    """A dataset folder (the data splits, a replay buffer version) with its digest."""

    dir: str
    digest: str

    @property
    def ref(self) -> Ref:
        return Ref(path=self.dir, digest=self.digest)

    def written(self) -> list[tuple[Ref, Digest]]:
        return [(self.ref, splits_digest)]


class CorpusOutput(StageOutput):
    """The decontaminated math corpus (the corpus flow's manifest)."""

    corpus_dir: str
    digest: str = ""  # set by the flow that ran it
    pages: int = 0

    @property
    def ref(self) -> Ref:
        return Ref(path=self.corpus_dir, digest=self.digest)

    def written(self) -> list[tuple[Ref, Digest]]:
        return [(self.ref, digest_dir)] if self.digest else []


class ReplayOutput(FolderOutput):
    round: int
    contents: dict = {}

    def written(self) -> list[tuple[Ref, Digest]]:
        return [(self.ref, arrow_digest)]


class RewardDataOutput(StageOutput):
    """The reward-model datasets (``pairs``, ``steps``, ``solutions``) as ``<name>_dir`` / ``<name>_digest``."""

    dir: str
    round: int = 1
    questions: int = 0  # sampled, held-out ones included
    metrics: dict[str, float] = {}
    pass_rates: str | None = None  # folder of pass_rates.jsonl: each sampled question's right / samples
    pass_rates_digest: str = ""

    def labelled(self, samples_per_question: int) -> int:
        """The checker-labelled solutions it gathered: its questions' samples and the GRPO rollouts it added."""
        return self.questions * samples_per_question + int(self.metrics.get("train/rollout_solutions", 0))

    @property
    def datasets(self) -> dict[str, Ref]:
        return reward_datasets(self.model_extra or {})

    @property
    def pass_rates_ref(self) -> Ref | None:
        return Ref(path=self.pass_rates, digest=self.pass_rates_digest) if self.pass_rates else None

    def written(self) -> list[tuple[Ref, Digest]]:
        rates = [(self.pass_rates_ref, digest_dir)] if self.pass_rates else []
        return [(ref, arrow_digest) for ref in self.datasets.values()] + rates


def reward_datasets(fields: dict) -> dict[str, Ref]:
    """The reward-data datasets by name, from a manifest's ``<name>_dir`` / ``<name>_digest`` fields."""
    return {
        k.removesuffix("_dir"): Ref(path=v, digest=fields[k.replace("_dir", "_digest")])
        for k, v in fields.items()
        if k.endswith("_dir") and k != "dir"
    }


class ModelOutput(StageOutput):
    """A published model folder with its digest and the steps that trained it."""

    model: str
    digest: str
    steps: int = 0

    @property
    def ref(self) -> Ref:
        return Ref(path=self.model, digest=self.digest)

    def written(self) -> list[tuple[Ref, Digest]]:
        return [(self.ref, digest_dir)]


class TrainedOutput(ModelOutput):
    """A model kept by validation accuracy, with its curve against training time."""

    best_val_accuracy: float
    best_step: int
    train_s: float  # training seconds: evaluations not counted
    stopped: str = ""
    curve: list[dict] = []  # every evaluation: step, elapsed_s (training seconds), metrics


class SFTOutput(TrainedOutput):
    final_lr: float | None = None  # where continued SFT goes on (``sft.continued``)


class RewardModelOutput(ModelOutput):
    round: int = 1
    heldout: dict[str, float] = {}  # held-out metrics after training, before (``heldout_before``)
    heldout_before: dict[str, float] = {}
    baseline: dict[str, float] = {}  # the zero-training verifier on the same rows
    quality_gate: dict = {}
    replay: dict = {}


class GRPOOutput(TrainedOutput):
    algorithm: str = "grpo"
    round: int = 1
    last_model: str | None = None  # the last policy, where keep-best published another
    last_digest: str = ""
    rollouts: str | None = None  # the folder of its checked rollouts (the next round's data)
    resumed_from_step: int = 0
    rewards: list[dict] = []  # every step: elapsed_s, the checker's accuracy, the learned rewards
    last_10_steps: dict[str, float] = {}
    staleness: dict[str, list[float]] = {}  # per metric (staleness/*): at the first, middle and last evaluation

    @property
    def last_ref(self) -> Ref:
        """The policy training ended with: ``last_model`` where keep-best published another, else the model."""
        return Ref(path=self.last_model, digest=self.last_digest) if self.last_model else self.ref

    def written(self) -> list[tuple[Ref, Digest]]:
        return super().written() + ([(self.last_ref, digest_dir)] if self.last_model else [])


class EvalOutput(StageOutput):
    results: dict[str, dict]  # per model: n, accuracy (maj@K, pass@K), per_question

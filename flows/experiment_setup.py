"""The fixed parts of the experiment flow (``flows/experiment.py``): the finished run it starts
from, its recipe, preset and budget (``Setup``, made by ``setup``; a ``--recipe`` checked against
the run's by ``over_the_run``), what one (variant, seed) trained (``Run``) and the name its model is
evaluated under (``model_key``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from flows.variants import Budget, PRESETS, Preset, VARIANTS
from grpo_core.config import PipelineConfig
from grpo_core.manifests import read_manifest
from grpo_core.recipe import flatten, load_config
from grpo_core.stages.identity import run_identity
from grpo_core.stages.inputs import INPUTS, Ref
from grpo_core.stages.outputs import GRPOOutput, StageOutput, TrainedOutput
from grpo_core.stages.sft import continued


class Run(BaseModel):
    """One (variant, seed): its final model and what its training stages measured."""

    model_config = ConfigDict(frozen=True)
    seed: int
    model: Ref
    train_s: float  # training seconds, evaluations not counted (two rounds: both GRPO stages)
    steps: int
    extra_s: float = 0.0  # outside the budget: the reward-model retraining between rounds
    extra: dict[str, float] = {}  # the same by stage: reward_data (sampling), replay, orm / prm
    peak_memory: dict[str, float]  # the largest of its stages' peaks
    curve: list[tuple[float, float]]  # (training seconds, validation accuracy) at every evaluation
    curve_steps: list[int] = []  # the training step of each curve point, counted over all its stages
    rewards: list[dict] = []  # every GRPO step: elapsed_s, the checker's accuracy, the learned rewards' means
    kept_step: int = 0  # the step of its last GRPO stage whose model was published (keep-best; 0: that stage's start)
    quality_warnings: list[str] = []  # the retrained reward models' failed quality gates (iterative variants)
    reward_model_updates: dict[str, int] = {}  # per reward model it trained on: its updates over all rounds
    reward_model_labels: int = 0  # the checker-labelled solutions those were given over all rounds
    last: Ref | None = None  # the model training ended with, where keep-best published another

    @classmethod
    def of(cls, seed: int, stages: list[TrainedOutput], extra: dict[str, float] | None = None) -> "Run":
        """From the outputs of its training stages, in order (the curves joined end to end), and the
        seconds of the stages between them by stage (outside the budget)."""
        extra = {k: round(v, 1) for k, v in (extra or {}).items()}
        curve, curve_steps, rewards, offset, steps = [], [], [], 0.0, 0
        for k, st in enumerate(stages, 1):
            curve += [(offset + p["elapsed_s"], p["val/accuracy"]) for p in st.curve]
            curve_steps += [steps + p["step"] for p in st.curve]
            rewards += [{**r, "elapsed_s": offset + r["elapsed_s"], "round": k} for r in getattr(st, "rewards", [])]
            offset, steps = offset + st.train_s, steps + st.steps
        peaks = [st.peak_memory for st in stages]
        final = stages[-1]
        last = getattr(final, "last_model", None) and final.last_ref
        return cls(
            seed=seed,
            model=final.ref,
            train_s=round(offset, 2),  # the stages keep two decimals: the joined curve ends within it
            steps=steps,
            extra_s=round(sum(extra.values()), 1),
            extra=extra,
            curve=curve,
            curve_steps=curve_steps,
            rewards=rewards,
            kept_step=final.best_step,
            last=last,
            peak_memory={k: max(p[k] for p in peaks if k in p) for k in {k for p in peaks for k in p}},
        )


class Setup(BaseModel):
    """An experiment's fixed parts: the finished run, its recipe (``sft.lr`` where SFT ended), the
    preset, the budget and the evaluation schedule."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    root: Path
    manifest: dict
    first: dict[str, StageOutput]  # round 1's stages (GRPO, reward data, reward models from the SFT model), typed
    cfg: PipelineConfig
    run_cfg: PipelineConfig  # the recipe the run itself ran (without the experiment's --recipe or --set)
    preset: Preset
    budget: Budget
    eval_every: int
    lr: float | None = None  # GRPO's learning rate for every RL variant (a sweep); None: the recipe's

    def stage(self, name: str) -> StageOutput:
        """One of the run's stages outside the rounds (``data``, ``sft``), typed."""
        return INPUTS[name].output.model_validate(self.manifest["stages"][name])

    def rounds(self, name: str) -> int:
        """How many GRPO rounds share a variant's budget (None in its row: the recipe's)."""
        return VARIANTS[name].rounds or self.cfg.rounds.count

    def config(self, name: str, seed: int, k: int = 1) -> PipelineConfig:
        """The recipe of one (variant, seed), of its round ``k``: the variant's settings and budget."""
        variant, cfg = VARIANTS[name], self.cfg
        launch = cfg.launch.model_copy(update={"own_process": self.preset.own_process or cfg.launch.own_process})
        if variant.grpo is None:
            sft = cfg.sft.model_copy(update={"max_seconds": self.budget.seconds, "max_steps": 10**9, "patience": 0})
            return cfg.model_copy(update={"sft": sft, "seed": seed, "launch": launch})
        merged = {**cfg.grpo.model_dump(), **variant.grpo}
        if merged["supervision"] != "process":  # the recipe's process credit has no place in an outcome arm
            merged["process_credit"] = "centred"
        grpo = cfg.grpo.model_validate(
            {
                **merged,
                **self.budget.grpo(self.rounds(name), k),
                "eval_every": self.eval_every,
                **({"lr": self.lr} if self.lr else {}),
            }
        )
        return cfg.model_copy(update={"grpo": grpo, "seed": seed, "launch": launch})

    def is_the_runs_grpo(self, vcfg: PipelineConfig) -> bool:
        """Whether a variant's run would be the run's own round-1 GRPO: the same training as the run's
        recipe (not the experiment's: a --recipe or --set may change GRPO), evaluations and budget, in
        the same process, on the same reward models."""
        run = self.manifest["rounds"][0]["stages"]
        same_rewards = all(
            k in run and self.first[k].ref.digest == INPUTS[k].output.model_validate(run[k]).ref.digest
            for k in vcfg.grpo.reward_models_used
        )  # each seed's own: the same bits for seed 0
        if "grpo" not in self.first:
            return False
        ran = self.first["grpo"]
        same_budget = self.budget.steps == ran.steps if self.budget.steps else self.budget.seconds == ran.train_s
        return (
            run_identity(vcfg, "grpo") == run_identity(self.run_cfg, "grpo")
            and same_budget
            and vcfg.grpo.eval_every == self.run_cfg.grpo.eval_every
            and not self.preset.own_process
            and same_rewards
        )


# What a run's SFT model was made from: a recipe given to an experiment must agree on these.
SFT_SECTIONS = ("seed", "data", "model", "pretrain", "corpus", "sft")


def setup(
    run_dir: str,
    preset: str,
    variants: list[str] | None,
    seconds: float | None,
    steps: int | None,
    eval_every: int | None,
    lr: float | None = None,
    recipe: str | None = None,
    overrides: list[str] | None = None,
) -> Setup:
    """The finished run's parts and the budget; unknown variants and impossible budgets fail here.
    ``recipe``: a YAML recipe whose RL sections (reward data, reward models, GRPO, rounds, eval)
    replace the run's; what made the SFT model (``SFT_SECTIONS``) must be the run's.
    ``overrides``: ``section.key=value`` over the recipe, as ``run`` takes them."""
    p = PRESETS[preset]
    unknown = [v for v in variants or () if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown {preset} variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    for v in variants or p.variants:
        if (matched := VARIANTS[v].labels_of) and matched not in (variants or p.variants):
            raise ValueError(
                f"{v} is trained on as many labels as {matched} is given, with as many updates: "
                f"run it beside {matched} (--variants {matched},{v})"
            )
    root = Path(run_dir).resolve()
    manifest = read_manifest(root / "manifest.json")
    cfg = load_config(root / "config.yaml", overrides, migrate=True)
    if recipe is not None:
        cfg = over_the_run(cfg, recipe, root, overrides)
    rounds = max((VARIANTS[v].rounds or cfg.rounds.count) for v in variants or p.variants)
    if steps is not None and steps < rounds:
        raise ValueError(
            f"steps = {steps}: a variant runs {rounds} GRPO rounds: it needs at least {rounds} GRPO steps "
            f"(one per round)"
        )
    runs = manifest["rounds"] if p.all_rounds else manifest["rounds"][:1]
    trained = sum(GRPOOutput.model_validate(r["stages"]["grpo"]).train_s for r in runs)  # evaluations not counted
    if p.own_reward_models and not (seconds or steps):
        steps = cfg.grpo.max_steps * cfg.rounds.count  # the recipe's GRPO steps over its rounds
    first = {name: INPUTS[name].output.model_validate(m) for name, m in manifest["rounds"][0]["stages"].items()}
    return Setup(
        root=root,
        manifest=manifest,
        first=first,
        cfg=continued(cfg, manifest["stages"]["sft"]),
        run_cfg=load_config(root / "config.yaml", migrate=True),
        preset=p,
        budget=Budget(seconds=seconds or trained, steps=steps),
        eval_every=eval_every or p.eval_every or cfg.grpo.eval_every,
        lr=lr,
    )


def over_the_run(cfg: PipelineConfig, recipe: str, root: Path, overrides: list[str] | None = None) -> PipelineConfig:
    """``recipe`` for the run whose recipe is ``cfg``: its own settings, the run's name and folder;
    refused in one line where it would have trained another SFT model."""
    theirs = load_config(recipe, overrides)
    mine, other = flatten(cfg), flatten(theirs)
    differ = sorted(
        k for k in mine.keys() | other.keys() if k.split(".")[0] in SFT_SECTIONS and mine.get(k) != other.get(k)
    )
    if differ:
        raise ValueError(
            f"{recipe} is not for the SFT model of {root}: it sets {', '.join(differ[:5])}"
            f"{' ...' if len(differ) > 5 else ''} otherwise than the run's config.yaml"
        )
    return theirs.model_copy(update={"run_name": cfg.run_name, "output_dir": cfg.output_dir})


def model_key(s: Setup, name: str, run: Run) -> str:
    """A run's model among those an experiment evaluates: ``<variant>/seed-<i>``."""
    return f"{name}/seed-{run.seed - s.cfg.seed}"

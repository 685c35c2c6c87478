"""The ``experiment`` flow: variants from one finished run's SFT model, N seeds each, at one training
budget, side by side; ``compare``, ``study`` (the paper's §5, its Figures 5-7), ``sampling``,
``sparse``, ``iterate`` and ``baseline`` are its presets (``PRESETS``), and the CLI commands of those
names run them.

Variants (``flows/variants.py:VARIANTS``, each with what it is) start from the run's SFT model;
seed s is the recipe's seed + s. Continued SFT is the no-RL baseline; the GRPO variants differ in
their reward, supervision and algorithm (the paper's §5: RFT, online RFT, PPO); a variant of k
rounds (``iterated``) runs GRPO in k shares of the budget and retrains its reward models between
them, or keeps them frozen (that time is outside the budget, reported as ``extra_s``). ``iterate``
trains its round-1 reward models itself, under a recipe of its own (``--recipe``).

The budget: every variant trains for the same seconds, ``seconds`` or by default what the run's GRPO
trained (``train_s`` of round 1; for the baseline, of every round): evaluations are measurement,
outside the budget and the curves' time. ``steps`` gives every RL variant that many GRPO steps
instead (equal samples; continued SFT keeps the seconds). Seed 0 of a GRPO variant whose settings
are the run's own, at the run's own budget (its seconds, or as many steps), on the run's reward models
(or the same bits), is the run's round-1 GRPO stage, reused.

Each seed has its own chain by default: seed s draws its own round-1 reward data and trains its own
reward models (``chains/seed-<s>/``), so that an interval over seeds covers the reward models'
variance too; ``shared_reward_models`` trains every seed on the run's (or the experiment's) own.

Measured per run: validation accuracy against training time, final greedy test accuracy, maj@K and
pass@K on the first ``sample_questions`` test questions (K = ``samples`` > 1), peak memory (each
training stage in a process of its own where the preset says), steps per second. Reported per
variant: mean ± std over seeds and paired differences (seed by seed, same questions) to the SFT model
and to continued SFT with 95% Student-t intervals; the two-round variant also against one round.
Outputs: ``runs/<run>/<preset>/<budget>/`` (manifest, figures), an MLflow run ``<preset>-<run_name>``
(table and figures), a Prefect Markdown artifact of the same name.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, ConfigDict

from flows import artifact_key, numbered_run_name, parameter
from flows.reports import figure_source, mlflow_link, warning_line
from flows.rounds import RoundStart, reward_stages
from flows.variants import BASELINE, Budget, PRESETS, Preset, UNIFORM, VARIANTS
from grpo_core import figures
from grpo_core.config import PipelineConfig
from grpo_core.digests import digest_dir
from grpo_core.manifests import read_manifest, write_manifest
from grpo_core.mlflow_runs import experiment_id, finishing, start_run, tracking_uri
from grpo_core.recipe import load_config
from grpo_core.rewards.gate import gate_failure, gate_grpo
from grpo_core.stages.rl_records import staleness
from grpo_core.stages.identity import run_identity
from grpo_core.stages.inputs import EvalInputs, GRPOInputs, INPUTS, Ref, SFTInputs
from grpo_core.stages.outputs import GRPOOutput, StageOutput, TrainedOutput
from grpo_core.stages.sft import continued
from grpo_core.stats import mean_std, seed_interval
from grpo_core.tracking import MlflowLogger, unsent_dir
from tasks.run_lock import run_lock
from tasks.stage_tasks import eval_task, grpo_task, run_stage, sft_task


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
        curve, rewards, offset = [], [], 0.0
        for k, st in enumerate(stages, 1):
            curve += [(offset + p["elapsed_s"], p["val/accuracy"]) for p in st.curve]
            rewards += [{**r, "elapsed_s": offset + r["elapsed_s"], "round": k} for r in getattr(st, "rewards", [])]
            offset += st.train_s
        peaks = [st.peak_memory for st in stages]
        final = stages[-1]
        last = getattr(final, "last_model", None) and final.last_ref
        return cls(
            seed=seed,
            model=final.ref,
            train_s=round(offset, 1),
            steps=sum(st.steps for st in stages),
            extra_s=round(sum(extra.values()), 1),
            extra=extra,
            curve=curve,
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
        grpo = cfg.grpo.model_validate(
            {
                **cfg.grpo.model_dump(),
                **variant.grpo,
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
    from grpo_core.recipe import flatten

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


def train_variant(s: Setup, name: str, seed: int, out: Path, data: Ref, sft: Ref, common: dict) -> Run:
    vcfg = s.config(name, s.cfg.seed + seed)
    if VARIANTS[name].grpo is None:
        return Run.of(vcfg.seed, [run_stage(sft_task, vcfg, str(out), SFTInputs(data=data, init=sft), **common).output])
    if s.rounds(name) > 1:
        return iterated(s, name, seed, out, data, sft, common)
    learned = learned_reward_models(s, vcfg.grpo.reward_models_used)
    if s.is_the_runs_grpo(vcfg):
        return Run.of(vcfg.seed, [s.first["grpo"]]).model_copy(update=learned)
    rms = {k: s.first[k].ref for k in vcfg.grpo.reward_models_used}
    rates = s.first["reward_data"].pass_rates_ref if vcfg.grpo.curriculum else None
    g = run_stage(
        grpo_task, vcfg, str(out), GRPOInputs(data=data, init=sft, reward_models=rms, pass_rates=rates), **common
    )
    return Run.of(vcfg.seed, [g.output]).model_copy(update=learned)


def learned_reward_models(s: Setup, used: tuple[str, ...]) -> dict:
    """A run's ``reward_model_updates`` and ``reward_model_labels`` from its round-1 reward models."""
    labels = s.first["reward_data"].labelled(s.cfg.reward_data.samples_per_question) if used else 0
    return {"reward_model_updates": {kind: s.first[kind].steps for kind in used}, "reward_model_labels": labels}


def iterated(s: Setup, name: str, seed: int, out: Path, data: Ref, sft: Ref, common: dict) -> Run:
    """Iterative RL from the SFT model (§4.2), the variant's rounds sharing its budget: GRPO round 1
    on the round-1 reward models (``s.first``); then, each round, GRPO from the last round's policy
    (the new reference) on reward models that are, by the variant, the same (frozen) or retrained
    between rounds on the new policy's samples and GRPO's rollouts plus a replay share of earlier
    data (``flows.rounds.reward_stages``, the pipeline's own). The retraining's seconds are outside
    the budget (``Run.extra``)."""
    variant = VARIANTS[name]
    used = s.config(name, s.cfg.seed).grpo.reward_models_used
    rms = {kind: s.first[kind].ref for kind in used}
    learned = learned_reward_models(s, used)
    buffer = s.first["replay"].ref if "replay" in s.first else None
    rates = s.first["reward_data"].pass_rates_ref if "reward_data" in s.first else None
    policy, stages, extra, warned = sft, [], {}, []
    # Every round's GRPO passes its reward models' quality gates as the pipeline's rounds do
    # (rewards/gate.py): round 1's (whose failures the row already reports), then each retrained one's.
    gates, retrained = {kind: s.first[kind].quality_gate for kind in used}, False
    for k in range(1, s.rounds(name) + 1):
        gated = gate_grpo(s.config(name, s.cfg.seed + seed, k), gates)
        vcfg = gated.cfg
        if retrained:
            kept_out = "; kept out of GRPO's reward" if gated.excluded else ""
            warned += [f"round {k}, seed {seed}: {failure}{kept_out}" for failure in gated.failures]
        # Round 1 is the same for every variant with the same GRPO settings, seed and round-1
        # reward models (they differ only between rounds): it runs once, in a folder they share.
        shared = hashlib.sha256(vcfg.grpo.model_dump_json().encode()).hexdigest()[:8]
        where = (
            out.parents[1] / "round-1" / f"grpo-{shared}" / out.name
            if k == 1 and not variant.labels_of
            else out / f"round-{k}" / "grpo"
        )
        g = run_stage(
            grpo_task,
            vcfg,
            str(where),
            GRPOInputs(
                data=data,
                init=policy,
                reward_models={m: rms[m] for m in vcfg.grpo.reward_models_used},
                round=k,
                pass_rates=rates if vcfg.grpo.curriculum else None,
            ),
            **common,
        ).output
        stages.append(g)
        policy = g.ref
        if k == s.rounds(name) or not variant.retrain:
            continue
        retrain = vcfg.model_copy(
            update={
                **{kind: getattr(vcfg, kind).model_copy(update={"train": kind in used}) for kind in ("orm", "prm")},
                "rounds": vcfg.rounds.model_copy(
                    update={
                        "replay_fraction": vcfg.rounds.replay_fraction if variant.replay is None else variant.replay
                    }
                ),
            }
        )
        start = RoundStart(
            policy=g.ref,
            reward_models=rms,
            buffer=buffer,
            rollouts=Ref(path=g.rollouts, digest=g.digest) if g.rollouts else None,
        )
        done = reward_stages(retrain, k + 1, out / f"round-{k + 1}", out, data, sft, start, common)
        rms = {kind: done[kind].output.ref for kind in used}
        learned = {
            "reward_model_updates": {k: n + done[k].output.steps for k, n in learned["reward_model_updates"].items()},
            "reward_model_labels": learned["reward_model_labels"]
            + done["reward_data"].output.labelled(s.cfg.reward_data.samples_per_question),
        }
        gates, retrained = {kind: done[kind].output.quality_gate for kind in used}, True
        buffer, rates = done["replay"].output.ref, done["reward_data"].output.pass_rates_ref
        for stage, r in done.items():  # the stages' own time (cached or not)
            extra[stage] = extra.get(stage, 0.0) + r.output.wall_s
    return Run.of(s.cfg.seed + seed, stages, extra).model_copy(update={"quality_warnings": warned, **learned})


def reward_model_quality(chains: list[dict[str, StageOutput]], uses: tuple[str, ...]) -> str:
    """The held-out quality of the reward models a variant trains on, as a short string: mean over
    the seeds' own reward models where each seed has its own, beside the SFT model's likelihood on
    the same rows (the zero-training baseline)."""

    def mean(kind: str, part: str, metric: str) -> float:
        values = [getattr(first[kind], part).get(metric, float("nan")) for first in chains]
        return sum(values) / len(values)

    parts = []
    for kind, pooled, name in (("orm", "auc", "AUC"), ("prm", "step_auc", "step AUC")):
        if kind in uses:
            sft = mean(kind, "baseline", "within_question_auc")
            parts.append(
                f"{kind.upper()} within-question AUC {mean(kind, 'heldout', 'within_question_auc'):.3f} "
                f"(pooled {name} {mean(kind, 'heldout', pooled):.3f}"
                + (f"; SFT likelihood {sft:.3f}" if sft == sft else "")
                + (f"; mean of {len(chains)} seeds' own" if len(chains) > 1 else "")
                + ")"
            )
    return ", ".join(parts) or "-"


def gate_warnings(first: dict[str, StageOutput], uses: tuple[str, ...]) -> list[str]:
    """One sentence per round-1 reward model a variant trains on that failed its quality gate (the
    rounds' own check, ``gate_failure``). An experiment measures the variant as asked, the reward
    model included, and says so first: on the sparse preset a PRM at chance drove every seed into
    collapse (docs/results.md, "Do learned rewards help where the checker is silent?")."""
    return [sentence for kind in uses if (sentence := gate_failure(kind, first[kind].quality_gate))]


def learned_rewards(s: Setup, names: list[str]) -> set[str]:
    """The reward models (``orm``, ``prm``) that any of the variants ``names`` trains on."""
    used = set()
    for name in names:
        with contextlib.suppress(ValueError):  # a variant the recipe refuses is skipped, and said, later
            used |= (
                set(s.config(name, s.cfg.seed).grpo.reward_models_used) if VARIANTS[name].grpo is not None else set()
            )
    return used


def own_reward_models(
    s: Setup, names: list[str], out: Path, data: Ref, sft: Ref, common: dict, seed: int = 0
) -> dict[str, StageOutput]:
    """Round 1's reward data and the reward models the variants use (and any the recipe trains, to be
    measured), drawn and trained from the run's SFT model under the experiment's recipe with the
    recipe's seed + ``seed`` (``out/round-1``)."""
    used = learned_rewards(s, names) | {kind for kind in ("orm", "prm") if getattr(s.cfg, kind).train}
    cfg = s.cfg.model_copy(
        update={
            "seed": s.cfg.seed + seed,
            **{kind: getattr(s.cfg, kind).model_copy(update={"train": kind in used}) for kind in ("orm", "prm")},
        }
    )
    done = reward_stages(cfg, 1, out / "round-1", out, data, sft, RoundStart(policy=sft), common)
    return {name: r.output for name, r in done.items()}


def equal_label_reward_models(
    s: Setup, name: str, matched: Run, out: Path, data: Ref, sft: Ref, common: dict, seed: int = 0
) -> dict[str, StageOutput]:
    """A ``labels_of`` arm's round-1 reward data and reward models (``out/round-1``): as many
    checker-labelled samples of the SFT model as the matched variant's reward models were given over
    its rounds (its samples and the GRPO rollouts its retrainings added), trained for as many updates
    as they made in all (``matched``: that variant's run of this seed)."""
    rd, rounds = s.cfg.reward_data, s.rounds(VARIANTS[name].labels_of)
    sampled = {
        "questions": -(-matched.reward_model_labels // rd.samples_per_question),
        "step_questions": rd.step_questions and rounds * rd.step_questions,  # as many step-labelled questions
    }
    trained = matched.reward_model_updates
    cfg = s.cfg.model_copy(
        update={
            "seed": s.cfg.seed + seed,
            "reward_data": rd.model_copy(update=sampled),
            # The updates end training: its epochs (at least one update each) never do.
            **{
                kind: getattr(s.cfg, kind).model_copy(
                    update={"train": kind in trained, "max_steps": trained.get(kind), "epochs": trained.get(kind, 1)}
                )
                for kind in ("orm", "prm")
            },
        }
    )
    done = reward_stages(cfg, 1, out / "round-1", out, data, sft, RoundStart(policy=sft), common)
    return {stage: r.output for stage, r in done.items()}


def staleness_columns(runs: list[Run], window: int = 20) -> dict:
    """Per learned reward model a variant trained on: its within-question AUC against the checker on
    the policy's own rollouts, pooled over ``window`` GRPO steps at the start, the middle and the end
    of the run (``_window``: none straddles a round boundary), mean over seeds, with the mixed groups
    it was measured on (summed over seeds); and the checker's accuracy on those rollouts."""
    out = {}
    for kind in ("orm", "prm"):
        if not runs or not all(any(p.get(f"{kind}_mixed_groups") for p in r.rewards) for r in runs):
            continue
        for when in ("start", "middle", "end"):
            steps = [_window(r.rewards, when, window) for r in runs]
            parts = [staleness(w) for w in steps]
            for metric, key in (
                (f"{kind}_within_auc", f"staleness/{kind}_within_auc"),
                ("checker_accuracy", "staleness/checker_accuracy"),
            ):
                values = [p[key] for p in parts if key in p]
                if values:
                    out[f"{metric}_{when}_mean"] = round(mean_std(values)[0], 4)
            out[f"{kind}_mixed_groups_{when}"] = int(sum(p.get(f"{kind}_mixed_groups", 0) for w in steps for p in w))
    return out


def _window(steps: list[dict], when: str, width: int) -> list[dict]:
    """``width`` steps of one round: the run's first, its middle (one round: the middle steps; several:
    the first steps of the last round, right after the last retraining) or its last."""
    last_round = [p for p in steps if p.get("round", 1) == steps[-1].get("round", 1)] if steps else []
    if when == "start":
        return [p for p in steps if p.get("round", 1) == steps[0].get("round", 1)][:width]
    if when == "end":
        return last_round[-width:]
    if len(last_round) < len(steps):
        return last_round[:width]
    middle = max(0, len(steps) // 2 - width // 2)
    return steps[middle : middle + width]


def gain(key: str, a: list[float], b: list[float]) -> dict:
    """Row fields ``key`` and ``key_95ci``: the mean paired difference ``a - b`` over seeds and its
    95% Student-t interval, rounded."""
    d = seed_interval(a, b)
    return {key: round(d["mean"], 4), f"{key}_95ci": [round(d["low"], 4), round(d["high"], 4)]}


def accuracy_row(name: str, accs: list[float]) -> dict:
    """A table row's start: test accuracy over seeds."""
    mean, std = mean_std(accs)
    return {
        "variant": name,
        "seeds": len(accs),
        "test_accuracy_mean": round(mean, 4),
        "test_accuracy_std": round(std, 4),
    }


def variant_row(
    s: Setup,
    name: str,
    runs: list[Run],
    sampled: dict,
    sft_acc: float,
    accs: dict[str, list[float]],
    k: int,
    chains: list[dict[str, StageOutput]] | None = None,
    last: dict[str, list[float]] | None = None,
) -> dict:
    """A table row: test accuracy with its paired gains over SFT, continued SFT, the uniform draw and
    the variants it is compared with (``against``), maj@K / pass@K, the reward models' quality
    (``chains``: each seed's round-1 stages where each seed has its own; default ``s.first``),
    memory and speed, all mean over seeds. ``last``: per variant where keep-best published another
    step's for some seed, each seed's accuracy of the policy its training ended with; the row then
    gives it beside the kept steps, and each of those gains again between the policies the runs
    ended with (``last_gain_over_<other>``; a variant not in ``last`` ended with what it kept)."""
    n = len(accs[name])
    row = accuracy_row(name, accs[name]) | gain("gain_over_sft", accs[name], [sft_acc] * n)
    vcfg = s.config(name, s.cfg.seed)
    if (lora := vcfg.sft.lora if VARIANTS[name].grpo is None else vcfg.grpo.lora) is not None:
        row["lora_rank"] = lora.rank  # an adapter trained, not every weight: the table says so
    if VARIANTS[name].grpo is not None:
        row["kept_steps"] = [r.kept_step for r in runs]  # keep-best's choice per seed; 0: the stage's own start
    last = last or {}
    if (mine := last.get(name)) is not None:
        row |= {"last_accuracy_mean": round(mean_std(mine)[0], 4), "last_per_seed": [round(a, 4) for a in mine]}
        row |= gain("last_gain_over_sft", mine, [sft_acc] * n)
    for other in dict.fromkeys((BASELINE, UNIFORM, *VARIANTS[name].against)):
        if other == name or len(accs.get(other, ())) != n:
            continue
        row |= gain(f"gain_over_{other}", accs[name], accs[other])
        if name in last or other in last:
            row |= gain(f"last_gain_over_{other}", last.get(name, accs[name]), last.get(other, accs[other]))
    row |= staleness_columns(runs)
    # Where rewards are sparse: how often a step, and how many of its groups, carried a policy gradient.
    zero = [
        [p["frac_batch_zero_std"] for p in r.rewards]
        for r in runs
        if r.rewards and "frac_batch_zero_std" in r.rewards[0]
    ]
    if zero:
        batch = vcfg.grpo.questions_per_step  # what a step draws without redraws
        drawn = [sum(p.get("groups_drawn", batch) for p in r.rewards) / len(r.rewards) for r in runs if r.rewards]
        row |= {
            "steps_with_gradient_mean": round(mean_std([sum(z < 1 for z in zs) / len(zs) for zs in zero])[0], 4),
            "groups_with_gradient_mean": round(mean_std([1 - sum(zs) / len(zs) for zs in zero])[0], 4),
            "groups_drawn_per_step_mean": round(mean_std(drawn)[0], 2),
        }
    for key in [f"{m}@{k}" for m in ("maj", "pass")] if k > 1 else []:
        mean, std = mean_std([sampled[model_key(s, name, r)][key] for r in runs])
        row |= {f"{key}_mean": round(mean, 4), f"{key}_std": round(std, 4)}
    peaks = {m: [r.peak_memory[m] for r in runs if m in r.peak_memory] for m in ("rss_mib", "cuda_mib")}
    row |= {f"peak_{m}_mean": round(mean_std(v)[0], 1) for m, v in peaks.items() if v}
    uses = () if VARIANTS[name].grpo is None else vcfg.grpo.reward_models_used
    chains = chains or [s.first]
    w = sorted({sentence for first in chains for sentence in gate_warnings(first, uses)}) + [
        w for r in runs for w in r.quality_warnings
    ]
    warned = {"quality_warnings": w} if w else {}
    return (
        row
        | warned
        | {
            "reward_model": reward_model_quality(chains, uses),
            "steps_mean": mean_std([r.steps for r in runs])[0],
            "steps_per_s_mean": round(mean_std([r.steps / max(r.train_s, 1e-9) for r in runs])[0], 3),
            "train_s_mean": round(mean_std([r.train_s for r in runs])[0], 1),
            "extra_s_mean": round(mean_std([r.extra_s for r in runs])[0], 1),
            **{
                f"{kind}_updates_mean": round(mean_std([r.reward_model_updates[kind] for r in runs])[0], 1)
                for kind in uses
                if all(kind in r.reward_model_updates for r in runs)
            },
            **(
                {"reward_model_labels_mean": round(mean_std([r.reward_model_labels for r in runs])[0], 1)}
                if uses
                else {}
            ),
            **{
                f"extra_{stage}_s_mean": round(mean_std([r.extra.get(stage, 0.0) for r in runs])[0], 1)
                for stage in sorted({k for r in runs for k in r.extra})
            },
            "per_seed": [round(a, 4) for a in accs[name]],
        }
    )


@flow(
    name="experiment",
    flow_run_name=lambda: numbered_run_name(f"{parameter('preset')}-{Path(parameter('run_dir')).name}"),
)
def experiment(
    run_dir: str,
    preset: str = "compare",
    variants: list[str] | None = None,
    seeds: int | None = None,
    seconds: float | None = None,
    steps: int | None = None,
    samples: int | None = None,
    sample_questions: int | None = None,
    eval_every: int | None = None,
    lr: float | None = None,
    recipe: str | None = None,
    overrides: list[str] | None = None,
    shared_reward_models: bool = False,
    first_seed: int = 0,
) -> dict:
    """Run ``preset`` (module docstring) on ``run_dir``, with any of its defaults overridden; returns
    the experiment's manifest (rows, runs, figures). ``lr``: GRPO's learning rate for every RL
    variant (one call per value is a sweep, each in a folder of its own). ``recipe``: a YAML recipe
    for the RL side (``setup``; its folder is named after it). ``first_seed``: seeds the recipe's
    seed + first_seed onwards (new seeds for a planned confirmation, in a folder of their own). One
    writer per run folder (tasks/run_lock.py)."""
    with run_lock(Path(run_dir), f"{preset} {Path(run_dir).name}", get_run_logger()):
        return _experiment(
            run_dir,
            preset,
            variants,
            seeds,
            seconds,
            steps,
            samples,
            sample_questions,
            eval_every,
            lr,
            recipe,
            overrides,
            shared_reward_models,
            first_seed,
        )


def _experiment(
    run_dir: str,
    preset: str,
    variants: list[str] | None,
    seeds: int | None,
    seconds: float | None,
    steps: int | None,
    samples: int | None,
    sample_questions: int | None,
    eval_every: int | None,
    lr: float | None,
    recipe: str | None,
    overrides: list[str] | None,
    shared_reward_models: bool,
    first_seed: int = 0,
) -> dict:
    log = get_run_logger()
    s = setup(run_dir, preset, variants, seconds, steps, eval_every, lr, recipe, overrides)
    ids = range(first_seed, first_seed + (seeds or s.preset.seeds))  # seed i: the recipe's seed + i
    samples = samples or s.preset.samples
    # A variant matched to another's labels (``labels_of``) runs after it, seed by seed.
    names = sorted(variants or s.preset.variants, key=lambda n: VARIANTS[n].labels_of is not None)
    # Each seed its own chain: its round-1 reward data and reward models drawn and trained with its
    # seed, so that the intervals cover the reward models' variance, not GRPO's sampling alone.
    learned = learned_rewards(s, names)
    per_seed = bool(learned) and not shared_reward_models
    folder = (
        (f"{Path(recipe).stem}-" if recipe else "")
        + s.budget.tag(s.eval_every)
        + (f"-lr{lr:g}" if lr else "")
        + ("-shared-rm" if shared_reward_models and learned else "")
        + (f"-from-seed-{first_seed}" if first_seed else "")
    )
    cfg, out_root = s.cfg, s.root / preset / folder
    uri = tracking_uri(cfg)
    unsent = unsent_dir(s.root)
    exp_id = experiment_id(uri, cfg.tracking.experiment)
    parent = start_run(
        uri,
        exp_id,
        f"{preset}-{cfg.run_name}",
        tags={"pipeline": "deepseekmath-grpo", f"{preset}_of": s.manifest["mlflow_run_id"]},
    )
    common = {"uri": uri, "parent_id": parent}
    with finishing(uri, [parent], unsent):
        data, sft = s.stage("data").ref, s.stage("sft").ref
        chain = lambda i: out_root / "chains" / f"seed-{i}"  # noqa: E731 - seed i's round-1 reward stages
        if per_seed:
            own = own_reward_models(s, names, chain(ids[0]), data, sft, common, ids[0])
            s = s.model_copy(update={"first": s.first | own})
        elif s.preset.own_reward_models:
            s = s.model_copy(update={"first": own_reward_models(s, names, out_root, data, sft, common)})
        runs = runnable(s, names, log)
        if not runs:
            raise ValueError(f"nothing to run: {run_dir} trained none of the reward models the variants need")
        # Seed by seed, every variant in turn: a slow spell of a shared host hits all variants alike.
        chains, own_chains = [], {name: [] for name in runs if VARIANTS[name].labels_of}
        for j, i in enumerate(ids):
            si = (
                s.model_copy(update={"first": s.first | own_reward_models(s, names, chain(i), data, sft, common, i)})
                if per_seed and j
                else s
            )
            chains.append(si.first)
            for name, done in runs.items():
                sv, where = si, out_root / name / f"seed-{i}"
                if matched := VARIANTS[name].labels_of:
                    own = equal_label_reward_models(si, name, runs[matched][j], where, data, sft, common, i)
                    sv = si.model_copy(update={"first": si.first | own})
                    own_chains[name].append(sv.first)
                done.append(train_variant(sv, name, i, where, data, sft, common))

        results, sampled = evaluate(s, runs, out_root, data, sft, samples, sample_questions, common)
        rows = table_rows(
            s, runs, results, sampled, samples, {n: own_chains.get(n) or (chains if per_seed else None) for n in runs}
        )
        out = {
            "preset": preset,
            "rows": rows,
            "runs": {n: [r.model_dump(mode="json") for r in rs] for n, rs in runs.items()},
            "budget": s.budget.model_dump(),
            "seeds": len(ids),
            "seed_ids": list(ids),  # seed i ran with the recipe's seed + i
            "samples": samples,
            "eval_every": s.eval_every,
            "n_test": results["sft"]["n"],
            "n_sampled": sampled["sft"]["n"] if sampled else 0,
            "sft_val_accuracy": s.stage("sft").best_val_accuracy,
            "run_name": cfg.run_name,
            "dir": str(out_root),
            "mlflow_run_id": parent,
            "grpo_lr": lr or cfg.grpo.lr,
            "recipe": recipe,
            "reward_models": "per seed" if per_seed else "shared" if learned else None,
            # Each variant's recipe as it trained (seed i: the recipe's seed + i).
            "recipes": {n: s.config(n, cfg.seed).model_dump(mode="json") for n in runs},
        }
        out = publish(s, preset, out, out_root, uri, exp_id, parent, unsent)
    log.info("%s:\n%s", preset, format_table(out))
    return out


def runnable(s: Setup, names: list[str], log) -> dict[str, list["Run"]]:
    """The variants that can run on this run and recipe, each with an empty list for its seeds' runs;
    each one left out is said in a line (settings the recipe refuses, a reward model the run did not
    train, the variant an equal-labels arm is matched to not running), and a reward model that
    failed its quality gate is said before any training."""
    runs: dict[str, list[Run]] = {}
    for name in names:
        try:
            vgrpo = None if VARIANTS[name].grpo is None else s.config(name, s.cfg.seed).grpo
        except ValueError as e:  # e.g. dynamic sampling under this recipe's process supervision
            log.warning("skipping %s: its settings over this recipe's are refused: %s", name, e)
            continue
        uses = vgrpo.reward_models_used if vgrpo else ()
        missing = [m for m in uses if m not in s.first]
        if vgrpo and vgrpo.curriculum and not getattr(s.first.get("reward_data"), "pass_rates", None):
            missing.append("reward data with pass rates (for its curriculum)")
        if (matched := VARIANTS[name].labels_of) and matched not in runs:
            log.warning("skipping %s: %s, whose labels and updates it is matched to, does not run", name, matched)
        elif missing:
            log.warning("skipping %s: the run trained no %s", name, ", ".join(missing))
        else:
            runs[name] = []
            for sentence in gate_warnings(s.first, uses):
                log.warning("%s trains on a reward model that failed its quality gate: %s", name, sentence)
    return runs


def model_key(s: Setup, name: str, run: "Run") -> str:
    """A run's model among those an experiment evaluates: ``<variant>/seed-<i>``."""
    return f"{name}/seed-{run.seed - s.cfg.seed}"


def evaluate(
    s: Setup,
    runs: dict[str, list["Run"]],
    out_root: Path,
    data: Ref,
    sft: Ref,
    samples: int,
    sample_questions: int | None,
    common: dict,
) -> tuple[dict, dict]:
    """Every model greedy on every test question, and with ``samples`` > 1 K samples on the first
    ``sample_questions``: the SFT model, each run's published model and, where keep-best published
    another, its last (``<key>/last``); the baseline preset also the run's final policy (the GRPO it
    is the baseline of). Returns the greedy results and the sampled ones (empty without)."""
    cfg = s.cfg
    models = {"sft": sft} | (
        {"policy": Ref(path=s.manifest["policy"], digest=digest_dir(Path(s.manifest["policy"])))}
        if s.preset.all_rounds
        else {}
    )
    models |= {model_key(s, n, r): r.model for n, rs in runs.items() for r in rs}
    models |= {f"{model_key(s, n, r)}/last": r.last for n, rs in runs.items() for r in rs if r.last}
    results = run_stage(eval_task, cfg, str(out_root / "eval"), EvalInputs(data=data, models=models), **common)
    if samples <= 1:
        return results.output.results, {}
    n = sample_questions or s.preset.sample_questions
    ecfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"samples": samples, "n_questions": n})})
    sampled = run_stage(
        eval_task, ecfg, str(out_root / f"eval-k{samples}"), EvalInputs(data=data, models=models), **common
    )
    return results.output.results, sampled.output.results


def table_rows(
    s: Setup,
    runs: dict[str, list["Run"]],
    results: dict,
    sampled: dict,
    samples: int,
    chains: dict[str, list[dict[str, StageOutput]] | None],
) -> list[dict]:
    """The table: the SFT model (and the run's policy where evaluated), then a row per variant
    (``variant_row``; ``chains``: each variant's seeds' round-1 stages where they have their own)."""
    sft_acc = results["sft"]["accuracy"]
    accs = {n: [results[model_key(s, n, r)]["accuracy"] for r in rs] for n, rs in runs.items()}
    # The policy each run ended with: the last step's, where keep-best published another.
    last = {
        n: [results[f"{model_key(s, n, r)}/last" if r.last else model_key(s, n, r)]["accuracy"] for r in rs]
        for n, rs in runs.items()
        if any(r.last for r in rs)
    }
    rows = [
        accuracy_row(ref, [results[ref]["accuracy"]])
        | ({f"{m}@{samples}_mean": sampled[ref][f"{m}@{samples}"] for m in ("maj", "pass")} if sampled else {})
        for ref in ("sft", "policy")
        if ref in results
    ]
    return rows + [variant_row(s, n, rs, sampled, sft_acc, accs, samples, chains[n], last) for n, rs in runs.items()]


def publish(s: Setup, preset: str, out: dict, out_root: Path, uri: str, exp_id: str, parent: str, unsent: Path) -> dict:
    """The experiment's figures, its table and figures on its MLflow run, its Prefect report, and its
    manifest (returned as written)."""
    out["figures"] = {k: str(v) for k, v in figures.save(figures.study_figures(out), out_root / "figures").items()}
    tracker = MlflowLogger(uri, parent, unsent=unsent)
    tracker.log_table(out["rows"], f"{preset}.json")
    tracker.log_artifacts(out_root / "figures", "figures")
    tracker.log_metrics({f"{preset}/{r['variant']}/test_accuracy_mean": r["test_accuracy_mean"] for r in out["rows"]})
    create_markdown_artifact(
        key=artifact_key(f"{preset}-{s.cfg.run_name}"),
        markdown=report(out, mlflow_link(uri, exp_id, parent)),
        description=f"{preset} of {s.root}, {out['seeds']} seed(s) per variant",
    )
    return write_manifest(out_root, out, s.root)


def pts(r: dict, key: str, digits: int = 1) -> str:
    """A row's gain ``key`` (``gain``'s fields) in points with its interval; "-" where absent."""
    if key not in r:
        return "-"
    low, high = r[f"{key}_95ci"]
    return f"{100 * r[key]:+.{digits}f} " + (
        f"[{100 * low:+.{digits}f}, {100 * high:+.{digits}f}]" if low == low else "(one seed: no interval)"
    )


def format_table(result: dict) -> str:
    """The experiment's table in Markdown: accuracies and gains in points, memory in MiB."""
    k = result["samples"]
    sampled = [f"maj@{k}", f"pass@{k}"] if k > 1 else []
    uniform = any(f"gain_over_{UNIFORM}" in r for r in result["rows"])
    gradient = any("groups_with_gradient_mean" in r for r in result["rows"])
    against = [
        v for v in VARIANTS if v not in (BASELINE, UNIFORM) and any(f"gain_over_{v}" in r for r in result["rows"])
    ]
    stale = [kind for kind in ("orm", "prm") if any(f"{kind}_within_auc_start_mean" in r for r in result["rows"])]
    last = any("last_accuracy_mean" in r for r in result["rows"])
    lines = [
        "| variant | seeds | test accuracy | vs SFT (95% CI) | vs continued SFT (95% CI) | "
        + ("vs uniform (95% CI) | " if uniform else "")
        + "".join(f"vs {v} (95% CI) | " for v in against)
        + "".join(f"{s} | " for s in sampled)
        + ("last step: accuracy, vs SFT (95% CI) | kept step per seed | " if last else "")
        + ("steps / groups with a gradient, groups drawn a step | " if gradient else "")
        + "".join(
            f"{k.upper()} within-question AUC on the policy's samples: start, middle, end (mixed groups) | "
            for k in stale
        )
        + "steps/s | peak RSS (MiB) | training s | reward model |",
        "|---" * (9 + len(sampled) + uniform + gradient + len(against) + len(stale) + 2 * last) + "|",
    ]
    for r in result["rows"]:
        cells = [
            r["variant"] + (f" (LoRA rank {r['lora_rank']})" if "lora_rank" in r else ""),
            str(r["seeds"]),
            f"{100 * r['test_accuracy_mean']:.1f} ± {100 * r['test_accuracy_std']:.1f}",
            pts(r, "gain_over_sft"),
            pts(r, "gain_over_continued-sft"),
        ] + ([pts(r, f"gain_over_{UNIFORM}")] if uniform else [])
        cells += [pts(r, f"gain_over_{v}") for v in against]
        cells += [
            f"{100 * r[f'{s}_mean']:.1f}" + (f" ± {100 * r[f'{s}_std']:.1f}" if f"{s}_std" in r else "")
            for s in sampled
        ]
        if last:  # kept step 0 is the starting model republished: said so
            kept = r.get("kept_steps")
            cells += [
                f"{100 * r['last_accuracy_mean']:.1f}, {pts(r, 'last_gain_over_sft')}"
                if "last_accuracy_mean" in r
                else "= kept"
                if kept
                else "-",
                ", ".join("0 (its start, unchanged)" if k == 0 else str(k) for k in kept) if kept else "-",
            ]
        if gradient:
            drawn = r.get("groups_drawn_per_step_mean")
            cells.append(
                f"{100 * r['steps_with_gradient_mean']:.0f}% / {100 * r['groups_with_gradient_mean']:.0f}%"
                + (f", {drawn:.1f}" if drawn else "")
                if "groups_with_gradient_mean" in r
                else "-"
            )
        # A window without a group of both right and wrong solutions in any seed has no AUC: "-".
        cells += [
            ", ".join(
                (f"{r[key]:.3f}" if (key := f"{k}_within_auc_{w}_mean") in r else "-")
                + f" ({r.get(f'{k}_mixed_groups_{w}', 0)})"
                for w in ("start", "middle", "end")
            )
            if f"{k}_within_auc_start_mean" in r
            else "-"
            for k in stale
        ]
        extra = f" (+{r['extra_s_mean']:.0f} retraining)" if r.get("extra_s_mean") else ""
        cells += [
            f"{r['steps_per_s_mean']:.2f}" if "steps_per_s_mean" in r else "-",
            f"{r['peak_rss_mib_mean']:.0f}" if "peak_rss_mib_mean" in r else "-",
            f"{r['train_s_mean']:.0f}{extra}" if "train_s_mean" in r else "-",
            r.get("reward_model", "-"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(result: dict, link: str) -> str:
    """The Prefect artifact: what was run, the table, a line per compared pair, the figures inline."""
    b = result["budget"]
    what = f"{b['steps']} GRPO steps each" if b["steps"] else f"{b['seconds']:.0f} s of training each"
    same = "same GRPO steps" if b["steps"] else "same training seconds"
    lines = [
        f"# {result['preset']} of `{result['run_name']}`",
        "",
        f"Every variant from the SFT model, {result['seeds']} seed(s), {what}"
        + (
            "; each seed its own round-1 reward data and reward models"
            if result.get("reward_models") == "per seed"
            else ""
        )
        + "; greedy test accuracy on "
        f"{result['n_test']} questions"
        + (f", maj@K / pass@K on {result['n_sampled']}" if result["n_sampled"] else "")
        + f". [MLflow run]({link})",
        "",
    ]
    warned = [warning_line(w, r["variant"]) for r in result["rows"] for w in r.get("quality_warnings", [])]
    lines += (warned + [""] if warned else []) + [format_table(result), ""]
    for r in result["rows"]:
        for other in VARIANTS[r["variant"]].against if r["variant"] in VARIANTS else ():
            if f"gain_over_{other}" in r:
                ended = f"last_gain_over_{other}"
                lines.append(
                    f"- {r['variant']} against {other} ({same}): {pts(r, f'gain_over_{other}', 2)} points, "
                    f"{r['seeds']} seeds"
                    + (f"; the policies the runs ended with: {pts(r, ended, 2)}" if ended in r else "")
                    + "."
                )
    lines += [""] + [f"![{name}]({figure_source(Path(path))})" for name, path in result["figures"].items()]
    return "\n".join(lines)

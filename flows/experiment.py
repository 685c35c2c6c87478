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

This module trains and evaluates; ``flows/experiment_setup.py`` holds the fixed parts (``Setup``,
``Run``), ``flows/experiment_table.py`` the rows, the manifest and the report.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows import artifact_key, numbered_run_name, parameter
from flows.experiment_setup import Run, Setup, model_key, setup
from flows.experiment_table import experiment_manifest, format_table, gate_warnings, report, table_rows
from flows.reports import mlflow_link
from flows.rounds import RoundStart, grpo_stage, reward_stages
from flows.variants import VARIANTS
from grpo_core import figures
from grpo_core.config import PipelineConfig
from grpo_core.digests import digest_dir
from grpo_core.manifests import write_manifest
from grpo_core.mlflow_runs import experiment_id, finishing, start_run, tracking_uri
from grpo_core.rewards.gate import gate_grpo
from grpo_core.stages.inputs import EvalInputs, GRPOInputs, Ref, SFTInputs
from grpo_core.stages.outputs import StageOutput
from grpo_core.tracking import MlflowLogger, unsent_dir
from tasks.run_lock import run_lock
from tasks.stage_tasks import StageRun, eval_task, grpo_task, run_stage, sft_task


def train_variant(
    s: Setup, name: str, seed: int, out: Path, data: Ref, sft: Ref, common: dict, later: dict | None = None
) -> Run:
    """Variant ``name``'s run of ``seed`` in ``out``; ``later``: a ``labels_of`` arm's own reward
    models (``equal_label_reward_models``), which it trains on from round 2 on."""
    vcfg = s.config(name, s.cfg.seed + seed)
    if VARIANTS[name].grpo is None:
        return Run.of(vcfg.seed, [run_stage(sft_task, vcfg, str(out), SFTInputs(data=data, init=sft), **common).output])
    if s.rounds(name) > 1:
        return iterated(s, name, seed, out, data, sft, common, later)
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


def iterated(
    s: Setup, name: str, seed: int, out: Path, data: Ref, sft: Ref, common: dict, later: dict | None = None
) -> Run:
    """Iterative RL from the SFT model (§4.2), the variant's rounds sharing its budget: GRPO round 1
    on the round-1 reward models (``s.first``); then, each round, GRPO from the last round's policy
    (the new reference) on reward models that are, by the variant, the same (frozen), ``later``'s
    from round 2 on (a ``labels_of`` arm: as strong as the retrained arm's by then, never fresher;
    its row counts their updates and labels, and its curriculum keeps round 1's pass rates),
    or retrained between rounds on the new policy's samples and GRPO's rollouts plus a replay share
    of earlier data (``flows.rounds.reward_stages``, the pipeline's own). The retraining's seconds
    are outside the budget (``Run.extra``)."""
    variant = VARIANTS[name]
    used = s.config(name, s.cfg.seed).grpo.reward_models_used
    rms = {kind: s.first[kind].ref for kind in used}
    learned = learned_reward_models(s.model_copy(update={"first": s.first | later}) if later else s, used)
    buffer = s.first["replay"].ref if "replay" in s.first else None
    rates = s.first["reward_data"].pass_rates_ref if "reward_data" in s.first else None
    policy, stages, extra, warned = sft, [], {}, []
    # Every round's GRPO passes its reward models' quality gates as the pipeline's rounds do
    # (rewards/gate.py): round 1's (whose failures the row already reports), then each retrained one's.
    gates, retrained = {kind: s.first[kind].quality_gate for kind in used}, False
    for k in range(1, s.rounds(name) + 1):
        if k == 2 and later:
            rms, gates = {kind: later[kind].ref for kind in used}, {kind: later[kind].quality_gate for kind in used}
        gated = gate_grpo(s.config(name, s.cfg.seed + seed, k), gates)
        if retrained:
            kept_out = "; kept out of GRPO's reward" if gated.excluded else ""
            warned += [f"round {k}, seed {seed}: {failure}{kept_out}" for failure in gated.failures]
        g = grpo_stage(gated.cfg, k, round_grpo_dir(gated.cfg, k, out), data, policy, rms, rates, common).output
        stages.append(g)
        policy = g.ref
        if k == s.rounds(name) or not variant.retrain:
            continue
        rollouts = Ref(path=g.rollouts, digest=g.digest) if g.rollouts else None
        start = RoundStart(policy=g.ref, reward_models=rms, buffer=buffer, rollouts=rollouts)
        retrain = retrain_config(gated.cfg, used, variant.replay)
        done = reward_stages(retrain, k + 1, out / f"round-{k + 1}", out, data, sft, start, common)
        rms = {kind: done[kind].output.ref for kind in used}
        learned = with_retraining(learned, done, s.cfg.reward_data.samples_per_question)
        gates, retrained = {kind: done[kind].output.quality_gate for kind in used}, True
        buffer, rates = done["replay"].output.ref, done["reward_data"].output.pass_rates_ref
        for stage, r in done.items():  # the stages' own time (cached or not)
            extra[stage] = extra.get(stage, 0.0) + r.output.wall_s
    return Run.of(s.cfg.seed + seed, stages, extra).model_copy(update={"quality_warnings": warned, **learned})


def round_grpo_dir(vcfg: PipelineConfig, k: int, out: Path) -> Path:
    """Where round ``k``'s GRPO of an iterated variant's run in ``out`` goes. Round 1 is the same for
    every variant with the same GRPO settings, seed and round-1 reward models (they differ only
    between rounds): it runs once, in a folder they share."""
    shared = hashlib.sha256(vcfg.grpo.model_dump_json().encode()).hexdigest()[:8]
    return out.parents[1] / "round-1" / f"grpo-{shared}" / out.name if k == 1 else out / f"round-{k}" / "grpo"


def retrain_config(vcfg: PipelineConfig, used: tuple[str, ...], replay: float | None) -> PipelineConfig:
    """The recipe of a retraining between rounds: the reward models ``used`` trained (no other),
    with the variant's replay share (``replay``; None: the recipe's)."""
    return vcfg.model_copy(
        update={
            **{kind: getattr(vcfg, kind).model_copy(update={"train": kind in used}) for kind in ("orm", "prm")},
            "rounds": vcfg.rounds.model_copy(
                update={"replay_fraction": vcfg.rounds.replay_fraction if replay is None else replay}
            ),
        }
    )


def with_retraining(learned: dict, done: dict[str, StageRun], samples_per_question: int) -> dict:
    """A run's ``reward_model_updates`` and ``reward_model_labels`` (``learned_reward_models``) with a
    retraining's (``done``: its stages) added."""
    return {
        "reward_model_updates": {k: n + done[k].output.steps for k, n in learned["reward_model_updates"].items()},
        "reward_model_labels": learned["reward_model_labels"]
        + done["reward_data"].output.labelled(samples_per_question),
    }


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
    shared = shared_reward_models and bool(learned)
    cfg, out_root = s.cfg, s.root / preset / experiment_folder(s, recipe, lr, shared, first_seed)
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
        s = round_one_reward_models(s, names, per_seed, out_root, ids[0], data, sft, common)
        runs = runnable(s, names, log)
        if not runs:
            raise ValueError(f"nothing to run: {run_dir} trained none of the reward models the variants need")
        chains = train_seeds(s, names, runs, ids, per_seed, out_root, data, sft, common)
        results, sampled = evaluate(s, runs, out_root, data, sft, samples, sample_questions, common)
        rows = table_rows(s, runs, results, sampled, samples, chains)
        reward_models = "per seed" if per_seed else "shared" if learned else None
        out = experiment_manifest(
            s, preset, rows, runs, ids, samples, results, sampled, out_root, parent, lr, recipe, reward_models
        )
        out = publish(s, preset, out, out_root, uri, exp_id, parent, unsent)
    log.info("%s:\n%s", preset, format_table(out))
    return out


def experiment_folder(s: Setup, recipe: str | None, lr: float | None, shared: bool, first_seed: int) -> str:
    """The experiment's folder under ``runs/<run>/<preset>/``: the recipe's name, the budget and
    evaluation schedule, and any learning rate, shared reward models or first seed."""
    return (
        (f"{Path(recipe).stem}-" if recipe else "")
        + s.budget.tag(s.eval_every)
        + (f"-lr{lr:g}" if lr else "")
        + ("-shared-rm" if shared else "")
        + (f"-from-seed-{first_seed}" if first_seed else "")
    )


def chain_dir(out_root: Path, i: int) -> Path:
    """Where seed ``i``'s own round-1 reward stages run."""
    return out_root / "chains" / f"seed-{i}"


def round_one_reward_models(
    s: Setup, names: list[str], per_seed: bool, out_root: Path, first: int, data: Ref, sft: Ref, common: dict
) -> Setup:
    """``s`` with the round-1 reward models the variants start on: seed ``first``'s own where each seed
    has its own (``per_seed``), the experiment's own where the preset trains them, else the run's."""
    if per_seed:
        own = own_reward_models(s, names, chain_dir(out_root, first), data, sft, common, first)
        return s.model_copy(update={"first": s.first | own})
    if s.preset.own_reward_models:
        return s.model_copy(update={"first": own_reward_models(s, names, out_root, data, sft, common)})
    return s


def train_seeds(
    s: Setup,
    names: list[str],
    runs: dict[str, list[Run]],
    ids: range,
    per_seed: bool,
    out_root: Path,
    data: Ref,
    sft: Ref,
    common: dict,
) -> dict[str, list[dict[str, StageOutput]] | None]:
    """Seed by seed, every variant in turn (a slow spell of a shared host hits all variants alike),
    each run appended to ``runs``; where each seed has its own chain, seeds after the first draw and
    train their round-1 reward models first. Returns each variant's seeds' round-1 stages where they
    have their own (``table_rows``' ``chains``)."""
    chains, own_chains = [], {name: [] for name in runs if VARIANTS[name].labels_of}
    for j, i in enumerate(ids):
        si = (
            s.model_copy(
                update={"first": s.first | own_reward_models(s, names, chain_dir(out_root, i), data, sft, common, i)}
            )
            if per_seed and j
            else s
        )
        chains.append(si.first)
        for name, done in runs.items():
            where = out_root / name / f"seed-{i}"
            own = None
            if matched := VARIANTS[name].labels_of:
                own = equal_label_reward_models(si, name, runs[matched][j], where, data, sft, common, i)
                own_chains[name].append(si.first | own)
            done.append(train_variant(si, name, i, where, data, sft, common, later=own))
    return {n: own_chains.get(n) or (chains if per_seed else None) for n in runs}


def runnable(s: Setup, names: list[str], log) -> dict[str, list[Run]]:
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


def evaluate(
    s: Setup,
    runs: dict[str, list[Run]],
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

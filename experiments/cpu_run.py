"""A finished real-benchmark run (``make real``) as the folder docs/cpu-runs/<date>-<name>/ commits: every
evaluated model's completions per benchmark (``<benchmark>-<sft|policy>.jsonl.gz``, one JSON line per
question: ``idx``, ``question``, ``completion``, ``answer``, ``correct``), the run's ``split.json``, and
``summary.json``: accuracies, the policy minus SFT paired over the questions with a 95% interval, GRPO's
share of groups with reward spread, the stages' seconds, and every completion scored again by a second
extraction (the last number anywhere in the completion, not the text after ``####``) so that a
disagreement between the two is visible. Each difference has a second interval,
``policy_minus_sft_by_cluster``: cluster-robust over the evaluated questions' near-duplicate clusters
(``benchmarks.clusters``), whose verdicts are not independent.

    python experiments/cpu_run.py runs/smollm2-cpu docs/cpu-runs/2026-11-27-smollm2-mawps
    python experiments/cpu_run.py runs/smollm2-cpu docs/cpu-runs/2026-11-27-smollm2-mawps-seed-1 --grpo-seed 1
    python experiments/cpu_run.py runs/smollm2-cpu docs/cpu-runs/2026-11-27-smollm2-mawps-steps-45 \
        --grpo-seed 0 --grpo-steps 45
    python experiments/cpu_run.py runs/smollm2-cpu docs/cpu-runs/2026-11-28-smollm2-mawps-prm-seed-1 \
        --experiment runs/smollm2-cpu/compare/steps-30-eval6 --variant rule+prm-process --seed 1
    python experiments/cpu_run.py runs/smollm2-cpu docs/cpu-runs/<date>-smollm2-controls-seed-10 \
        --experiment runs/smollm2-cpu/compare/<budget> --variant rule-outcome --seed 10 \
        --controls continued-sft,online-rft
    python experiments/cpu_run.py --check docs/cpu-runs/2026-11-27-smollm2-mawps
    python experiments/cpu_run.py runs/smollm2-cpu-calculator docs/cpu-runs/<date>-smollm2-calculator-seed-0 \
        --arm calculator
    python experiments/cpu_run.py --paired docs/cpu-runs/<calculator seed 0>:policy-calculator \
        docs/cpu-runs/<seed 0>:policy --paired <calculator seed 1>:policy-calculator <seed 1>:policy

A seed's arms can land in different sessions (a machine that starts empty each time): ``--experiment
DIR --seed S --controls A`` without ``--variant`` records the control alone, and a later ``--variant V``
into the same folder keeps it (and the reverse). An experiment's models are recorded against the SFT
model the experiment evaluated beside them, and a run whose SFT model writes other completions than
the folder holds is refused before anything is written; ``--same-sft-as FOLDER`` also checks them
against another committed folder's (the SFT model a plan names). The seed's round-1 reward models
(its chain's, shared by its learned arms) are named in ``seed_reward_models`` by their held-out quality
with the first arm recorded that trained on them; a later arm on them, trained again in a session
whose machine kept nothing, is recorded only if that quality is the same exactly, and is refused
otherwise, also before anything is written. (The arm's own ``reward_models`` is its session's record.)

``--policy DIR --recipe FILE`` evaluates the run's SFT model and the model at DIR (a GRPO checkpoint of a
run that was stopped before its end, say) with the recipe's evaluation settings, then records them.
``--grpo-seed S`` first trains GRPO again from the run's SFT model with the recipe's seed set to S (other
questions and samples; ``<run>/seed-S/``) and evaluates that policy on the same questions; the SFT
model's completions are the run's. ``--grpo-steps N`` with it trains N steps instead of the recipe's
(``<run>/seed-S-steps-N/``). ``--experiment DIR --variant V --seed S`` records seed S of variant V
of a finished experiment on the run (``grpo-pipeline compare`` or ``iterate``: its GRPO, evaluation, and
that seed's own reward models' held-out quality beside the SFT model's likelihood, round 1's and any
retrained before a later round); ``--controls A,B`` also the
same seed's arms A and B, each as ``<benchmark>-A.jsonl.gz`` (continued SFT, online RFT: the policy is
then compared with each). ``--check`` reads a
committed folder alone and recomputes its accuracies and intervals from the files. ``--arm A`` names the
run's models ``sft-A`` and ``policy-A`` (a recipe's arm: ``<benchmark>-policy-calculator.jsonl.gz``).
``--paired FOLDER:MODEL FOLDER:MODEL``, once per seed, pairs two committed models question by question
in each seed and over the seeds (each question's score averaged over them; and the per-seed accuracy
differences with a Student-t interval): models of two runs, or two models of one folder per seed (one
run's policy against another's: ``--paired <prm seed 1>:policy <checker seed 1>:policy``; a plan's
primary over seeds: ``--paired <seed 10>:policy <seed 10>:continued-sft --paired <seed 11>:...``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_core.benchmarks import clusters  # noqa: E402
from grpo_core.stats import question_interval, seed_interval  # noqa: E402
from grpo_core.verify import answers_match  # noqa: E402

_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number_correct(completion: str, gold: str) -> bool:
    """A second reading of a completion: its last number, wherever it stands."""
    numbers = _LAST_NUMBER.findall(completion)
    return bool(numbers) and answers_match(numbers[-1].replace(",", ""), gold)


def read_rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def model_names(arm: str = "") -> tuple[str, str]:
    """The SFT model's and the policy's names in a folder's files: ``sft``/``policy``, or an arm's."""
    return ("sft", "policy") if not arm else (f"sft-{arm}", f"policy-{arm}")


def score(folder: Path, arm: str = "") -> dict:
    """Accuracies and paired intervals recomputed from the committed completions alone: the policy
    minus SFT, and where the folder holds controls (``<benchmark>-<control>.jsonl.gz`` beside
    ``sft`` and ``policy``: continued SFT, online RFT) the policy minus each and each minus SFT.
    ``arm``: the folder's models are ``sft-<arm>`` and ``policy-<arm>``."""
    sft, policy = model_names(arm)
    out: dict[str, dict] = {}
    for bench in benchmarks(folder, sft, policy):
        named = {f.name[len(bench) + 1 :].removesuffix(".jsonl.gz") for f in folder.glob(f"{bench}-*.jsonl.gz")}
        models = [sft] + [policy] * (policy in named) + sorted(named - {sft, policy})
        rows = {m: read_rows(folder / f"{bench}-{m}.jsonl.gz") for m in models}
        for m, rs in rows.items():
            if [r["idx"] for r in rs] != [r["idx"] for r in rows[sft]]:
                raise ValueError(f"{folder}: {bench}'s {m} and {sft} hold different questions")
        correct = {m: [bool(r["correct"]) for r in rs] for m, rs in rows.items()}
        # Near-duplicates among the evaluated questions (MAWPS repeats its problems) are not independent.
        groups = clusters([r["question"] for r in rows[sft]])
        second = {m: [last_number_correct(r["completion"], r["gold"]) for r in rs] for m, rs in rows.items()}
        controls = [c for c in models if c not in (sft, policy)]
        pairs = [(policy, sft)] + [(a, b) for c in controls for a, b in ((policy, c), (c, sft))]
        pairs = [(a, b) for a, b in pairs if a in models]  # a seed's controls recorded before its policy
        out[bench] = {"n": len(rows[sft]), **{m: sum(c) / len(c) for m, c in correct.items()}}
        for a, b in pairs:
            out[bench][f"{a}_minus_{b}"] = question_interval(correct[a], correct[b])
            out[bench][f"{a}_minus_{b}_by_cluster"] = question_interval(correct[a], correct[b], clusters=groups)
        out[bench]["last_number"] = {
            **{m: sum(c) / len(c) for m, c in second.items()},
            **{f"{a}_minus_{b}": question_interval(second[a], second[b]) for a, b in pairs},
            "disagree": {m: sum(x != y for x, y in zip(correct[m], second[m])) for m in correct},
        }
    return out


def benchmarks(folder: Path, sft: str, policy: str) -> list[str]:
    """The benchmarks a folder scores: those of its ``split.json`` with the SFT model's file; without
    a split, those with both the SFT model's and the policy's (``mawps-continued-sft`` is a control's)."""
    if (folder / "split.json").is_file():
        return [
            b for b in json.loads((folder / "split.json").read_text()) if (folder / f"{b}-{sft}.jsonl.gz").is_file()
        ]
    found = (f.name.removesuffix(f"-{sft}.jsonl.gz") for f in sorted(folder.glob(f"*-{sft}.jsonl.gz")))
    return [b for b in found if (folder / f"{b}-{policy}.jsonl.gz").is_file()]


def paired(pairs: list[tuple[str, str]]) -> dict:
    """Two committed models of two runs (``FOLDER:MODEL`` each, one pair per seed), question by
    question on every benchmark of the folders' ``split.json`` that all of them hold: each seed's
    paired interval (and the cluster-robust one); over the seeds the per-question scores averaged
    (the interval covers the questions, not the seeds' spread); and the seeds as the sample, a
    Student-t interval on the per-seed accuracy differences (what a plan's primary over 3 seeds
    reads; two seeds say little about the spread, one nothing)."""

    def files(spec: str) -> dict[str, Path]:
        folder, _, model = spec.rpartition(":")
        if not folder or not model:
            raise ValueError(f"--paired {spec!r}: FOLDER:MODEL expected (docs/cpu-runs/<name>:policy)")
        if not (Path(folder) / "split.json").is_file():
            raise ValueError(f"--paired {spec!r}: {folder} holds no split.json (not a committed run folder)")
        benches = json.loads((Path(folder) / "split.json").read_text())
        found = {b: Path(folder) / f"{b}-{model}.jsonl.gz" for b in benches}
        found = {b: f for b, f in found.items() if f.is_file()}
        if not found:
            raise ValueError(f"--paired {spec!r}: no <benchmark>-{model}.jsonl.gz in {folder}")
        return found

    specs = [spec for pair in pairs for spec in pair]  # a, b of seed 0, then of seed 1, ...
    sides = [files(spec) for spec in specs]
    benches = sorted(set.intersection(*(set(side) for side in sides)))
    if not benches:
        raise ValueError(f"--paired: no benchmark is held by every model named ({pairs})")
    out: dict[str, dict] = {"benchmarks_left_out": sorted(set.union(*(set(side) for side in sides)) - set(benches))}
    for bench in benches:
        rows = [read_rows(side[bench]) for side in sides]
        ids = [r["idx"] for r in rows[0]]
        for spec, rs in zip(specs, rows):
            if [r["idx"] for r in rs] != ids:
                raise ValueError(f"--paired {spec}: {bench} holds other questions than {pairs[0][0]}'s")
        groups = clusters([r["question"] for r in rows[0]])
        correct = [[float(r["correct"]) for r in rs] for rs in rows]
        a_runs, b_runs = correct[0::2], correct[1::2]
        seeds = [
            {"a": a, "b": b, "a_accuracy": sum(ca) / len(ca), "b_accuracy": sum(cb) / len(cb)}
            | {"a_minus_b": question_interval(ca, cb)}
            | {"a_minus_b_by_cluster": question_interval(ca, cb, clusters=groups)}
            for (a, b), ca, cb in zip(pairs, a_runs, b_runs)
        ]
        # Each question's score averaged over the seeds, then paired as one model against the other.
        a_mean, b_mean = ([sum(col) / len(col) for col in zip(*runs)] for runs in (a_runs, b_runs))
        out[bench] = {
            "n": len(ids),
            "n_seeds": len(pairs),
            "seeds": seeds,
            "a_minus_b": question_interval(a_mean, b_mean),
            "a_minus_b_by_cluster": question_interval(a_mean, b_mean, clusters=groups),
            # The seeds as the sample: the accuracies' per-seed differences, Student-t (NaN for one seed).
            "a_minus_b_over_seeds": seed_interval([x["a_accuracy"] for x in seeds], [x["b_accuracy"] for x in seeds]),
        }
    return out


def another_seed(run_dir: Path, manifest: dict, seed: int, steps: int | None = None) -> tuple[dict, dict, str]:
    """GRPO from the run's SFT model with the recipe's seed set to ``seed`` (and its ``grpo.max_steps``
    to ``steps``, where given), and its evaluation."""
    from grpo_core.evaluation import run_eval
    from grpo_core.lm.runtime import stage_peak_memory
    from grpo_core.recipe import load_config
    from grpo_core.stages.grpo import run_grpo

    cfg = load_config(run_dir / "config.yaml", [f"seed={seed}"] + ([f"grpo.max_steps={steps}"] if steps else []))
    name = f"seed-{seed}" + (f"-steps-{steps}" if steps else "")
    out, data = run_dir / name, Path(manifest["data_dir"])
    with stage_peak_memory() as peak:
        grpo = run_grpo(cfg, data, manifest["sft_model"], out / "grpo")
    grpo["peak_memory"] = peak
    evaluated = run_eval(cfg, data, {"policy": grpo["model"]}, out / "eval")
    return grpo, evaluated["results"]["policy"], cfg.model_dump_json()


def experiment_seed(experiment: Path, variant: str, seed: int) -> tuple[dict, dict, str, dict]:
    """Seed ``seed`` of ``variant`` in a finished experiment: its GRPO (as ``record`` reads a run's),
    its evaluation, its recipe, and its reward models (``reward_models``): its chain's round 1, and
    under ``round-<k>`` those an iterated variant retrained before round k."""
    manifest = json.loads((experiment / "manifest.json").read_text())
    recipe, run = manifest["recipes"][variant], seed_run(experiment, manifest, variant, seed)
    grpo = {
        "steps": run["steps"],
        "best_step": run.get("kept_step"),
        "best_val_accuracy": None,
        "rewards": run["rewards"],
        "curve": run["curve"],
        "train_s": run["train_s"],
        "peak_memory": run.get("peak_memory", {}),  # the largest of its stages'
    }
    evaluated = json.loads((experiment / "eval" / "manifest.json").read_text())["results"][f"{variant}/seed-{seed}"]
    quality = reward_models(chain_of(experiment, seed))
    # An iterated variant's reward models retrained between rounds (``round-2``, ...): the same record each.
    rounds = (experiment / variant / f"seed-{seed}").glob("round-*")
    for later in sorted(rounds, key=lambda r: int(r.name.removeprefix("round-"))):
        if found := reward_models(later):
            quality[later.name] = found
    config = yaml.safe_dump(recipe | {"seed": recipe["seed"] + seed}, sort_keys=False)
    return grpo, evaluated, config, quality


def seed_run(experiment: Path, manifest: dict, variant: str, seed: int) -> dict:
    """Seed ``seed``'s run of ``variant`` in the experiment's ``manifest`` (its ``runs`` entry)."""
    # Runs are listed in seed order from the experiment's first seed (``--first-seed``): find it by its own.
    first, runs = manifest["recipes"][variant]["seed"], {r["seed"]: r for r in manifest["runs"][variant]}
    if first + seed not in runs:
        raise ValueError(f"{experiment}: {variant} has no seed {seed} (it has {sorted(k - first for k in runs)})")
    return runs[first + seed]


def chain_of(experiment: Path, seed: int) -> Path:
    """Where the experiment trained seed ``seed``'s own round-1 reward models (``flows.experiment.chain_dir``)."""
    return experiment / "chains" / f"seed-{seed}" / "round-1"


def control_run(experiment: Path, control: str, seed: int) -> tuple[dict, str]:
    """Seed ``seed`` of a control arm in a finished experiment: its steps and training seconds and the
    step it published (continued SFT: its best validation checkpoint; RL arms: their last), and its
    recipe as it trained."""
    from flows.experiment_table import run_staleness

    grpo, _, config, quality = experiment_seed(experiment, control, seed)
    run = {"steps": grpo["steps"], "published_step": grpo["best_step"], "train_s": grpo["train_s"]}
    if staleness := run_staleness(grpo["rewards"]):  # an arm on a learned reward
        run["staleness"] = staleness
    if digest := first_round(grpo["rewards"]):
        run["round_1"] = digest
    retrained = {k: v for k, v in quality.items() if k.startswith("round-")}  # an iterated arm's own
    return run | ({"reward_models": retrained} if retrained else {}), config


def first_round(rewards: list[dict]) -> str | None:
    """A digest of round 1's GRPO steps (every metric recorded of each, the clock aside) of a run in
    rounds; None for a run of one round. The loop's arms of one seed share round 1 (``frozen`` and
    ``retrained`` differ from round 2 on): ``check_first_rounds`` refuses a folder where they differ."""
    rows = [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rewards if r.get("round", 1) == 1]
    if len(rows) == len(rewards):
        return None
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def check_first_rounds(digests: dict[str, str | None], folder: Path) -> None:
    """Refuse, before a file is written, one seed's arms in rounds (``digests``: arm -> ``first_round``)
    whose round 1 differs: a round 1 trained again (a machine that kept nothing, other code) is not the
    round both arms were to share."""
    if len(set((found := {arm: d for arm, d in digests.items() if d}).values())) > 1:
        raise ValueError(
            f"{folder}: the arms' round 1 differs ({found}): not the shared round 1 they were to differ "
            "after (record into a new folder and report them apart)"
        )


def fingerprint(quality: dict, kinds) -> dict:
    """What names a seed's round-1 reward models (``reward_models``' record of them): each of ``kinds``'
    held-out quality, trained and the SFT likelihood's (equal only for the same models on the same data)."""
    return {k: {f: quality[k][f] for f in ("trained", "sft_likelihood")} for k in kinds if k in quality}


def arms_reward_models(experiment: Path, arms: list[str], seed: int) -> dict:
    """The ``fingerprint`` of seed ``seed``'s round-1 reward models that ``arms`` trained on (those their
    runs name in ``reward_model_updates``; an arm on the checker alone or continued SFT names none)."""
    manifest = json.loads((experiment / "manifest.json").read_text())
    used = {k for a in arms for k in seed_run(experiment, manifest, a, seed).get("reward_model_updates", {})}
    return fingerprint(reward_models(chain_of(experiment, seed)), sorted(used))


def check_reward_models(recorded: dict, incoming: dict, chain: Path) -> None:
    """Refuse, before a file is written, a seed's round-1 reward models (``chain``'s) trained again with
    other held-out quality than the folder recorded for that seed (``recorded``: an earlier arm's, maybe
    an earlier session's; both ``fingerprint``s): arms on two sets of reward models are not one seed's."""
    for kind in recorded.keys() & incoming.keys():
        if recorded[kind] != incoming[kind]:
            raise ValueError(
                f"{chain / kind}: the seed's {kind} has held-out quality {incoming[kind]}, the folder recorded "
                f"{recorded[kind]}: reward models trained again, not those its arms used (record into a new "
                "folder and report the two apart)"
            )


def check_incoming(copies: list[tuple[str, Path, Path]], sft: str, same_as: list[Path]) -> None:
    """Refuse, before a file is written, what would mix two SFT models or two question sets in a folder
    (``copies``: model, the folder's file, the run's file). The run's SFT completions must be those the
    folder already holds (an earlier session's arm of the same seed) and those of every ``same_as``
    folder (the SFT model a plan names), line for line; every model's file must hold the SFT file's
    questions of its benchmark."""
    sft_rows = {to.name: (src, read_rows(src)) for model, to, src in copies if model == sft}  # read once
    for model, to, src in copies:
        if model == sft:
            for committed in [to] + [folder / to.name for folder in same_as]:
                if committed.is_file() and read_rows(committed) != sft_rows[to.name][1]:
                    raise ValueError(
                        f"{src}: the run's SFT model wrote other completions than {committed} holds: not the SFT "
                        "model those arms started from (rebuild it bit for bit, or record into a new folder)"
                    )
        else:
            own, rows = sft_rows[to.name.removesuffix(f"-{model}.jsonl.gz") + f"-{sft}.jsonl.gz"]
            if [r["idx"] for r in read_rows(src)] != [r["idx"] for r in rows]:
                raise ValueError(f"{src}: {model} was evaluated on other questions than the SFT model ({own})")


def reward_models(folder: Path) -> dict:
    """The reward models a round's folder holds: their held-out quality beside the SFT likelihood's,
    their gates and seconds, and the seconds of their data (sampling and labelling)."""
    quality = {}
    for kind in ("orm", "prm"):
        if (folder / kind / "manifest.json").is_file():
            rm = json.loads((folder / kind / "manifest.json").read_text())
            quality[kind] = {"trained": rm["heldout"], "sft_likelihood": rm["baseline"]}
            if rm.get("heldout_before"):  # the starting model on the same rows (a retrained one: last round's)
                quality[kind]["before"] = rm["heldout_before"]
            quality[kind] |= {"quality_gate": rm["quality_gate"], "wall_s": rm["wall_s"]}
    if quality and (folder / "reward_data" / "manifest.json").is_file():
        quality["reward_data_wall_s"] = json.loads((folder / "reward_data" / "manifest.json").read_text())["wall_s"]
    return quality


def evaluate_policy(run_dir: Path, recipe: Path, policy: Path) -> dict:
    """The run's SFT model and ``policy`` (a GRPO checkpoint ``step-N``) evaluated on the run's test
    sets with the recipe's settings, as a manifest of the fields ``record`` reads."""
    from grpo_core.evaluation import run_eval
    from grpo_core.recipe import load_config

    cfg = load_config(recipe)
    data, sft = run_dir / "data", run_dir / "sft" / "model"
    evaluated = run_eval(cfg, data, {"sft": str(sft), "policy": str(policy)}, run_dir / f"eval-{policy.name}")[
        "results"
    ]
    manifest = {
        "run_name": cfg.run_name,
        "eval": evaluated,
        "data_dir": str(data),
        "profile": {"stages_s": {}, "wall_s": None},
        "rounds": [
            {
                "stages": {
                    "grpo": {
                        "steps": int(policy.name.rsplit("-", 1)[-1]),
                        "best_step": None,
                        "best_val_accuracy": None,
                        "rewards": [],
                        "curve": [],
                        "train_s": None,
                    }
                }
            }
        ],
    }
    return manifest


def peak_rss(manifest: dict) -> dict[str, float]:
    """Each stage's peak resident set in MiB as its manifest recorded it, and the whole command's
    (``run``: the flow's process; a stage launched in a process of its own adds its peak to it)."""
    stages = {name: m for name, m in manifest.get("stages", {}).items()}
    for r in manifest["rounds"]:
        stages |= {f"round-{r.get('round', 1)}/{name}": m for name, m in r["stages"].items()}
    peaks = {name: m.get("peak_memory", {}).get("rss_mib") for name, m in stages.items() if isinstance(m, dict)}
    return {"run": manifest.get("peak_memory", {}).get("rss_mib")} | {k: v for k, v in peaks.items() if v}


def record(
    run_dir: Path,
    folder: Path,
    grpo_seed: int | None = None,
    policy: Path | None = None,
    recipe: Path | None = None,
    experiment: tuple[Path, str | None, int] | None = None,
    grpo_steps: int | None = None,
    controls: tuple[str, ...] = (),
    arm: str = "",
    same_as: tuple[Path, ...] = (),
) -> dict:
    """The run (or a seed of it, or of an experiment on it) into ``folder``. An experiment's models are
    recorded against the SFT model it evaluated beside them; ``experiment``'s variant None records the
    seed's ``controls`` alone, into a folder that may hold its variant already (or get it later): what
    the folder's summary said of the other stays."""
    manifest = (
        evaluate_policy(run_dir, recipe, policy) if policy else json.loads((run_dir / "manifest.json").read_text())
    )
    config = recipe.read_text() if policy else (run_dir / "config.yaml").read_text()
    results = {"sft": manifest["eval"]["sft"], "policy": manifest["eval"]["policy"]}
    grpo, quality, trained, configs = manifest["rounds"][-1]["stages"]["grpo"], {}, {}, {}
    before = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").is_file() else {}
    # The seed's round-1 reward models as first recorded (a folder from before the field: its variant's).
    seed_models = before.get("seed_reward_models") or fingerprint(before.get("reward_models", {}), ("orm", "prm"))
    if grpo_seed is not None:
        grpo, results["policy"], config = another_seed(run_dir, manifest, grpo_seed, grpo_steps)
    if experiment is not None:
        exp, variant, seed = experiment
        evaluated = json.loads((exp / "eval" / "manifest.json").read_text())["results"]
        results = {"sft": evaluated["sft"]} | {c: evaluated[f"{c}/seed-{seed}"] for c in controls}
        if variant:
            grpo, results["policy"], config, quality = experiment_seed(exp, variant, seed)
        for c in controls:
            trained[c], configs[f"config-{c}.yaml"] = control_run(exp, c, seed)
        incoming = arms_reward_models(exp, [variant] * bool(variant) + list(controls), seed)
        check_reward_models(seed_models, incoming, chain_of(exp, seed))
        seed_models |= incoming
    with_policy = experiment is None or bool(experiment[1])  # not a seed's controls alone
    # Each arm's round 1: the folder's policy (its variant) under its own key, apart from the controls.
    rounds_1 = {f"policy ({before.get('variant')})": before.get("grpo", {}).get("round_1")}
    rounds_1 |= {c: run.get("round_1") for c, run in (before.get("controls", {}) | trained).items()}
    if with_policy:
        configs["config.json" if grpo_seed is not None else "config.yaml"] = config
        rounds_1[f"policy ({experiment[1] if experiment else None})"] = first_round(grpo["rewards"])
    check_first_rounds(rounds_1, folder)
    split = json.loads((Path(manifest["data_dir"]) / "split.json").read_text())
    main = next(name for name, parts in split.items() if "rl" in parts)
    renamed = dict(zip(("sft", "policy"), model_names(arm)))
    copies = []
    for model, result in results.items():
        model = renamed.get(model, model)
        copies.append((model, folder / f"{main}-{model}.jsonl.gz", Path(result["completions"])))
        for name, held in result.get("held_out", {}).items():
            copies.append((model, folder / f"{name}-{model}.jsonl.gz", Path(held["completions"])))
    check_incoming(copies, renamed["sft"], list(same_as))
    folder.mkdir(parents=True, exist_ok=True)
    for model, to, src in copies:
        if not (model == renamed["sft"] and to.is_file()):  # the same lines (checked): the committed file stays
            shutil.copyfile(src, to)
    (folder / "split.json").write_text(json.dumps(split))
    for name, text in configs.items():
        (folder / name).write_text(text)
    summary = before | {
        "run": manifest["run_name"],
        "grpo_seed": grpo_seed if experiment is None else experiment[2],
        "arm": arm or None,
        "scores": score(folder, arm=arm),
        "controls": before.get("controls", {}) | trained,
    }
    if seed_models:
        summary["seed_reward_models"] = seed_models
    if with_policy:
        summary |= policy_fields(manifest, grpo, quality, experiment, alone=grpo_seed is None and not experiment)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def policy_fields(manifest: dict, grpo: dict, reward_models: dict, experiment, alone: bool) -> dict:
    """What a record says of its policy: its GRPO (steps, spread, curve, seconds), its reward models,
    the run's stages' seconds and peak memory (``alone``: the run itself; else the seed's GRPO stage's)."""
    from flows.experiment_table import run_staleness

    drawn = [1 - r["frac_reward_zero_std"] for r in grpo["rewards"]]  # of every group sampled
    kept = [1 - r["frac_batch_zero_std"] for r in grpo["rewards"]]  # of the groups trained on, after redraws
    return {
        "variant": experiment[1] if experiment else None,
        "reward_models": reward_models,
        "grpo": {
            "steps": grpo["steps"],
            "best_step": grpo["best_step"],
            "best_val_accuracy": grpo["best_val_accuracy"],
            "groups_with_spread": {"sampled": sum(drawn) / len(drawn), "trained": sum(kept) / len(kept)}
            if drawn
            else None,
            "curve": grpo["curve"],
            "staleness": run_staleness(grpo["rewards"]),
            "round_1": first_round(grpo["rewards"]),
        },
        "grpo_train_s": grpo["train_s"],
        "stages_s": manifest["profile"]["stages_s"],
        "wall_s": manifest["profile"]["wall_s"],
        "peak_rss_mib": peak_rss(manifest) if alone else {"grpo": grpo.get("peak_memory", {}).get("rss_mib")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, nargs="?")
    ap.add_argument("folder", type=Path, nargs="?")
    ap.add_argument("--grpo-seed", type=int, help="first train GRPO again from the run's SFT model with this seed")
    ap.add_argument("--grpo-steps", type=int, help="--grpo-seed: this many GRPO steps instead of the recipe's")
    ap.add_argument("--policy", type=Path, help="evaluate this model beside the run's SFT model (with --recipe)")
    ap.add_argument("--recipe", type=Path, help="--policy: the recipe whose evaluation settings apply")
    ap.add_argument("--experiment", type=Path, help="a finished experiment on the run (with --variant and --seed)")
    ap.add_argument("--variant", help="--experiment: the variant to record (its files: policy)")
    ap.add_argument(
        "--controls", default="", help="--experiment: comma-separated variants recorded beside it, each under its name"
    )
    ap.add_argument("--seed", type=int, default=0, help="--experiment: its seed (0 = the recipe's)")
    ap.add_argument(
        "--same-sft-as",
        type=Path,
        action="append",
        default=[],
        help="a committed folder whose SFT completions the run's must equal, line for line (repeatable)",
    )
    ap.add_argument("--check", action="store_true", help="recompute the scores of a committed folder alone")
    ap.add_argument("--arm", default="", help="the run's models are sft-ARM and policy-ARM (record, --check)")
    ap.add_argument(
        "--paired",
        nargs=2,
        action="append",
        metavar="FOLDER:MODEL",
        help="one seed's two committed models, the first minus the second (repeat for each seed)",
    )
    args = ap.parse_args()
    if args.paired:
        given = {k: v for k, v in vars(args).items() if k != "paired" and v not in (None, False, "", 0, [])}
        others = [k.upper() if k in ("run_dir", "folder") else f"--{k.replace('_', '-')}" for k in given]
        if others:
            ap.error(f"--paired reads committed folders alone: {', '.join(others)} do not go with it")
        try:
            print(json.dumps(paired([tuple(p) for p in args.paired]), indent=1))
        except ValueError as e:
            ap.error(str(e))
        return
    if args.folder is None:  # one positional: the folder (--check), else the run's
        args.run_dir, args.folder = None, args.run_dir
    if args.folder is None or (args.run_dir is None and not args.check):
        ap.error("a run and a folder to record it in are needed (or --check FOLDER)")
    if args.policy and not args.recipe:
        ap.error("--policy needs --recipe")
    if args.variant and not args.experiment:
        ap.error("--variant goes with --experiment")
    if args.experiment and not (args.variant or args.controls):
        ap.error("--experiment needs --variant, --controls or both")
    controls = tuple(c for c in args.controls.split(",") if c)
    if controls and not args.experiment:
        ap.error("--controls goes with --experiment")
    if {"sft", "policy"} & set(controls):
        ap.error("--controls: sft and policy name the run's SFT model and the variant")
    if args.same_sft_as and args.check:
        ap.error("--same-sft-as goes with recording a run, not --check")
    if args.grpo_steps is not None and args.grpo_seed is None:
        ap.error("--grpo-steps goes with --grpo-seed")
    experiment = (args.experiment, args.variant, args.seed) if args.experiment else None
    result = (
        score(args.folder, args.arm)
        if args.check
        else record(
            args.run_dir,
            args.folder,
            args.grpo_seed,
            args.policy,
            args.recipe,
            experiment,
            args.grpo_steps,
            controls,
            args.arm,
            tuple(args.same_sft_as),
        )
    )
    if not args.check:  # what a person reads after `make real`: the scores, GRPO's spread, each stage's seconds
        grpo = result.get("grpo") or {}  # none yet where a seed's controls were recorded first
        result = {k: result.get(k) for k in ("scores", "grpo_train_s", "stages_s", "wall_s", "peak_rss_mib")} | {
            "groups_with_spread": grpo.get("groups_with_spread"),
            "best_step": grpo.get("best_step"),
            "reward_models": result.get("reward_models"),
            "arm": result.get("arm"),
            "controls": result.get("controls"),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

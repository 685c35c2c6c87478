"""Reward-model data stage: sample solutions from the SFT policy, label outcomes and steps.

Writes three Hugging Face ``DatasetDict`` folders (``train`` / ``test`` split by question) that
other tools read: ``pairs`` (TRL ``prompt``/``chosen``/``rejected``), ``steps`` (TRL stepwise
``prompt``/``completions``/``labels`` plus ``soft_labels`` and ``exact_labels``) and
``solutions`` (``prompt``/``completion``/``correct``: the ORM's pointwise data and its AUC), every row
tagged with its round of origin. The training split also holds the previous round's GRPO rollouts.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpo_core.config import PipelineConfig, RewardDataConfig
from grpo_core.data import Example, prompt_text, read_split
from grpo_core.digests import digest_dir
from grpo_core.lm.modeling import load_model
from grpo_core.lm.policy import generate
from grpo_core.lm.runtime import place, set_compute
from grpo_core.manifests import write_manifest
from grpo_core.rewards import rollout_log
from grpo_core.rewards.labels import Completer, Sampled, label_agreement, outcome_pairs, sample_solutions, step_rows
from grpo_core.rewards.replay import ORIGIN, tag_rows, write_version
from grpo_core.rewards.steps import planted_error
from grpo_core.seeds import batch_seed, round_seed
from grpo_core.stages.outputs import arrow_digest
from grpo_core.tracking import MetricLogger, NullLogger
from grpo_core.training.trainer import PROGRESS_EVERY_S, Stopwatch, time_left

DATASETS = ("pairs", "steps", "solutions")
COLUMNS = {
    "pairs": ("prompt", "chosen", "rejected", ORIGIN),
    "steps": ("prompt", "completions", "labels", "soft_labels", "exact_labels", "completion", ORIGIN),
    "solutions": ("prompt", "completion", "correct", ORIGIN),
}


def run_reward_data(
    cfg: PipelineConfig,
    data_dir: Path,
    policy_dir: str | Path,
    out_dir: Path,
    logger: MetricLogger | None = None,
    round_: int = 1,
    rollouts: str | Path | None = None,
) -> dict:
    """Samples of the policy of RL round ``round_`` (the SFT model in round 1) on RL questions drawn
    for that round, labelled and split by question. ``rollouts``: the previous round's GRPO stage
    folder, whose checked rollouts of training questions join the training split
    (``reward_data.rollouts`` of them) as samples of round ``round_ - 1``."""
    logger = logger or NullLogger()
    rc = cfg.reward_data
    set_compute(cfg.threads)
    clock = Stopwatch()
    policy, tokenizer = load_model(policy_dir)
    place(policy, cfg.launch)
    heldout_pool, train_pool = question_pools(data_dir, rc)
    seed = round_seed(cfg.seed, round_)
    split_of = draw_questions(rc, heldout_pool, train_pool, seed)
    questions = split_of["test"] + split_of["train"]
    sampler = said_every(policy_completer(policy, tokenizer, rc, seed), f"reward_data, round {round_}", rc.batch_size)
    earlier = (
        rollout_samples(rollouts, {e.question for e in train_pool}, rc.rollouts, seed)
        if rollouts is not None and rc.rollouts != 0
        else []
    )
    labelled = Labelled()
    for split, examples in split_of.items():
        label_split(labelled, split, examples, sampler, rc, seed, round_, len(questions), earlier)
    manifest: dict = {
        "stage": "reward_data",
        "round": round_,
        "dir": str(out_dir),
        "questions": len(questions),
        "labeler": rc.labeler,
        "rollouts_from": str(rollouts) if earlier else None,
    }
    manifest |= save_datasets(labelled.tables, out_dir) | save_pass_rates(labelled.rates, out_dir)
    metrics, rates = labelled.metrics, labelled.rates
    metrics["frac_questions_solved_sometimes"] = sum(0 < r["right"] < r["samples"] for r in rates) / len(rates)
    metrics["time/wall_s"] = clock.elapsed
    logger.log_metrics(metrics)
    for name in DATASETS:
        logger.log_input(
            name=f"reward_data/{name}",
            digest=manifest[f"{name}_digest"],
            source=manifest[f"{name}_dir"],
            rows={s: len(labelled.tables[name][s]) for s in ("train", "test")},
        )
    return write_manifest(out_dir, {**manifest, "metrics": metrics, "wall_s": round(clock.elapsed, 1)})


@dataclass
class Labelled:
    """What the splits' samples have given so far: each dataset's rows by split, the metrics, and
    each question's pass rate under this round's policy (GRPO's curriculum)."""

    tables: dict[str, dict[str, list[dict]]] = field(default_factory=lambda: {name: {} for name in DATASETS})
    metrics: dict[str, float] = field(default_factory=dict)
    rates: list[dict] = field(default_factory=list)


def question_pools(data_dir: Path, rc: RewardDataConfig) -> tuple[list[Example], list[Example]]:
    """(held-out, training) questions of the RL pool (``heldout_split``); an error where there are
    too few distinct questions for both."""
    heldout_pool, train_pool = heldout_split(set(read_split(data_dir, "rl")), rc.heldout_fraction)
    if not train_pool:
        raise ValueError(
            f"{data_dir / 'rl.jsonl'}: {len(heldout_pool)} distinct question(s) cannot be split into "
            f"training and held-out reward data; raise reward_data.questions (and the RL pool)"
        )
    return heldout_pool, train_pool


def draw_questions(
    rc: RewardDataConfig, heldout_pool: list[Example], train_pool: list[Example], seed: int
) -> dict[str, list[Example]]:
    """The round's questions by split: ``reward_data.questions`` of them, the held-out fraction drawn
    from the held-out pool (at least one) and the rest from the training pool."""
    rng = random.Random(seed)
    n_questions = min(rc.questions, len(heldout_pool) + len(train_pool))
    n_test = min(len(heldout_pool), max(1, round(n_questions * rc.heldout_fraction)))
    return {
        "test": rng.sample(heldout_pool, n_test),
        "train": rng.sample(train_pool, min(len(train_pool), n_questions - n_test)),
    }


def label_split(
    out: Labelled,
    split: str,
    examples: list[Example],
    sampler: Callable[[str], Completer],
    rc: RewardDataConfig,
    seed: int,
    round_: int,
    n_questions: int,
    earlier: list[Sampled],
) -> None:
    """One split's questions sampled and labelled into ``out``: their pass rates, the rows of every
    dataset (the training split's extras too: ``training_extras``) and the split's metrics.
    ``sampler``: the stage's completer by what it completes (``said_every``)."""
    shown = {"test": "held-out", "train": "training"}[split]
    samples = sample_solutions(sampler(f"{shown} solutions"), examples, rc.samples_per_question)
    out.rates += [
        {"question": s.example.question, "gold": s.example.gold, "right": sum(s.correct), "samples": len(s.correct)}
        for s in samples
    ]
    share = 1.0 if rc.step_questions is None else min(1.0, rc.step_questions / n_questions)
    metrics = out.metrics
    rollouts = sampler(f"{shown} Monte-Carlo rollouts")
    steps = step_labels(samples[: max(1, round(len(samples) * share))], rollouts, rc, split, metrics)
    pairs = outcome_pairs(samples, rc.max_pairs_per_question, seed)
    # Held-out rows keep every sample: the AUC is over what the policy actually samples.
    solutions = solution_rows(samples, distinct=rc.distinct_solutions and split == "train")
    flags = [ok for s in samples for ok in s.correct]
    metrics[f"{split}/sample_accuracy"] = sum(flags) / len(flags)
    metrics[f"{split}/frac_questions_mixed"] = sum(0 < sum(s.correct) < len(s.correct) for s in samples) / len(samples)
    if rc.labeler == "mc":  # (exact labels agree with themselves)
        metrics.update({f"{split}/{k}": v for k, v in label_agreement(steps).items()})
    tables = out.tables
    tables["pairs"][split] = tag_rows(pairs, round_)
    tables["steps"][split] = tag_rows(steps, round_)
    tables["solutions"][split] = tag_rows(solutions, round_)
    if split == "train":
        for name, rows in training_extras(rc, examples, earlier, seed, round_, metrics).items():
            tables[name][split] += rows
    for name in DATASETS:
        metrics[f"{split}/n_{name}"] = len(tables[name][split])


def step_labels(
    labelled: list[Sampled], complete: Completer, rc: RewardDataConfig, split: str, metrics: dict[str, float]
) -> list[dict]:
    """The step rows of the ``labelled`` samples, and what their labels cost in ``metrics``: the
    Monte-Carlo rollouts (none where no solution has a second step) and step labels per second."""
    rolled, started = [0], time.perf_counter()

    def counted(prompts: list[str]) -> list[str]:
        rolled[0] += len(prompts)
        return complete(prompts)

    steps = step_rows(labelled, counted if rc.labeler == "mc" else None, rc.mc_rollouts, rc.step_separator)
    metrics[f"{split}/mc_rollouts"] = rolled[0]
    metrics[f"perf/{split}/step_labels_per_s"] = sum(len(r["labels"]) for r in steps) / max(
        time.perf_counter() - started, 1e-9
    )
    return steps


def save_datasets(tables: dict[str, dict[str, list[dict]]], out_dir: Path) -> dict:
    """Each dataset as a ``DatasetDict`` folder under ``out_dir``; its folder and digest by name
    (``<name>_dir``, ``<name>_digest``) for the manifest."""
    from datasets import Dataset, DatasetDict  # deferred: a heavy import, for the start-up time of other stages

    out: dict = {}
    for name in DATASETS:
        path = out_dir / name
        DatasetDict(
            {
                s: Dataset.from_list(rows) if rows else Dataset.from_dict({c: [] for c in COLUMNS[name]})
                for s, rows in tables[name].items()
            }
        ).save_to_disk(
            str(path), num_shards={s: 1 for s in tables[name]}
        )  # datasets cannot reload an empty split saved in 0 shards
        out[f"{name}_dir"] = str(path)
        out[f"{name}_digest"] = arrow_digest(path)
    return out


def save_pass_rates(rates: list[dict], out_dir: Path) -> dict:
    """Each question's pass rate, one JSON line each, in ``out_dir/pass_rates``; its folder and
    digest for the manifest."""
    rates_dir = out_dir / "pass_rates"
    rates_dir.mkdir(parents=True, exist_ok=True)
    (rates_dir / "pass_rates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rates), encoding="utf-8")
    return {"pass_rates": str(rates_dir), "pass_rates_digest": digest_dir(rates_dir)}


def policy_completer(policy, tokenizer, rc: RewardDataConfig, seed: int) -> Completer:
    """Sampling from the policy in batches; every call draws from a fresh, reproducible seed."""
    calls = [0]

    def complete(prompts: list[str]) -> list[str]:
        out: list[str] = []
        for start in range(0, len(prompts), rc.batch_size):
            chunk = prompts[start : start + rc.batch_size]
            calls[0] += 1
            out += generate(
                policy,
                tokenizer,
                chunk,
                max_new_tokens=rc.max_new_tokens,
                temperatures=[rc.temperature] * len(chunk),
                seed=batch_seed(seed, calls[0]),
            ).texts
        return out

    return complete


def planted_samples(examples: list[Example], n: int, seed: int) -> list[Sampled]:
    """``n`` solutions with one planted error (``steps.planted_error``) per arithmetic question."""
    rng = random.Random(f"planted-{seed}")
    out = []
    for e in examples:
        texts = [planted_error(e.question, rng) for _ in range(n)]
        if texts[0] is None:
            raise ValueError("reward_data.planted_errors works only for the arithmetic task; set it to 0")
        out.append(Sampled(e, texts, [False] * n))
    return out


def solution_rows(samples: list[Sampled], distinct: bool = False) -> list[dict]:
    """Every sampled solution with its verdict (the ORM's pointwise data and its AUC); ``distinct``:
    each different solution of a group once (a right answer is often sampled 8 times alike)."""
    return [
        {"prompt": prompt_text(s.example.question), "completion": c, "correct": ok}
        for s in samples
        for c, ok in (dict(zip(s.completions, s.correct)).items() if distinct else zip(s.completions, s.correct))
    ]


def heldout_split(pool: set[Example], fraction: float) -> tuple[list[Example], list[Example]]:
    """(held-out, training) questions of the RL pool for the reward models, the same in every round:
    whole clusters of near-duplicate questions (``benchmarks.clusters``, the data split's own) to a
    side, in the order of a hash of their text, each to the held-out side while it fits within
    ``fraction`` of the distinct questions (the first always). No held-out question then has a
    near-duplicate among the training ones, and a later round's held-out samples are never questions
    that an earlier round's reward model trained on (or that the replay brings back), so before/after
    accuracies measure generalisation."""
    from grpo_core.benchmarks import clusters

    def order(e: Example) -> tuple:  # the same order from any order of the pool (MAWPS repeats texts)
        return hashlib.sha256(e.question.encode()).hexdigest(), e.gold, e.idx if e.idx is not None else -1

    questions = sorted(pool, key=order)
    members: dict[int, list[Example]] = {}
    for e, c in zip(questions, clusters([e.question for e in questions])):
        members.setdefault(c, []).append(e)  # a cluster's place: its first member's
    n = max(1, round(len(questions) * fraction))
    held: list[Example] = []
    train: list[Example] = []
    for group in members.values():
        (held if not held or len(held) + len(group) <= n else train).extend(group)
    return held, train


def rollout_samples(grpo_dir: str | Path, allowed: set[str], n: int | None, seed: int) -> list[Sampled]:
    """A GRPO stage's checked rollouts as groups (one per step and question), keeping only
    questions in ``allowed`` (the reward models' training questions) and a random ``n`` of the
    completions (None: all): its rollouts of held-out questions never reach training."""
    rows = [r for r in rollout_log.read_logs(grpo_dir) if r["question"] in allowed]
    if n is not None and n < len(rows):
        rows = [rows[i] for i in sorted(random.Random(f"rollouts-{seed}").sample(range(len(rows)), n))]
    groups: dict[tuple[int, str, str], Sampled] = {}
    for r in rows:
        s = groups.setdefault((r["step"], r["question"], r["gold"]), Sampled(Example(r["question"], r["gold"]), [], []))
        s.completions.append(r["completion"])
        s.correct.append(bool(r["correct"]))
    return list(groups.values())


def training_extras(
    rc: RewardDataConfig,
    examples: list[Example],
    earlier: list[Sampled],
    seed: int,
    round_: int,
    metrics: dict[str, float],
) -> dict[str, list[dict]]:
    """Rows only the training split gets, per dataset: solutions with planted errors (negatives
    that differ from a right solution only where wrong) and the previous round's GRPO rollouts
    (samples of round ``round_ - 1``; their steps labelled only by the exact checker, which is free
    where Monte-Carlo labels would cost generations). Their counts go into ``metrics``."""
    out: dict[str, list[dict]] = {name: [] for name in DATASETS}
    if rc.planted_errors:
        planted = planted_samples(examples, rc.planted_errors, seed)
        out["solutions"] += tag_rows(solution_rows(planted, rc.distinct_solutions), round_)
        out["steps"] += tag_rows(step_rows(planted, None, 0, rc.step_separator), round_)
        metrics["train/planted_solutions"] = sum(len(s.completions) for s in planted)
    if earlier:
        out["pairs"] += tag_rows(outcome_pairs(earlier, rc.max_pairs_per_question, seed), round_ - 1)
        out["solutions"] += tag_rows(solution_rows(earlier, rc.distinct_solutions), round_ - 1)
        if rc.labeler == "exact":
            out["steps"] += tag_rows(step_rows(earlier, None, 0, rc.step_separator), round_ - 1)
        metrics["train/rollout_solutions"] = sum(len(s.completions) for s in earlier)
    return out


def said_every(complete: Completer, what: str, batch: int) -> Callable[[str], Completer]:
    """``complete`` (prompts -> completions) by name: ``said_every(...)(label)`` is ``complete`` that
    prints, for each call, how many of its prompts it has completed (``label``: e.g. "held-out
    solutions", "training Monte-Carlo rollouts"), how fast and the time that call has left: after
    its first batch (the stage speaks within seconds) and then every ``PROGRESS_EVERY_S``. It hands
    ``complete`` one ``batch`` of prompts at a time (``policy_completer``'s own batches: the same
    calls, so the same seeds), so a long call (a whole split's samples) speaks between its batches."""

    def named(label: str) -> Completer:
        def counted(prompts: list[str]) -> list[str]:
            out: list[str] = []
            start, said = time.perf_counter(), -math.inf
            for first in range(0, len(prompts), batch):
                out += complete(prompts[first : first + batch])
                if time.perf_counter() - said >= PROGRESS_EVERY_S:
                    said = time.perf_counter()
                    rate = len(out) / (said - start)
                    left = f", {time_left((len(prompts) - len(out)) / rate)}" if len(out) < len(prompts) else ""
                    where = f"{len(out):,} of {len(prompts):,} {label}, {rate:.1f}/s{left}"
                    print(f"[{what}] {where}", file=sys.stderr, flush=True)
            return out

        return counted

    return named


def run_replay(
    reward_data: dict[str, str], previous: str | None, round_: int, out_dir: Path, logger: MetricLogger | None = None
) -> dict:
    """Replay buffer version ``round_``: version ``previous`` plus this round's fresh training rows
    of each dataset in ``reward_data`` (name -> the reward-data stage's folder)."""
    from datasets import load_from_disk

    logger = logger or NullLogger()
    fresh = {name: load_from_disk(path)["train"].to_list() for name, path in reward_data.items()}
    contents = write_version(previous, fresh, round_, Path(out_dir), COLUMNS)
    digest = arrow_digest(Path(out_dir))
    for kind, c in contents.items():
        logger.log_input(
            name=f"replay/{Path(out_dir).name}/{kind}",
            digest=digest,
            source=str(Path(out_dir) / kind),
            rows={"total": c["rows"], **{f"from_round_{r}": n for r, n in c["by_round"].items()}},
        )
        logger.log_metrics({f"buffer/{kind}_rows": c["rows"]})
    return write_manifest(
        Path(out_dir), {"stage": "replay", "dir": str(out_dir), "round": round_, "contents": contents, "digest": digest}
    )

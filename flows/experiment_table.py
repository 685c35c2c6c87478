"""The table and report of the experiment flow (``flows/experiment.py``): a row per variant from
its seeds' runs and evaluations (accuracy, paired gains with 95% intervals, maj@K / pass@K, the
reward models' quality and staleness, memory and speed), the manifest, the Markdown table and the
Prefect report."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from flows.experiment_setup import Run, Setup, model_key
from flows.reports import figure_source, warning_line
from flows.variants import BASELINE, UNIFORM, VARIANTS
from grpo_core.config import PipelineConfig
from grpo_core.rewards.gate import gate_failure
from grpo_core.stages.outputs import StageOutput
from grpo_core.stages.rl_records import staleness
from grpo_core.stats import mean_std, seed_interval


def reward_model_quality(chains: list[dict[str, StageOutput]], uses: tuple[str, ...]) -> str:
    """The held-out quality of the reward models a variant trains on, as a short string: mean over
    the seeds' own reward models where each seed has its own, beside the SFT model's likelihood on
    the same rows (the zero-training baseline) and the difference from it paired by question."""

    def mean(kind: str, part: str, metric: str) -> float:
        values = [getattr(first[kind], part).get(metric, float("nan")) for first in chains]
        return sum(values) / len(values)

    parts = []
    for kind, pooled, name in (("orm", "auc", "AUC"), ("prm", "step_auc", "step AUC")):
        if kind in uses:
            sft = mean(kind, "baseline", "within_question_auc")
            gain = mean(kind, "heldout", "within_question_auc_minus_baseline")  # paired by question
            parts.append(
                f"{kind.upper()} within-question AUC {mean(kind, 'heldout', 'within_question_auc'):.3f} "
                f"(pooled {name} {mean(kind, 'heldout', pooled):.3f}"
                + (f"; SFT likelihood {sft:.3f}" if sft == sft else "")
                + (f", paired difference {gain:+.3f}" if gain == gain else "")
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


def run_staleness(rewards: list[dict], window: int = 20) -> dict:
    """One run's reward models' staleness (its ``rewards`` rows, one a GRPO step): per learned reward
    model the run trained on, its within-question AUC against the checker on the policy's own
    rollouts, pooled over up to ``window`` steps at the start, the middle and the end of the run
    (``_window``: none straddles a round boundary or overlaps another), with the mixed groups it was
    measured on; and the checker's accuracy on those rollouts. Keys ``<metric>_<when>``."""
    out: dict = {}
    for kind in ("orm", "prm"):
        if not any(p.get(f"{kind}_mixed_groups") for p in rewards):
            continue
        for when in ("start", "middle", "end"):
            steps = _window(rewards, when, window)
            part = staleness(steps)
            for metric, key in (
                (f"{kind}_within_auc", f"staleness/{kind}_within_auc"),
                ("checker_accuracy", "staleness/checker_accuracy"),
            ):
                if key in part:
                    out[f"{metric}_{when}"] = part[key]
            out[f"{kind}_mixed_groups_{when}"] = int(sum(p.get(f"{kind}_mixed_groups", 0) for p in steps))
    return out


def staleness_columns(runs: list[Run], window: int = 20) -> dict:
    """``run_staleness`` over a variant's seeds: each AUC and accuracy the mean over the seeds that
    measured it, the mixed groups summed; a reward model only where every seed trained on it."""
    per_run = [run_staleness(r.rewards, window) for r in runs]
    kinds = [k for k in ("orm", "prm") if per_run and all(f"{k}_mixed_groups_start" in p for p in per_run)]
    out = {}
    for kind in kinds:
        for when in ("start", "middle", "end"):
            for metric in (f"{kind}_within_auc", "checker_accuracy"):
                if values := [p[f"{metric}_{when}"] for p in per_run if f"{metric}_{when}" in p]:
                    out[f"{metric}_{when}_mean"] = round(mean_std(values)[0], 4)
            out[f"{kind}_mixed_groups_{when}"] = sum(p[f"{kind}_mixed_groups_{when}"] for p in per_run)
    return out


def position_columns(runs: list[Run]) -> dict:
    """The mean advantage by step place in checker-silent groups (``grpo.position_metrics``: 0 for an
    estimator without position bias), over each run's steps that had such a step, mean over seeds."""
    out = {}
    for where in ("first", "middle", "last", "answer"):
        key = f"silent_{where}"
        per_run = [[p[key] for p in r.rewards if key in p and p[key] == p[key]] for r in runs]  # NaN: none
        means = [sum(v) / len(v) for v in per_run if v]
        if means:
            out[f"silent_adv_{where}_mean"] = round(mean_std(means)[0], 4)
    return out


def _window(steps: list[dict], when: str, width: int) -> list[dict]:
    """Up to ``width`` steps of one round, never overlapping the run's other windows (one round: at
    most a third of it; several: at most half the shortest): the run's first, its middle (one round:
    the middle steps; several: the first steps of the last round, right after the last retraining)
    or its last."""
    rounds: dict[int, list[dict]] = {}
    for p in steps:
        rounds.setdefault(p.get("round", 1), []).append(p)
    parts = list(rounds.values())
    windows = 3 if len(parts) == 1 else 2  # how many windows the shortest round holds
    if not parts or (when == "middle" and min(map(len, parts)) < windows):
        return []  # too short for a middle apart from the others
    width = min(width, max(1, min(map(len, parts)) // windows))
    if when == "start":
        return parts[0][:width]
    if when == "end":
        return parts[-1][-width:]
    if len(parts) > 1:
        return parts[-1][:width]
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
    row |= training_columns(name, vcfg, runs)
    row |= gain_columns(name, accs, sft_acc, last or {})
    row |= staleness_columns(runs)
    row |= gradient_columns(runs, vcfg.grpo.questions_per_step)
    row |= position_columns(runs)
    for key in [f"{m}@{k}" for m in ("maj", "pass")] if k > 1 else []:
        mean, std = mean_std([sampled[model_key(s, name, r)][key] for r in runs])
        row |= {f"{key}_mean": round(mean, 4), f"{key}_std": round(std, 4)}
    peaks = {m: [r.peak_memory[m] for r in runs if m in r.peak_memory] for m in ("rss_mib", "cuda_mib")}
    row |= {f"peak_{m}_mean": round(mean_std(v)[0], 1) for m, v in peaks.items() if v}
    uses = () if VARIANTS[name].grpo is None else vcfg.grpo.reward_models_used
    w = quality_warnings(s, runs, chains, uses)
    warned = {"quality_warnings": w} if w else {}
    return (
        row
        | warned
        | {"reward_model": reward_model_quality(chains or [s.first], uses)}
        | cost_columns(runs, uses)
        | {"per_seed": [round(a, 4) for a in accs[name]]}
    )


def training_columns(name: str, vcfg: PipelineConfig, runs: list[Run]) -> dict:
    """How a variant trained: the LoRA rank where it trained an adapter, and the step keep-best
    published per seed (a GRPO variant)."""
    row = {}
    if (lora := vcfg.sft.lora if VARIANTS[name].grpo is None else vcfg.grpo.lora) is not None:
        row["lora_rank"] = lora.rank  # an adapter trained, not every weight: the table says so
    if VARIANTS[name].grpo is not None:
        row["kept_steps"] = [r.kept_step for r in runs]  # keep-best's choice per seed; 0: the stage's own start
    return row


def gain_columns(name: str, accs: dict[str, list[float]], sft_acc: float, last: dict[str, list[float]]) -> dict:
    """The last policies' accuracy and gain over SFT (where ``last`` has the variant), then the gains
    over continued SFT, the uniform draw and the variants compared with, each again between the
    policies the runs ended with where ``last`` has either (``variant_row``)."""
    n = len(accs[name])
    row = {}
    if (mine := last.get(name)) is not None:
        row |= {"last_accuracy_mean": round(mean_std(mine)[0], 4), "last_per_seed": [round(a, 4) for a in mine]}
        row |= gain("last_gain_over_sft", mine, [sft_acc] * n)
    for other in dict.fromkeys((BASELINE, UNIFORM, *VARIANTS[name].against)):
        if other == name or len(accs.get(other, ())) != n:
            continue
        row |= gain(f"gain_over_{other}", accs[name], accs[other])
        if name in last or other in last:
            row |= gain(f"last_gain_over_{other}", last.get(name, accs[name]), last.get(other, accs[other]))
    return row


def gradient_columns(runs: list[Run], batch: int) -> dict:
    """Where rewards are sparse: how often a step, and how many of its groups, carried a policy
    gradient, and how many groups a step drew (``batch``: what a step draws without redraws)."""
    zero = [
        [p["frac_batch_zero_std"] for p in r.rewards]
        for r in runs
        if r.rewards and "frac_batch_zero_std" in r.rewards[0]
    ]
    if not zero:
        return {}
    drawn = [sum(p.get("groups_drawn", batch) for p in r.rewards) / len(r.rewards) for r in runs if r.rewards]
    return {
        "steps_with_gradient_mean": round(mean_std([sum(z < 1 for z in zs) / len(zs) for zs in zero])[0], 4),
        "groups_with_gradient_mean": round(mean_std([1 - sum(zs) / len(zs) for zs in zero])[0], 4),
        "groups_drawn_per_step_mean": round(mean_std(drawn)[0], 2),
    }


def quality_warnings(
    s: Setup, runs: list[Run], chains: list[dict[str, StageOutput]] | None, uses: tuple[str, ...]
) -> list[str]:
    """The failed quality gates of the round-1 reward models a variant trains on, then those of the
    reward models its runs retrained. Where each seed has its own round-1 reward models (``chains``),
    every failure is said with its seed (two seeds may fail alike)."""
    own = [(f"seed {r.seed - s.cfg.seed}: ", first) for r, first in zip(runs, chains, strict=True)] if chains else []
    return [label + sentence for label, first in own or [("", s.first)] for sentence in gate_warnings(first, uses)] + [
        w for r in runs for w in r.quality_warnings
    ]


def cost_columns(runs: list[Run], uses: tuple[str, ...]) -> dict:
    """What a variant's runs spent, mean over seeds: steps, speed, training seconds and those outside
    the budget, the updates and labels of the reward models it trained on, the retraining by stage."""
    return {
        "steps_mean": mean_std([r.steps for r in runs])[0],
        "steps_per_s_mean": round(mean_std([r.steps / max(r.train_s, 1e-9) for r in runs])[0], 3),
        "train_s_mean": round(mean_std([r.train_s for r in runs])[0], 1),
        "extra_s_mean": round(mean_std([r.extra_s for r in runs])[0], 1),
        **{
            f"{kind}_updates_mean": round(mean_std([r.reward_model_updates[kind] for r in runs])[0], 1)
            for kind in uses
            if all(kind in r.reward_model_updates for r in runs)
        },
        **({"reward_model_labels_mean": round(mean_std([r.reward_model_labels for r in runs])[0], 1)} if uses else {}),
        **{
            f"extra_{stage}_s_mean": round(mean_std([r.extra.get(stage, 0.0) for r in runs])[0], 1)
            for stage in sorted({k for r in runs for k in r.extra})
        },
    }


def table_rows(
    s: Setup,
    runs: dict[str, list[Run]],
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


def experiment_manifest(
    s: Setup,
    preset: str,
    rows: list[dict],
    runs: dict[str, list[Run]],
    ids: range,
    samples: int,
    results: dict,
    sampled: dict,
    out_root: Path,
    parent: str,
    lr: float | None,
    recipe: str | None,
    reward_models: str | None,
) -> dict:
    """The experiment's manifest before its figures: what ran and how, the rows and every run."""
    return {
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
        "run_name": s.cfg.run_name,
        "dir": str(out_root),
        "mlflow_run_id": parent,
        "grpo_lr": lr or s.cfg.grpo.lr,
        "recipe": recipe,
        "reward_models": reward_models,
        # Each variant's recipe as it trained (seed i: the recipe's seed + i).
        "recipes": {n: s.config(n, s.cfg.seed).model_dump(mode="json") for n in runs},
    }


def pts(r: dict, key: str, digits: int = 1) -> str:
    """A row's gain ``key`` (``gain``'s fields) in points with its interval; "-" where absent."""
    if key not in r:
        return "-"
    low, high = r[f"{key}_95ci"]
    return f"{100 * r[key]:+.{digits}f} " + (
        f"[{100 * low:+.{digits}f}, {100 * high:+.{digits}f}]" if low == low else "(one seed: no interval)"
    )


class Columns(NamedTuple):
    """Which optional columns an experiment's table has: the K of maj@K / pass@K (1: none), a
    uniform-draw comparison, the variants compared with, the last policies, groups with a gradient,
    the learned rewards' ranking over the run, the position metric."""

    k: int
    uniform: bool
    against: list[str]
    last: bool
    gradient: bool
    stale: list[str]
    bias: bool


PLACES = ("first", "middle", "last", "answer")


def columns(result: dict) -> Columns:
    rows = result["rows"]
    return Columns(
        k=result["samples"],
        uniform=any(f"gain_over_{UNIFORM}" in r for r in rows),
        against=[v for v in VARIANTS if v not in (BASELINE, UNIFORM) and any(f"gain_over_{v}" in r for r in rows)],
        last=any("last_accuracy_mean" in r for r in rows),
        gradient=any("groups_with_gradient_mean" in r for r in rows),
        stale=[kind for kind in ("orm", "prm") if any(f"{kind}_within_auc_start_mean" in r for r in rows)],
        bias=any(f"silent_adv_{w}_mean" in r for r in rows for w in PLACES),
    )


def format_table(result: dict) -> str:
    """The experiment's table in Markdown: accuracies and gains in points, memory in MiB."""
    c = columns(result)
    sampled = [f"maj@{c.k}", f"pass@{c.k}"] if c.k > 1 else []
    lines = [
        "| variant | seeds | test accuracy | vs SFT (95% CI) | vs continued SFT (95% CI) | "
        + ("vs uniform (95% CI) | " if c.uniform else "")
        + "".join(f"vs {v} (95% CI) | " for v in c.against)
        + "".join(f"{s} | " for s in sampled)
        + ("last step: accuracy, vs SFT (95% CI) | kept step per seed | " if c.last else "")
        + ("steps / groups with a gradient, groups drawn a step | " if c.gradient else "")
        + "".join(
            f"{k.upper()} within-question AUC on the policy's samples: start, middle, end (mixed groups) | "
            for k in c.stale
        )
        + ("mean advantage in checker-silent groups: first, middle, last step, answer line | " if c.bias else "")
        + "steps/s | peak RSS (MiB) | training s | reward model |",
        "|---" * (9 + len(sampled) + c.uniform + c.gradient + c.bias + len(c.against) + len(c.stale) + 2 * c.last)
        + "|",
    ]
    lines += ["| " + " | ".join(row_cells(r, c, sampled)) + " |" for r in result["rows"]]
    return "\n".join(lines)


def row_cells(r: dict, c: Columns, sampled: list[str]) -> list[str]:
    """One variant's cells in ``format_table``'s columns."""
    cells = [
        r["variant"] + (f" (LoRA rank {r['lora_rank']})" if "lora_rank" in r else ""),
        str(r["seeds"]),
        f"{100 * r['test_accuracy_mean']:.1f} ± {100 * r['test_accuracy_std']:.1f}",
        pts(r, "gain_over_sft"),
        pts(r, "gain_over_continued-sft"),
    ] + ([pts(r, f"gain_over_{UNIFORM}")] if c.uniform else [])
    cells += [pts(r, f"gain_over_{v}") for v in c.against]
    cells += [
        f"{100 * r[f'{s}_mean']:.1f}" + (f" ± {100 * r[f'{s}_std']:.1f}" if f"{s}_std" in r else "") for s in sampled
    ]
    if c.last:  # kept step 0 is the starting model republished: said so
        kept = r.get("kept_steps")
        cells += [
            f"{100 * r['last_accuracy_mean']:.1f}, {pts(r, 'last_gain_over_sft')}"
            if "last_accuracy_mean" in r
            else "= kept"
            if kept
            else "-",
            ", ".join("0 (its start, unchanged)" if k == 0 else str(k) for k in kept) if kept else "-",
        ]
    if c.gradient:
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
        for k in c.stale
    ]
    if c.bias:
        cells.append(", ".join(f"{r[k]:+.2f}" if (k := f"silent_adv_{w}_mean") in r else "-" for w in PLACES))
    extra = f" (+{r['extra_s_mean']:.0f} retraining)" if r.get("extra_s_mean") else ""
    return cells + [
        f"{r['steps_per_s_mean']:.2f}" if "steps_per_s_mean" in r else "-",
        f"{r['peak_rss_mib_mean']:.0f}" if "peak_rss_mib_mean" in r else "-",
        f"{r['train_s_mean']:.0f}{extra}" if "train_s_mean" in r else "-",
        r.get("reward_model", "-"),
    ]


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

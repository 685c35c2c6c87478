"""Figures of a finished run (matplotlib, no display needed). The pipeline logs them as images on its
MLflow run and shows them in its Prefect summary; the README shows ``run_figure``'s.

- ``test_accuracy`` (``accuracy_figure``): the SFT model and every RL round's policy on the test questions, with 95%
  intervals (and ``compare``'s variants, mean ± std over seeds, when the run has them);
- ``grpo_curves`` (``grpo_figure``): GRPO's reward, validation accuracy and KL over the steps of every round, the
  rounds one after another on one axis;
- ``reward_models`` (``reward_model_figure``): each reward model's held-out quality on the round's
  fresh samples, before and after its retraining (how stale it had become, and what retraining fixed);
- the ``study`` flow's (``study_figures``): validation accuracy over training time per variant with a band over
  seeds, maj@K / pass@K per variant, peak memory and steps per second.

    python -m grpo_core.figures runs/demo docs/figures/demo.png   # test accuracy + validation curves
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from grpo_core.manifests import read_manifest
from grpo_core.stages.rl_records import staleness

CURVES = [
    ("train/reward_mean", "reward (mean of the group)"),
    ("val/accuracy", "validation accuracy"),
    ("train/kl", "KL to the reference"),
]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _accuracy_with_interval(per_question: str) -> tuple[float, float]:
    """Accuracy and the half-width of its normal 95% interval over the questions."""
    correct = json.loads(Path(per_question).read_text())
    p = sum(correct) / len(correct)
    return p, 1.96 * math.sqrt(p * (1 - p) / len(correct))


def _histories(manifest: dict, key: str) -> list[tuple[int, list[int], list[float]]]:
    """(round, steps, values) of ``key`` in each round's GRPO stage, from the run's manifest (not from
    MLflow, which may not have them yet): its evaluations (``curve``) for a ``val/`` metric, else the
    metrics it recorded at every step (``rewards``, names without their ``train/``)."""
    out = []
    for r in manifest["rounds"]:
        grpo = r["stages"]["grpo"]
        evaluated = key.startswith(("val/", "staleness/"))
        points, name = (grpo.get("curve", []), key) if evaluated else (grpo.get("rewards", []), key.split("/")[-1])
        kept = sorted((p["step"], p[name]) for p in points if name in p)
        out.append((r["round"], [s for s, _ in kept], [v for _, v in kept]))
    return out


def _plot_rounds(ax, curves: list[tuple[int, list[int], list[float]]], scale: float = 1.0) -> None:
    """The rounds' curves one after another on the x axis, a colour each."""
    offset = 0
    for k, steps, values in curves:
        ax.plot(
            [offset + s for s in steps],
            [scale * v for v in values],
            marker="." if len(steps) < 60 else None,
            label=f"round {k}",
        )
        offset += max(steps, default=0)


def draw_test_accuracy(ax, manifest: dict, run_dir: Path | None = None) -> None:
    n = manifest["eval"]["sft"]["n"]
    bars = [("SFT", *_accuracy_with_interval(manifest["eval"]["sft"]["per_question"]))]
    bars += [
        (f"round {r['round']}", *_accuracy_with_interval(r["stages"]["eval"]["results"]["policy"]["per_question"]))
        for r in manifest["rounds"]
    ]
    compare = Path(run_dir or ".") / "compare" / "manifest.json"
    rows = (
        [r for r in json.loads(compare.read_text())["rows"] if r["variant"] != "sft"]
        if run_dir and compare.exists()
        else []
    )
    names = [b[0] for b in bars] + [r["variant"] for r in rows]
    ax.errorbar(
        range(len(bars)),
        [100 * b[1] for b in bars],
        yerr=[100 * b[2] for b in bars],
        fmt="o",
        color="tab:blue",
        capsize=4,
        label=f"this run (95% interval over {n} questions)",
    )
    if rows:
        ax.errorbar(
            range(len(bars), len(names)),
            [100 * r["test_accuracy_mean"] for r in rows],
            yerr=[100 * r["test_accuracy_std"] for r in rows],
            fmt="s",
            color="tab:orange",
            capsize=4,
            label=f"compare: one round from SFT, mean ± std over {rows[0]['seeds']} seeds",
        )
    ax.axhline(100 * bars[0][1], color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("greedy test accuracy (%)")
    spans = [(b[1] - b[2], b[1] + b[2]) for b in bars] + [
        (r["test_accuracy_mean"] - r["test_accuracy_std"], r["test_accuracy_mean"] + r["test_accuracy_std"])
        for r in rows
    ]
    low, high = 100 * min(a for a, _ in spans), 100 * max(b for _, b in spans)
    ax.set_ylim(low - 0.45 * (high - low) - 0.5, None)  # room for the legend below the points
    ax.legend(fontsize=8, loc="lower right")
    if gain := manifest.get("gain_over_sft"):
        ax.set_title(
            f"last round - SFT, paired over the questions: {100 * gain['mean']:+.2f} points "
            f"[{100 * gain['low']:+.1f}, {100 * gain['high']:+.1f}]",
            fontsize=9,
        )


def accuracy_figure(manifest: dict, run_dir: Path | None = None):
    fig, ax = _pyplot().subplots(figsize=(6, 4))
    draw_test_accuracy(ax, manifest, run_dir)
    fig.suptitle(f"{manifest['run_name']}: test accuracy, SFT and each RL round")
    fig.tight_layout()
    return fig


def grpo_figure(manifest: dict):
    # With a learned reward: its within-question AUC on the policy's rollouts at each evaluation (staleness).
    evaluated = {k for r in manifest["rounds"] for p in r["stages"]["grpo"].get("curve", []) for k in p}
    stale = [
        (f"staleness/{kind}_within_auc", f"{kind.upper()} within-question\nAUC on the rollouts")
        for kind in ("orm", "prm")
        if f"staleness/{kind}_within_auc" in evaluated
    ]
    curves = CURVES + stale
    fig, axes = _pyplot().subplots(len(curves), 1, figsize=(7, 7 + 2 * len(stale)), sharex=True)
    for ax, (key, label) in zip(axes, curves):
        _plot_rounds(ax, _histories(manifest, key))
        ax.set_ylabel(label, fontsize=9)
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("GRPO step (rounds one after another)")
    fig.suptitle(f"{manifest['run_name']}: GRPO, every round")
    fig.tight_layout()
    return fig


def reward_model_figure(manifest: dict):
    """None when no round trained a reward model."""
    from grpo_core.stages.reward_model import KINDS  # deferred: the stage's module imports torch and transformers

    kinds = sorted({kind for r in manifest["rounds"] for kind in r.get("reward_models", {})})
    if not kinds:
        return None
    fig, axes = _pyplot().subplots(1, len(kinds), figsize=(5 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        key = KINDS[kind].gate_metric
        rounds = [r for r in manifest["rounds"] if kind in r.get("reward_models", {})]
        bars = (
            ("before", -0.25, "tab:grey", "before retraining"),
            ("after", 0.0, "tab:green", "after retraining"),
            ("baseline", 0.25, "tab:orange", "SFT model's own likelihood (untrained)"),
        )
        for when, shift, color, label in bars:
            ax.bar(
                [r["round"] + shift for r in rounds],
                [r["reward_models"][kind].get(when, {}).get(key, math.nan) for r in rounds],
                width=0.25,
                color=color,
                label=label,
            )
        gate = next(
            (r["reward_models"][kind]["quality_gate"] for r in rounds if r["reward_models"][kind].get("quality_gate")),
            {},
        )
        ax.axhline(0.5, color="black", lw=0.8, ls=":", label="chance")
        if gate:
            ax.axhline(gate["threshold"], color="tab:red", lw=0.8, ls="--", label="quality gate")
        ax.set_xticks([r["round"] for r in rounds], [f"round {r['round']}" for r in rounds])
        values = [
            r["reward_models"][kind].get(w, {}).get(key, 1.0) for r in rounds for w in ("before", "after", "baseline")
        ]
        values = [v for v in values if v == v]  # NaN: no question with right and wrong solutions
        ax.set_ylim(min([0.3, *values]) - 0.05, 1.0)
        ax.set_title(f"{kind.upper()}: held-out {key.replace('_', ' ')} on the round's fresh samples", fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)  # below: the bars reach 1
    fig.tight_layout()
    return fig


def pipeline_figures(manifest: dict, run_dir: Path | None = None) -> dict:
    """The pipeline run's figures by name (``reward_models`` only when the run trained one)."""
    figures = {
        "test_accuracy": accuracy_figure(manifest, run_dir),
        "grpo_curves": grpo_figure(manifest),
        "reward_models": reward_model_figure(manifest),
    }
    return {name: fig for name, fig in figures.items() if fig is not None}


def _at(curve: list, grid: list[float]) -> list[float]:
    """A run's accuracy at each grid time: its last evaluation at or before it (NaN before the first)."""
    out, i, value = [], 0, math.nan
    for t in grid:
        while i < len(curve) and curve[i][0] <= t + 1e-9:
            value, i = curve[i][1], i + 1
        out.append(value)
    return out


def draw_accuracy_over_time(ax, study: dict) -> None:
    """Validation accuracy against training time, mean over seeds with a ± std band (Figure 5's form).
    On a budget of steps the axis is each run's training steps (its seconds depend on the machine's
    load), where every run carries them (``curve_steps``)."""
    import numpy as np

    runs_of = study["runs"].items()
    by_steps = bool(study["budget"].get("steps")) and all(
        len(r.get("curve_steps", [])) == len(r["curve"]) for _, runs in runs_of for r in runs
    )

    def points(r: dict) -> list[tuple[float, float]]:
        xs = r["curve_steps"] if by_steps else [t for t, _ in r["curve"]]
        return [(float(x), acc) for x, (_, acc) in zip(xs, r["curve"])]

    start = (0.0, study["sft_val_accuracy"])  # every variant starts from the SFT model
    curves = {name: [sorted([start, *points(r)]) for r in runs] for name, runs in runs_of}
    end = max(c[-1][0] for cs in curves.values() for c in cs)
    grid = list(np.linspace(0, end, 80))
    for name, cs in curves.items():
        values = np.array([_at(c, grid) for c in cs]) * 100
        mean, std = np.nanmean(values, 0), np.nanstd(values, 0, ddof=1) if len(cs) > 1 else np.zeros(len(grid))
        (line,) = ax.plot(grid, mean, label=name, lw=1.4, ls="--" if name == "continued-sft" else "-")
        ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel(
        "training steps (each variant's own: GRPO's, or SFT's for continued SFT)"
        if by_steps
        else "training seconds (evaluations, retraining between rounds not counted; an ended run holds its value)"
    )
    ax.set_ylabel("validation accuracy (%)")
    ax.legend(fontsize=7, ncol=2, loc="lower right")


def draw_learned_against_checked(ax, name: str, runs: list[dict], learned: str) -> None:
    """One variant's rollouts over training time, mean over seeds of each step's mean over its last
    ``window`` steps: the answer checker's accuracy and the learned reward's mean (a probability),
    both in %. A learned reward that climbs while the checker's accuracy does not is being hacked."""
    import numpy as np

    window = 10
    start, end = max(r["rewards"][0]["elapsed_s"] for r in runs), max(r["rewards"][-1]["elapsed_s"] for r in runs)
    grid = list(np.linspace(start, end, 60))  # from the time every seed has a step

    def smoothed(rewards: list[dict], key: str) -> list[tuple[float, float]]:
        values = [p.get(key, math.nan) for p in rewards]
        return [
            (p["elapsed_s"], float(np.nanmean(values[max(0, i + 1 - window) : i + 1]))) for i, p in enumerate(rewards)
        ]

    for key, label, style in (
        ("accuracy", "answer checker: accuracy of the rollouts", "-"),
        (learned, f"learned reward: mean {learned}", "--"),
    ):
        values = np.array([_at(smoothed(r["rewards"], key), grid) for r in runs]) * 100
        ax.plot(grid, np.nanmean(values, 0), ls=style, lw=1.4, label=label)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel(f"training seconds (each step: the mean of the last {window})")
    ax.legend(fontsize=7, loc="lower right")


def train_reward_figure(runs_by_variant: dict[str, list[dict]], window: int = 10):
    """Per variant, over GRPO's steps (mean over seeds, moving mean of ``window`` steps): the answer
    checker's accuracy on the step's questions as first drawn (the train reward), and the share of
    the trained batch's groups that carried a policy gradient (reward spread)."""
    import numpy as np

    plt = _pyplot()
    fig, (reward, gradient) = plt.subplots(1, 2, figsize=(10, 3.8))
    window = max(1, min([window] + [len(r["rewards"]) for runs in runs_by_variant.values() for r in runs]))
    for name, runs in runs_by_variant.items():
        n = min(len(r["rewards"]) for r in runs)
        for ax, values in (
            (reward, [[p["accuracy"] for p in r["rewards"][:n]] for r in runs]),
            (gradient, [[1 - p["frac_batch_zero_std"] for p in r["rewards"][:n]] for r in runs]),
        ):
            mean = np.convolve(np.array(values).mean(0) * 100, np.ones(window) / window, mode="valid")
            ax.plot(np.arange(window, n + 1), mean, lw=1.4, label=name)
    reward.set_ylabel("train reward: accuracy of the rollouts (%)")
    gradient.set_ylabel("groups with a gradient (%)")
    for ax in (reward, gradient):
        ax.set_xlabel(f"GRPO step (moving mean of {window})")
        ax.legend(fontsize=7)
    fig.suptitle(
        "where rewards are sparse: the train reward and the groups that carry a gradient, mean over seeds", fontsize=10
    )
    fig.tight_layout()
    return fig


def staleness_figure(runs_by_variant: dict[str, list[dict]], kinds: list[str], window: int = 20):
    """Per learned reward model, per variant: its within-question AUC against the answer checker on
    the policy's own rollouts, pooled over consecutive windows of ``window`` GRPO steps (every round
    end to end), mean over seeds. A frozen reward model whose curve falls is going stale."""
    import numpy as np

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for name, runs in runs_by_variant.items():
            n = min(len(r["rewards"]) for r in runs)
            ends = list(range(window, n + 1, window))
            values = np.array(
                [
                    [
                        staleness(r["rewards"][e - window : e]).get(f"staleness/{kind}_within_auc", math.nan)
                        for e in ends
                    ]
                    for r in runs
                ]
            )
            ax.plot(ends, np.nanmean(values, 0), marker=".", lw=1.4, label=name)
        ax.set_xlabel(f"GRPO step, every round (windows of {window})")
        ax.set_ylabel(f"{kind.upper()} within-question AUC on the rollouts")
        ax.legend(fontsize=7)
    fig.suptitle(
        "staleness: the reward model's ranking of the policy's current samples\nagainst the answer checker, "
        "mean over seeds",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def study_figures(study: dict) -> dict:
    """The §5 study's figures: ``accuracy_over_time``, ``sampling`` (maj@K / pass@K, Figure 7's question:
    does RL raise maj@K and leave pass@K flat?), ``memory`` (peak memory and steps per second) and,
    where a variant trains on a learned reward, ``reward_hacking`` (the checker against the learned
    reward on the rollouts) and ``staleness`` (the reward model's ranking of those rollouts)."""
    out = {"accuracy_over_time": accuracy_over_time_figure(study)}
    if study["samples"] > 1:
        out["sampling"] = sampling_figure(study)
    out["memory"] = memory_figure(study["rows"])
    tracked = {
        name: runs
        for name, runs in study["runs"].items()
        if runs and all(r.get("rewards") and "frac_batch_zero_std" in r["rewards"][0] for r in runs)
    }
    if tracked and study.get("preset") == "sampling":
        out["train_reward"] = train_reward_figure(tracked)
    kinds = [
        kind
        for kind in ("orm", "prm")
        if any(
            r.get("rewards") and any(p.get(f"{kind}_mixed_groups") for p in r["rewards"])
            for runs in study["runs"].values()
            for r in runs
        )
    ]
    stale = {
        name: runs
        for name, runs in study["runs"].items()
        if runs and all(r.get("rewards") and any(f"{k}_within_auc" in r["rewards"][-1] for k in kinds) for r in runs)
    }
    if stale:
        out["staleness"] = staleness_figure(stale, kinds)
    learned = {
        name: key
        for name, runs in study["runs"].items()
        for key in ("orm_mean", "prm_lowest_mean")
        if runs and all(r.get("rewards") and key in r["rewards"][-1] for r in runs)
    }
    if learned:
        out["reward_hacking"] = reward_hacking_figure(study["runs"], learned)
    return out


def accuracy_over_time_figure(study: dict):
    """Validation accuracy over training time per variant, mean ± std over seeds."""
    plt = _pyplot()
    what = (
        f"{study['budget']['steps']} GRPO steps" if study["budget"]["steps"] else f"{study['budget']['seconds']:.0f} s"
    )
    fig, ax = plt.subplots(figsize=(8, 4.5))
    draw_accuracy_over_time(ax, study)
    ax.set_title(
        f"{study['run_name']}: every variant from the SFT model, {what}, mean ± std over {study['seeds']} seed(s)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def sampling_figure(study: dict):
    """maj@K, pass@K and greedy test accuracy per variant (mean ± std over seeds), the SFT model's
    maj@K and pass@K as dotted lines."""
    plt = _pyplot()
    rows, k = study["rows"], study["samples"]
    fig, ax = plt.subplots(figsize=(8, 4))
    for j, (metric, color) in enumerate(
        ((f"maj@{k}", "tab:blue"), (f"pass@{k}", "tab:green"), ("test_accuracy", "tab:grey"))
    ):
        label = (
            "greedy (all test questions)" if metric == "test_accuracy" else f"{metric} ({study['n_sampled']} questions)"
        )
        ax.bar(
            [i + (j - 1) * 0.27 for i in range(len(rows))],
            [100 * r[f"{metric}_mean"] for r in rows],
            width=0.27,
            yerr=[100 * r.get(f"{metric}_std", 0.0) for r in rows],
            color=color,
            capsize=2,
            label=label,
        )
    ax.axhline(100 * rows[0][f"maj@{k}_mean"], color="tab:blue", lw=0.8, ls=":")
    ax.axhline(100 * rows[0][f"pass@{k}_mean"], color="tab:green", lw=0.8, ls=":")
    ax.set_xticks(range(len(rows)), [r["variant"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("accuracy (%)")
    low = min(100 * r[m] for r in rows for m in (f"maj@{k}_mean", "test_accuracy_mean"))
    ax.set_ylim(max(0, low - 10), 100)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(f"maj@{k} and pass@{k}: the SFT model (dotted) and each variant, mean ± std over seeds", fontsize=9)
    fig.tight_layout()
    return fig


def memory_figure(rows: list[dict]):
    """Peak memory (CUDA allocation where measured, else RSS) and training steps per second of each
    trained variant, mean over seeds."""
    plt = _pyplot()
    trained = [r for r in rows if "steps_per_s_mean" in r]
    fig, (mem, speed) = plt.subplots(1, 2, figsize=(10, 3.8))
    kind = "cuda_mib" if any("peak_cuda_mib_mean" in r for r in trained) else "rss_mib"
    mem.bar(range(len(trained)), [r.get(f"peak_{kind}_mean", math.nan) for r in trained], color="tab:purple")
    mem.set_ylabel("peak CUDA allocation (MiB)" if kind == "cuda_mib" else "peak RSS of the stage's process (MiB)")
    speed.bar(range(len(trained)), [r["steps_per_s_mean"] for r in trained], color="tab:olive")
    speed.set_ylabel("training steps per second")
    for ax in (mem, speed):
        ax.set_xticks(range(len(trained)), [r["variant"] for r in trained], rotation=30, ha="right", fontsize=8)
    fig.suptitle("memory and speed per variant (mean over seeds)", fontsize=10)
    fig.tight_layout()
    return fig


def reward_hacking_figure(runs_by_variant: dict[str, list[dict]], learned: dict[str, str]):
    """Per variant that trains on a learned reward (``learned``: variant -> its reward's key in the
    step records), the learned reward against the answer checker on GRPO's own rollouts."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(learned), figsize=(4 * len(learned), 3.6), squeeze=False, sharey=True)
    for ax, (name, key) in zip(axes[0], learned.items()):
        draw_learned_against_checked(ax, name, runs_by_variant[name], key)
    axes[0][0].set_ylabel("% (mean over seeds)")
    fig.suptitle("reward hacking: the learned reward against\nthe answer checker on GRPO's own rollouts", fontsize=10)
    fig.tight_layout()
    return fig


def save(figures: dict, out_dir: Path) -> dict[str, Path]:
    """Each figure as ``out_dir/<name>.png``; the figures are closed."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, fig in figures.items():
        paths[name] = out_dir / f"{name}.png"
        fig.savefig(paths[name], dpi=100)
        plt.close(fig)
    return paths


def run_figure(run_dir: Path, out: Path) -> Path:
    """The README's picture: test accuracy beside GRPO's validation accuracy over every round."""
    plt = _pyplot()
    manifest = read_manifest(Path(run_dir) / "manifest.json")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1.2, 1]})
    draw_test_accuracy(left, manifest, Path(run_dir))
    _plot_rounds(right, _histories(manifest, "val/accuracy"), scale=100)
    right.set_xlabel("GRPO step (rounds one after another)")
    right.set_ylabel("validation accuracy (%)")
    right.legend(fontsize=8)
    fig.suptitle(f"{manifest['run_name']}: SFT and RL rounds")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(run_figure(Path(sys.argv[1]), Path(sys.argv[2])))

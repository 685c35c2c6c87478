"""Figures of a finished run (matplotlib, no display needed): test accuracy of the SFT model and of
every RL round's policy (and of ``compare``'s variants when the run has them), and GRPO's
validation accuracy over the steps of all rounds.

    python -m grpo_core.figures runs/demo docs/figures/demo.png
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _accuracy_with_interval(per_question: str) -> tuple[float, float]:
    """Accuracy and the half-width of its normal 95% interval over the questions."""
    correct = json.loads(Path(per_question).read_text())
    p = sum(correct) / len(correct)
    return p, 1.96 * math.sqrt(p * (1 - p) / len(correct))


def _validation_curves(manifest: dict) -> list[tuple[int, list[int], list[float]]]:
    """(round, steps, validation accuracy) of each round's GRPO run, from MLflow."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(manifest["tracking_uri"])
    curves = []
    for r in manifest["rounds"]:
        history = sorted(client.get_metric_history(r["stages"]["grpo"]["mlflow_run_id"], "val/accuracy"),
                         key=lambda m: m.step)
        curves.append((r["round"], [m.step for m in history], [m.value for m in history]))
    return curves


def run_figure(run_dir: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    n = manifest["eval"]["sft"]["n"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1.2, 1]})
    bars = [("SFT", *_accuracy_with_interval(manifest["eval"]["sft"]["per_question"]))]
    bars += [(f"round {r['round']}", *_accuracy_with_interval(r["stages"]["eval"]["results"]["policy"]["per_question"]))
             for r in manifest["rounds"]]
    compare = Path(run_dir) / "compare" / "manifest.json"
    rows = [r for r in json.loads(compare.read_text())["rows"] if r["variant"] != "sft"] if compare.exists() else []
    names = [b[0] for b in bars] + [r["variant"] for r in rows]
    left.errorbar(range(len(bars)), [100 * b[1] for b in bars], yerr=[100 * b[2] for b in bars], fmt="o",
                  color="tab:blue", capsize=4, label=f"this run (95% interval over {n} questions)")
    if rows:
        left.errorbar(range(len(bars), len(names)), [100 * r["test_accuracy_mean"] for r in rows],
                      yerr=[100 * r["test_accuracy_std"] for r in rows], fmt="s", color="tab:orange", capsize=4,
                      label=f"compare: one round from SFT, mean ± std over {rows[0]['seeds']} seeds")
    left.axhline(100 * bars[0][1], color="grey", lw=0.8, ls="--")
    left.set_xticks(range(len(names)), names, rotation=30, ha="right")
    left.set_ylabel("greedy test accuracy (%)")
    spans = [(b[1] - b[2], b[1] + b[2]) for b in bars] + [
        (r["test_accuracy_mean"] - r["test_accuracy_std"], r["test_accuracy_mean"] + r["test_accuracy_std"]) for r in rows]
    low, high = 100 * min(a for a, _ in spans), 100 * max(b for _, b in spans)
    left.set_ylim(low - 0.45 * (high - low), None)  # room for the legend below the points
    left.legend(fontsize=8, loc="lower right")
    gain = manifest.get("gain_over_sft") or {}
    if gain:
        left.set_title(f"last round - SFT, paired over the questions: {100 * gain['mean']:+.2f} points "
                       f"[{100 * gain['low']:+.1f}, {100 * gain['high']:+.1f}]", fontsize=9)
    offset = 0
    for k, steps, values in _validation_curves(manifest):
        right.plot([offset + s for s in steps], [100 * v for v in values], marker=".", label=f"round {k}")
        offset += max(steps, default=0)
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

"""What the flows show in the Prefect UI: Markdown for a round's artifact and for the pipeline run's
summary (tables with a header row, links to the MLflow runs, the run's figures)."""

from __future__ import annotations

import base64
from pathlib import Path

from grpo_core.mlflow_runs import MODEL_TRAINING_VIEW
from grpo_core.stages.reward_model import KINDS

# The pipeline run's description in MLflow (its Overview page): where a newcomer clicks.
PARENT_NOTE = """The pipeline run. **Figures**: Artifacts -> `figures` (test accuracy per round against SFT, GRPO's
reward, validation accuracy and KL over every round, the reward models before and after each retraining).
**Metrics** here: `eval/*` (test accuracy), `round/*` and `rm/*` (one point per round), `time/stage/*`.
**Child runs**: `data`, `sft`, `eval`, and `round-<k>` with its stages nested as `round-<k>/grpo`,
`round-<k>/orm`, ... (expand the row in the runs table). GRPO's metrics keep the field's names (`train/*`,
`val/*`); every other stage's start with the stage (`sft/`, `orm/`, `prm/`, `reward_data/`), so a chart never
mixes stages: tick the `round-<k>/grpo` runs and open **Chart** (or Compare) to see the rounds side by side.
Each round's policy is in **Model registry** (sidebar), alias `champion` on the best by validation accuracy.
If the sidebar shows traces and judges instead, switch to **Model training** (top left)."""


def figure_source(path: Path) -> str:
    """A PNG as a ``data:`` address: the Prefect UI shows it without the MLflow server running."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def warning_line(text: str, where: str = "") -> str:
    """A quality warning at the top of a Prefect report (``where``: the round or variant it concerns)."""
    return f"> **Warning{f' ({where})' if where else ''}: {text}.**"


def mlflow_link(uri: str, exp_id: str, run_id: str) -> str:
    """A link to the run in the MLflow UI (the tracking server, or what ``grpo-pipeline ui`` serves),
    in its model-training view: MLflow 3 opens its GenAI view unless the address or the browser's
    last choice says otherwise."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{exp_id}/runs/{run_id}?{MODEL_TRAINING_VIEW}"


def round_report(summary: dict, champion: dict, link: str) -> str:
    """The round's Prefect artifact: a Markdown table, after a warning for each failed quality gate."""
    g = summary["grpo"]
    rows = [("test accuracy", f"{summary['test_accuracy']:.4f}")]
    if gain := summary.get("minus_previous_round"):
        rows.append(
            (
                "against the previous round (same questions, 95%)",
                f"{100 * gain['mean']:+.2f} [{100 * gain['low']:+.2f}, {100 * gain['high']:+.2f}] points",
            )
        )
    rows += [
        ("best validation accuracy", f"{summary['val_accuracy']:.4f} (step {g['best_step']})"),
        ("GRPO steps / wall time", f"{g['steps']} / {g['wall_s']} s"),
        ("reward, last 10 steps", f"{g.get('reward_mean', float('nan')):.4f}"),
        ("KL, last 10 steps", f"{g.get('kl', float('nan')):.5f}"),
    ]
    for kind, rm in summary["reward_models"].items():
        key = KINDS[kind].gate_metric
        rows.append(
            (
                f"{kind.upper()} {key} on fresh samples: before -> after retraining",
                f"{rm['before'].get(key, float('nan')):.4f} -> {rm['after'].get(key, float('nan')):.4f} "
                f"(replay share {rm['replay'].get('share', 0.0):.3f}; the SFT model's own likelihood, untrained: "
                f"{rm.get('baseline', {}).get(key, float('nan')):.4f})",
            )
        )
    rows.append(("champion", f"version {champion['version']} (round {champion['round']})"))
    rows.append(("MLflow run", f"[round-{summary['round']}]({link})"))
    warnings = [warning_line(w) for w in summary.get("quality_warnings", [])]
    if summary.get("excluded_reward_models"):
        warnings.append(
            f"> Kept out of this round's GRPO reward (rounds.on_gate_failure: exclude): "
            f"{', '.join(k.upper() for k in summary['excluded_reward_models'])}."
        )
    return "\n".join(
        [
            f"### RL round {summary['round']}",
            "",
            *warnings,
            *([""] if warnings else []),
            "| measure | value |",
            "|---|---|",
            *(f"| {a} | {b} |" for a, b in rows),
        ]
    )


def _points(gain: dict) -> str:
    return f"{100 * gain['mean']:+.2f} points [{100 * gain['low']:+.1f}, {100 * gain['high']:+.1f}]"


def pipeline_report(manifest: dict, exp_id: str, gains: dict[int, dict[str, dict]], figures: dict[str, str]) -> str:
    """The pipeline run's Prefect summary: test accuracy of SFT and of each round's policy on the test
    split and each further held-out set (paired differences to SFT, ``gains`` by round, then set), each
    reward model's held-out quality before and after its retraining, the champion, where the time went,
    links to the MLflow runs, and ``figures`` (name -> an image address Prefect can show)."""
    uri = manifest["tracking_uri"]
    link = lambda run_id: mlflow_link(uri, exp_id, run_id)  # noqa: E731
    sft, rounds = manifest["eval"]["sft"], manifest["rounds"]
    sets = {"test": sft} | sft.get("held_out", {})  # the test split, then each further held-out set
    lines = [f"## Pipeline run `{manifest['run_name']}`", ""]
    lines += [warning_line(w, f"round {r['round']}") for r in rounds for w in r.get("quality_warnings", [])]
    lines += [
        "",
        "| model | "
        + " | ".join(
            f"{name} accuracy ({s['n']} questions) | minus SFT, paired (95% interval)" for name, s in sets.items()
        )
        + " | MLflow run |",
        "|---|" + "---|---|" * len(sets) + "---|",
        "| SFT | "
        + " | ".join(f"{100 * s['accuracy']:.2f}% | " for s in sets.values())
        + f" | [sft]({link(manifest['stages']['sft']['mlflow_run_id'])}) |",
    ]
    for r in rounds:
        final = " (final)" if r is rounds[-1] else ""
        accuracy = {"test": r["test_accuracy"]} | r.get("held_out_accuracy", {})
        gain = gains.get(r["round"], {})
        cells = [f"{100 * accuracy[name]:.2f}% | {_points(gain[name]) if gain.get(name) else ''}" for name in sets]
        lines.append(
            f"| round {r['round']} policy{final} | "
            + " | ".join(cells)
            + f" | [round-{r['round']}]({link(r['mlflow_run_id'])}) |"
        )
    lines += reward_model_table(rounds)
    champion, profile = manifest["champion"], manifest["profile"]
    spent = sorted(profile["stages_s"].items(), key=lambda kv: -kv[1])[:6]
    lines += [
        "",
        f"**Champion**: version {champion['version']} of `{champion['name']}` (round {champion['round']}, "
        f"validation accuracy {100 * champion['val_accuracy']:.2f}%), alias `champion` in the MLflow model registry.",
        "",
        f"**The whole run in MLflow**: [{manifest['run_name']}]({link(manifest['mlflow_run_id'])}) "
        "(its figures under Artifacts -> figures; each stage is a child run named `round-<k>/<stage>`).",
        "",
        f"**Where the {profile['wall_s'] / 60:.1f} minutes went**: "
        + ", ".join(f"{name} {s:.0f} s" for name, s in spent)
        + ".",
    ]
    for name, src in figures.items():
        lines += ["", f"![{name.replace('_', ' ')}]({src})"]
    return "\n".join(lines)


def reward_model_table(rounds: list[dict]) -> list[str]:
    """The pipeline report's reward-model lines: each round's reward models' held-out quality before
    and after retraining, beside the zero-training verifier, their replay share and quality gate."""
    lines: list[str] = []
    rms = [(r["round"], kind, rm) for r in rounds for kind, rm in r["reward_models"].items()]
    if rms:
        lines += [
            "",
            "| reward model | round | held-out, before -> after retraining | zero-training verifier | "
            "replay share | quality gate |",
            "|---|---|---|---|---|---|",
        ]
        for k, kind, rm in rms:
            key, gate = KINDS[kind].gate_metric, rm.get("quality_gate") or {}
            verdict = (
                (
                    ("passed" if gate["passed"] else "**undecided**" if gate.get("undecided") else "**FAILED**")
                    + f" (>= {gate['threshold']}"
                    + (", above the verifier" if "baseline" in gate else "")
                    + (f", on >= {gate['min_questions']} mixed questions" if "min_questions" in gate else "")
                    + ")"
                )
                if gate
                else "none"
            )
            lines.append(
                f"| {kind.upper()} | {k} | {key} {rm['before'].get(key, float('nan')):.4f} -> "
                f"{rm['after'].get(key, float('nan')):.4f} | {rm.get('baseline', {}).get(key, float('nan')):.4f} | "
                f"{rm['replay'].get('share', 0.0):.3f} | {verdict} |"
            )
    return lines


def terminal_report(manifest: dict, gains: dict[int, dict[str, dict]], manifest_path: Path) -> str:
    """What ``run`` and ``rounds`` print when they finish: each model's accuracy on the test split
    and every further held-out set, each round against SFT and against the round before it in points
    with the 95% interval (paired over the same questions), the champion and where the details are."""
    sft, rounds = manifest["eval"]["sft"], manifest["rounds"]
    sets = {"test": sft} | sft.get("held_out", {})
    head = (
        ["model"]
        + [f"{name} ({s['n']:,} q)" for name, s in sets.items()]
        + ["minus SFT (95%)", "minus previous round (95%)"]
    )
    rows = [["SFT"] + [f"{100 * s['accuracy']:.2f}%" for s in sets.values()] + ["", ""]]
    for r in rounds:
        accuracy = {"test": r["test_accuracy"]} | r.get("held_out_accuracy", {})
        test_gain, previous = gains.get(r["round"], {}).get("test"), r.get("minus_previous_round")
        rows.append(
            [f"round {r['round']}" + (" (champion)" if r["round"] == manifest["champion"]["round"] else "")]
            + [f"{100 * accuracy[name]:.2f}%" if name in accuracy else "" for name in sets]
            + [_points(test_gain) if test_gain else "", _points(previous) if previous else ""]
        )
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *rows]]
    champion = manifest["champion"]
    cached = sorted(
        set(manifest.get("cached_stages", []))
        | {f"round-{r['round']}/{s}" for r in rounds for s in r.get("cached_stages", [])}
    )
    return "\n".join(
        [
            f"{manifest['run_name']}: {len(rounds)} RL round(s) after SFT",
            *table,
            "",
            f"champion: version {champion['version']} of {champion['name']} (round {champion['round']}, "
            f"validation {100 * champion['val_accuracy']:.2f}%)",
            *([f"from the cache: {', '.join(cached)}"] if cached else []),
            f"details: {manifest_path} (--json prints the summary as JSON)",
        ]
    )

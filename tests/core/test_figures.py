"""The run's figures: drawn from a run's manifest (GRPO's recorded steps and evaluations) and
per-question results."""

from __future__ import annotations

import json


def _run(tmp_path, reward_models: bool) -> dict:
    """A two-round run's manifest with GRPO histories and per-question results on disk."""
    rounds = []
    for k in (1, 2):
        curve = [{"step": step, "val/accuracy": 0.5 + 0.1 * k + step / 100} for step in (0, 10)]
        if reward_models:  # the PRM's ranking of the rollouts since the last evaluation
            curve[1]["staleness/prm_within_auc"] = 0.9 - 0.1 * k
        rewards = [
            {"step": step, "reward_mean": 0.4 + 0.1 * k + step / 100, "kl": 0.001 * step} for step in range(1, 11)
        ]
        per_question = tmp_path / f"round{k}.json"
        per_question.write_text(json.dumps([1] * (5 + k) + [0] * (5 - k)))
        rms = (
            {
                "orm": {
                    "before": {"auc": 0.55},
                    "after": {"auc": 0.7},
                    "quality_gate": {"metric": "auc", "value": 0.7, "threshold": 0.6, "passed": True},
                },
                "prm": {"before": {"step_auc": 0.2}, "after": {"step_auc": 0.65}},
            }
            if reward_models
            else {}
        )
        rounds.append(
            {
                "round": k,
                "reward_models": rms,
                "stages": {
                    "grpo": {"curve": curve, "rewards": rewards},
                    "eval": {"results": {"policy": {"per_question": str(per_question)}}},
                },
            }
        )
    (tmp_path / "sft.json").write_text(json.dumps([1] * 5 + [0] * 5))
    manifest = {
        "run_name": "t",
        "rounds": rounds,
        "gain_over_sft": {"mean": 0.2, "low": 0.0, "high": 0.4},
        "eval": {"sft": {"n": 10, "per_question": str(tmp_path / "sft.json")}},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_run_figure_draws_test_accuracy_and_validation_curves(tmp_path):
    from grpo_core.figures import run_figure

    _run(tmp_path, reward_models=False)
    out = run_figure(tmp_path, tmp_path / "fig" / "run.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_pipeline_figures(tmp_path):
    from grpo_core import figures

    for name in ("plain", "with_rms"):
        (tmp_path / name).mkdir()
    plain = figures.pipeline_figures(_run(tmp_path / "plain", reward_models=False))
    assert set(plain) == {"test_accuracy", "grpo_curves"}  # no reward model, no reward-model figure
    figures.save(plain, tmp_path / "plain" / "figures")
    paths = figures.save(
        figures.pipeline_figures(_run(tmp_path / "with_rms", reward_models=True)), tmp_path / "with_rms" / "figures"
    )
    assert set(paths) == {"test_accuracy", "grpo_curves", "reward_models"}
    assert all(p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 10_000 for p in paths.values())
    # GRPO's curves, and with a learned reward its staleness below them.
    assert len(figures.grpo_figure(_run(tmp_path / "with_rms", reward_models=True)).axes) == 4
    assert len(figures.grpo_figure(_run(tmp_path / "plain", reward_models=False)).axes) == 3

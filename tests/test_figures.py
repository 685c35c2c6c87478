"""The run figure: drawn from a run's manifest, per-question results and MLflow histories."""
from __future__ import annotations

import json


def test_run_figure_draws_test_accuracy_and_validation_curves(tmp_path):
    from mlflow.tracking import MlflowClient

    from grpo_core.figures import run_figure

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("figure")
    rounds = []
    for k in (1, 2):
        run_id = client.create_run(exp).info.run_id
        for step, acc in ((0, 0.5 + 0.1 * k), (10, 0.6 + 0.1 * k)):
            client.log_metric(run_id, "val/accuracy", acc, step=step)
        per_question = tmp_path / f"round{k}.json"
        per_question.write_text(json.dumps([1] * (5 + k) + [0] * (5 - k)))
        rounds.append({"round": k, "stages": {"grpo": {"mlflow_run_id": run_id},
                                              "eval": {"results": {"policy": {"per_question": str(per_question)}}}}})
    (tmp_path / "sft.json").write_text(json.dumps([1] * 5 + [0] * 5))
    (tmp_path / "manifest.json").write_text(json.dumps({
        "run_name": "t", "tracking_uri": uri, "rounds": rounds, "gain_over_sft": {"mean": 0.2, "low": 0.0, "high": 0.4},
        "eval": {"sft": {"n": 10, "per_question": str(tmp_path / "sft.json")}}}))
    out = run_figure(tmp_path, tmp_path / "fig" / "run.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000

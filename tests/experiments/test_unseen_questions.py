"""experiments/unseen_questions.py's ``on_unseen``: an experiment's models on other questions, each row's
paired gains over the variants it is compared with, and, where keep-best published another step,
the same between the policies the runs ended with."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments import unseen_questions  # noqa: E402


def test_gains_of_kept_and_last_policies_on_the_questions(tmp_path, monkeypatch):
    import grpo_core.evaluation
    import grpo_core.lm.modeling

    # Each model folder's name is its accuracy: what the evaluation would measure.
    monkeypatch.setattr(grpo_core.lm.modeling, "load_model", lambda path: (_Named(path), None))
    monkeypatch.setattr(grpo_core.evaluation, "greedy_accuracy", lambda model, tok, ex, n: float(model.path))
    run = tmp_path / "run"
    experiment = run / "iterate" / "steps-2"
    experiment.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"sft_model": "0.5"}))

    def seed(kept: str, last: str | None = None) -> dict:
        return {"model": {"path": kept}} | ({"last": {"path": last}} if last else {})

    runs = {"frozen": [seed("0.6"), seed("0.7", last="0.75")], "retrained": [seed("0.8", last="0.65"), seed("0.8")]}
    (experiment / "manifest.json").write_text(json.dumps({"runs": runs}))
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')

    sft, frozen, retrained = unseen_questions.on_unseen(experiment, str(questions), 8)["rows"]
    assert sft == {"variant": "sft", "accuracy": 0.5}
    assert "gain_over_retrained" not in frozen  # not compared that way
    assert frozen["last_per_seed"] == [0.6, 0.75] and retrained["last_per_seed"] == [0.65, 0.8]
    assert retrained["gain_over_frozen"] == 0.15  # (0.2 + 0.1) / 2
    # Seed by seed between the policies the runs ended with: 0.65 - 0.6 and 0.8 - 0.75.
    assert retrained["last_gain_over_frozen"] == 0.05
    assert retrained["last_gain_over_frozen_95ci"] == [0.05, 0.05]  # paired: no spread (unpaired it would have)


class _Named:
    def __init__(self, path: str):
        self.path = path

    def eval(self):
        return self

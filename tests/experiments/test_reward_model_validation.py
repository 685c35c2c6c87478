"""experiments/reward_model_validation.py: a quarter of a round's training questions (whole ones)
become validation questions, the rest train, and each variant goes through the pipeline's own
reward-model stage, measured on the validation questions beside the SFT likelihood."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict, load_from_disk

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments import reward_model_validation  # noqa: E402
from grpo_core.data import prompt_text  # noqa: E402
from grpo_core.stages.outputs import arrow_digest  # noqa: E402
from grpo_core.stages.reward_data import DATASETS  # noqa: E402

QUESTIONS = [
    ("Tom has 3 apples and buys 4 more. How many apples?", "7"),
    ("A train travels 60 miles in 2 hours. What is its speed?", "30"),
    ("Sara read 12 pages on Monday and 9 on Tuesday. How many pages?", "21"),
    ("A box holds 6 eggs. How many eggs are in 5 boxes?", "30"),
    ("Jim had 20 dollars and spent 8. How much is left?", "12"),
    ("There are 45 chairs in 9 equal rows. How many chairs per row?", "5"),
    ("A garden is 7 meters wide and 8 meters long. What is its area?", "56"),
    ("Lucy saves 15 cents a day for 4 days. How many cents?", "60"),
]


def _round(root: Path, model: Path) -> Path:
    """A round's folder: its reward data (every question has a right and a wrong solution) and the
    ORM's manifest naming the starting model."""
    rows = {"solutions": [], "pairs": [], "steps": []}
    for q, gold in QUESTIONS:
        right, wrong = f"{gold} + 0 = {gold}\n#### {gold}", f"{gold} + 1 = {int(gold) + 1}\n#### {int(gold) + 1}"
        p = prompt_text(q)
        rows["solutions"] += [{"prompt": p, "completion": right, "correct": True}]
        rows["solutions"] += [{"prompt": p, "completion": wrong, "correct": False}]
        rows["pairs"] += [{"prompt": p, "chosen": right, "rejected": wrong}]
        for text, ok in ((right, True), (wrong, False)):
            steps = text.split("\n")
            labels = [ok] * len(steps)
            rows["steps"] += [
                {
                    "prompt": p,
                    "completions": steps,
                    "labels": labels,
                    "soft_labels": [float(x) for x in labels],
                    "exact_labels": labels,
                    "completion": text,
                }
            ]
    held_out = {"prompt": prompt_text("A held-out question of 9 - 4?"), "completion": "#### 5", "correct": True}
    for name, table in rows.items():
        test = [dict(table[0], prompt=held_out["prompt"])] if name != "solutions" else [held_out]
        DatasetDict({"train": Dataset.from_list(table), "test": Dataset.from_list(test)}).save_to_disk(
            str(root / "reward_data" / name)
        )
    (root / "orm").mkdir(parents=True)
    (root / "orm" / "manifest.json").write_text(json.dumps({"init": str(model), "round": 1}))
    return root


def test_variants_are_measured_on_validation_questions_carved_from_the_training_ones(
    tmp_path, tiny_cfg, tiny_model_dir
):
    round_dir = _round(tmp_path / "round-1", tiny_model_dir)
    variants = {"as-is": [], "pairwise": ["orm.objective=pairwise"]}

    def config(overrides):
        return tiny_cfg(tmp_path, *overrides, orm__train=True, orm__batch_size=4)

    source = {name: arrow_digest(round_dir / "reward_data" / name) for name in DATASETS}
    report = reward_model_validation.validate(round_dir, config, "orm", variants, tmp_path / "out")
    assert {name: arrow_digest(round_dir / "reward_data" / name) for name in DATASETS} == source  # only read
    for name in DATASETS:
        carved = load_from_disk(str(tmp_path / "out" / "reward_data" / name))
        validation, train = set(carved["test"]["prompt"]), set(carved["train"]["prompt"])
        assert len(validation) == 2 and len(train) == 6 and not validation & train  # whole questions, a quarter
        source_rows = load_from_disk(str(round_dir / "reward_data" / name))["train"].num_rows
        assert carved["test"].num_rows + carved["train"].num_rows == source_rows  # the round's held-out: none
    for name in variants:
        got = report["variants"][name]
        assert got["validation"]["mixed_questions"] == 2 == got["sft_likelihood"]["mixed_questions"]
        assert "within_question_auc_minus_baseline" in got["validation"] and "passed" in got["gate"]
    # Each variant trained on its own objective's rows of the 6 training questions: 12 solutions, 6 pairs.
    assert report["variants"]["as-is"]["trained_on"]["rows"] == 12
    assert report["variants"]["pairwise"]["trained_on"]["rows"] == 6
    assert report["init"] == str(tiny_model_dir)


def test_a_later_round_is_refused(tmp_path, tiny_cfg, tiny_model_dir):
    round_dir = _round(tmp_path / "round-2", tiny_model_dir)
    (round_dir / "orm" / "manifest.json").write_text(json.dumps({"init": str(tiny_model_dir), "round": 2}))
    with pytest.raises(ValueError, match="round 2; variants are compared on round 1"):
        reward_model_validation.validate(round_dir, lambda o: tiny_cfg(tmp_path), "orm", {"as-is": []}, tmp_path / "o")

"""experiments/reward_model_validation.py: a quarter of a round's training questions (whole ones)
become validation questions, the rest train, and each variant goes through the pipeline's own
reward-model stage, measured on the validation questions beside the SFT likelihood."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from datasets import Dataset, DatasetDict, load_from_disk

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments import reward_model_validation  # noqa: E402
from grpo_core.data import prompt_text  # noqa: E402

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
    for name, table in rows.items():
        DatasetDict({"train": Dataset.from_list(table), "test": Dataset.from_list(table[:2])}).save_to_disk(
            str(root / "reward_data" / name)
        )
    (root / "orm").mkdir(parents=True)
    (root / "orm" / "manifest.json").write_text(json.dumps({"init": str(model)}))
    return root


def test_variants_are_measured_on_validation_questions_carved_from_the_training_ones(
    tmp_path, tiny_cfg, tiny_model_dir
):
    round_dir = _round(tmp_path / "round-1", tiny_model_dir)
    variants = {"as-is": [], "pairwise": ["orm.objective=pairwise"]}

    def config(overrides):
        return tiny_cfg(tmp_path, *overrides, orm__train=True, orm__batch_size=4)

    report = reward_model_validation.validate(round_dir, config, "orm", variants, tmp_path / "out")
    carved = load_from_disk(str(tmp_path / "out" / "reward_data" / "solutions"))
    validation, train = set(carved["test"]["prompt"]), set(carved["train"]["prompt"])
    assert len(validation) == 2 and len(train) == 6 and not validation & train  # whole questions, a quarter
    assert carved["test"].num_rows + carved["train"].num_rows == 2 * len(QUESTIONS)
    for name, overrides in variants.items():
        got = report["variants"][name]
        assert got["overrides"] == overrides and got["seconds"] > 0
        assert got["validation"]["mixed_questions"] == 2 == got["sft_likelihood"]["mixed_questions"]
        assert "within_question_auc_minus_baseline" in got["validation"] and "passed" in got["gate"]
    assert report["init"] == str(tiny_model_dir)

"""``grpo-pipeline score``: one JSON line per input row, in order; an ORM gives a probability, a PRM
one per step, split as the pipeline splits steps; bad rows and folders are named."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from flows.cli import main
from grpo_core.data import prompt_text
from grpo_core.lm.policy import encode
from grpo_core.rewards.steps import step_texts

ROWS = [
    {"question": "What is 7 + 5 - 9?", "completion": "7 + 5 = 12\n12 - 9 = 3\n#### 3"},
    {"prompt": prompt_text("What is 2 + 2?"), "completion": "#### 4"},
    {"question": "What is 1 + 1?", "completion": "1 + 1 = 3\n\n\n#### 3\n"},
    {"question": "What is 1 + 1?", "completion": ""},
]


@pytest.fixture(scope="module")
def reward_model_dirs(tmp_path_factory, tiny_model_dir):
    from grpo_core.lm.modeling import load_tokenizer
    from grpo_core.rewards.heads import load_reward_model

    out = {}
    for kind in ("orm", "prm"):
        torch.manual_seed(1)
        model = load_reward_model(tiny_model_dir, kind)
        model.config.step_separator = "\n"
        out[kind] = tmp_path_factory.mktemp(kind) / "model"
        model.save_pretrained(out[kind])
        load_tokenizer(tiny_model_dir).save_pretrained(out[kind])
    return out


def _score(tmp_path, capsys, model, rows) -> list[dict]:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["score", "--model", str(model), "--data", str(data), "--batch-size", "3"])
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_orm_scores_are_probabilities_in_input_order(tmp_path, capsys, reward_model_dirs):
    from grpo_core.lm.modeling import load_tokenizer
    from grpo_core.rewards.heads import load_reward_model, orm_logits

    out = _score(tmp_path, capsys, reward_model_dirs["orm"], ROWS)
    assert [set(r) for r in out] == [{"score"}] * len(ROWS)
    # Each row scored alone gives the same number: order kept across batches of 3.
    model, tok = load_reward_model(reward_model_dirs["orm"], "orm").eval(), load_tokenizer(reward_model_dirs["orm"])
    for row, result in zip(ROWS, out):
        prompt = row.get("prompt") or prompt_text(row["question"])
        with torch.no_grad():
            alone = torch.sigmoid(orm_logits(model, encode(tok, [prompt], [row["completion"]]))).item()
        assert 0.0 < result["score"] < 1.0 and math.isclose(result["score"], alone, rel_tol=1e-4)


def test_prm_gives_one_probability_per_pipeline_step(tmp_path, capsys, reward_model_dirs):
    out = _score(tmp_path, capsys, reward_model_dirs["prm"], ROWS)
    # 3 steps (the #### line included), 1, 2 (blank lines are no steps), 0 for an empty completion.
    assert [len(r["step_scores"]) for r in out] == [len(step_texts(r["completion"])) for r in ROWS] == [3, 1, 2, 0]
    assert all(0.0 < p < 1.0 for r in out for p in r["step_scores"])


def test_out_file_holds_the_same_lines(tmp_path, capsys, reward_model_dirs):
    printed = _score(tmp_path, capsys, reward_model_dirs["prm"], ROWS)
    target = tmp_path / "scores.jsonl"
    main(
        [
            "score",
            "--model",
            str(reward_model_dirs["prm"]),
            "--data",
            str(tmp_path / "rows.jsonl"),
            "--out",
            str(target),
        ]
    )
    assert capsys.readouterr().out == ""
    assert [json.loads(line) for line in target.read_text().splitlines()] == printed


@pytest.mark.parametrize(
    "line,message",
    [
        ('{"question": "What is 1 + 1?"}', "rows.jsonl:3: field completion missing"),
        ('{"completion": "#### 2"}', "rows.jsonl:3: field question \\(or prompt\\) missing"),
        (
            '{"question": 5, "completion": "#### 2"}',
            "rows.jsonl:3: field question \\(or prompt\\) missing or not a string",
        ),
        ("not json", "rows.jsonl:3: malformed JSON"),
        ("[1, 2]", "rows.jsonl:3: expected an object"),
    ],
)
def test_a_malformed_row_is_named_by_file_and_line(tmp_path, capsys, reward_model_dirs, line, message):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n\n" + line + "\n")  # a blank line 2 is skipped, not an error
    with pytest.raises(SystemExit) as exit_:
        main(["score", "--model", str(reward_model_dirs["orm"]), "--data", str(data)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_a_causal_lm_is_the_zero_training_verifier(tmp_path, capsys, tiny_model_dir):
    """A policy folder gives both fields: each step's lowest token probability and the solution's."""
    from grpo_core.lm.modeling import load_model
    from grpo_core.rewards.likelihood import likelihood_scores

    out = _score(tmp_path, capsys, tiny_model_dir, ROWS)
    assert [len(r["step_scores"]) for r in out] == [3, 1, 2, 0]
    model, tok = load_model(tiny_model_dir)
    whole, steps, _ = likelihood_scores(
        model.eval(), tok, encode(tok, [prompt_text(ROWS[0]["question"])], [ROWS[0]["completion"]]), "\n"
    )
    assert out[0]["score"] == pytest.approx(whole[0].item(), rel=1e-4)
    assert out[0]["step_scores"] == pytest.approx(steps[0].tolist(), rel=1e-4)
    # A solution is no surer than its least sure step; an empty one is still scored (its EOS).
    assert all(0.0 < r["score"] <= min(r["step_scores"], default=1.0) + 1e-6 <= 1.0 + 1e-6 for r in out)


def test_a_folder_that_is_no_language_or_reward_model_is_refused(tmp_path, capsys, tiny_model_dir):
    import shutil

    other = tmp_path / "encoder"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n")
    with pytest.raises(SystemExit):
        main(["score", "--model", str(other), "--data", str(data)])
    assert "is not a reward model" in capsys.readouterr().err

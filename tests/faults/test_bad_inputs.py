"""The bad-input catalogue (docs/reliability.md, "Bad input"): each input gets a specific message naming the file,
line or field, or is skipped and counted; nothing already done is lost. Cases covered elsewhere are
listed in that table with their tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import grpo_core.rewards.scorer as rewards_mod
from grpo_core.data import DataError, load_jsonl
from grpo_core.lm.modeling import ModelError, load_model
from grpo_core.rewards.scorer import RewardError
from grpo_core.stages.grpo import run_grpo
from grpo_core.tracking import NullLogger
from grpo_core.training.checkpoint import latest_checkpoint


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- data


def test_an_absurdly_long_field_is_rejected_naming_line_and_limit(tmp_path):
    path = _jsonl(
        tmp_path / "d.jsonl",
        [
            {"question": "What is 1 + 1?", "answer": "#### 2"},
            {"question": "What is " + "1 + " * 10_000 + "1?", "answer": "#### 10001"},
        ],
    )
    with pytest.raises(DataError, match=r"d.jsonl:2: field 'question' is 40,010 characters, over the limit of 20,000"):
        load_jsonl(str(path))
    assert len(load_jsonl(str(path), max_chars=50_000)) == 2  # data.max_chars raises the limit


def test_a_gold_answer_no_completion_could_match_is_rejected(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"question": "q?", "answer": "#### " + "7" * 300}])
    with pytest.raises(DataError, match=r"d.jsonl:1: field 'answer': the final answer is 300 characters"):
        load_jsonl(str(path))


def test_data_max_chars_is_a_recipe_field(tmp_path, tiny_cfg):
    from grpo_core.data import load_splits

    long_row = {"question": "x" * 300 + "?", "answer": "#### 1"}
    for name in ("sft", "rl", "test"):
        _jsonl(tmp_path / f"{name}.jsonl", [{"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}] * 3)
    _jsonl(tmp_path / "rl.jsonl", [long_row] * 3)
    cfg = tiny_cfg(
        tmp_path,
        data__source="jsonl",
        data__sft_file=str(tmp_path / "sft.jsonl"),
        data__rl_file=str(tmp_path / "rl.jsonl"),
        data__test_file=str(tmp_path / "test.jsonl"),
        data__max_chars=200,
    )
    with pytest.raises(DataError, match=r"rl.jsonl:1: field 'question' is 301 characters"):
        load_splits(cfg.data, 0)


# ---------------------------------------------------------------------------- models


def test_a_model_folder_of_the_wrong_architecture_is_named(tmp_path, tiny_model_dir):
    folder = tmp_path / "vit"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "vit",
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 64,
            }
        )
    )
    with pytest.raises(ModelError, match=r"vit: a 'vit' model is not a causal language model"):
        load_model(folder)


def test_a_malformed_model_config_is_named(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": ')
    with pytest.raises(ModelError, match=r"broken/config.json: cannot read the model's config"):
        load_model(folder)


def test_a_model_folder_without_weights_is_named(tmp_path, tiny_model_dir):
    folder = tmp_path / "no_weights"
    folder.mkdir()
    for f in Path(tiny_model_dir).iterdir():
        if not f.name.endswith(".safetensors"):
            (folder / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ModelError, match=r"no_weights: cannot load as a causal LM"):
        load_model(folder)


# ---------------------------------------------------------------------------- rewards


def test_a_checker_that_raises_on_a_completion_is_counted_not_fatal(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, monkeypatch
):
    calls = []

    def flaky(completion, gold):
        calls.append(1)
        if len(calls) % 3 == 0:
            raise RecursionError("hostile completion")
        return len(completion) % 2 == 0

    monkeypatch.setattr(rewards_mod, "is_correct", flaky)
    log = NullLogger()
    cfg = tiny_cfg(tmp_path, grpo__max_steps=1)
    run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "grpo", log)
    [metrics] = [m for _, m in log.history if "train/loss" in m]
    batch = cfg.grpo.questions_per_step * cfg.grpo.group_size
    assert metrics["reward/rule_errors"] == batch // 3
    assert metrics["reward/nonfinite_completions"] == batch // 3  # no verdict: no advantage
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))


def test_a_reward_that_always_raises_stops_naming_the_step_and_keeps_the_checkpoint(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, monkeypatch
):
    cfg = tiny_cfg(tmp_path, grpo__max_steps=3, grpo__checkpoint_every=1)
    batch = cfg.grpo.questions_per_step * cfg.grpo.group_size
    calls = []

    def broken_after_step_1(completion, gold):
        calls.append(1)
        if len(calls) > batch:
            raise ValueError("reward bug")
        return False

    monkeypatch.setattr(rewards_mod, "is_correct", broken_after_step_1)
    out = tmp_path / "grpo"
    with pytest.raises(
        RewardError,
        match=r"GRPO step 2 of .*grpo: none of the step's 6 completions got a finite "
        r"reward \(rule checker errors: 6",
    ):
        run_grpo(cfg, tiny_data_dir, tiny_model_dir, out, NullLogger())
    assert latest_checkpoint(out / "checkpoints").name == "step-00000001"  # step 1 is kept
    monkeypatch.setattr(rewards_mod, "is_correct", lambda c, g: False)  # the bug fixed
    manifest = run_grpo(cfg, tiny_data_dir, tiny_model_dir, out, NullLogger())
    assert manifest["resumed_from_step"] == 1 and manifest["steps"] == 3


def test_a_gold_answer_that_is_not_a_number_is_compared_as_a_string():
    from grpo_core.verify import is_correct

    assert is_correct("#### \\sqrt{2}", "\\sqrt{2}")
    assert is_correct("so \\boxed{\\sqrt{2}}", "#### \\sqrt{2}")
    assert not is_correct("#### \\sqrt{3}", "\\sqrt{2}")

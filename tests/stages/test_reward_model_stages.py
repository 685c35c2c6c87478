"""The reward-model stages on hand-made datasets: what they publish, and how they resume.

Datasets are written in the reward-data stage's format (``DatasetDict`` folders with ``train`` and
``test``), so these tests need no sampling from a policy.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict

from grpo_core.config import GRPOConfig
from grpo_core.data import prompt_text
from grpo_core.digests import digest_dir
from grpo_core.manifests import Ref
from grpo_core.stages.reward_model import run_reward_model

Q = prompt_text("What is 7 + 5 - 9?")
RIGHT = "7 + 5 = 12\n12 - 9 = 3\n#### 3"
WRONG = "7 + 5 = 13\n13 - 9 = 4\n#### 4"


def _save(root: Path, name: str, train: list[dict], test: list[dict]) -> tuple[str, str]:
    path = root / name
    DatasetDict({"train": Dataset.from_list(train), "test": Dataset.from_list(test)}).save_to_disk(str(path))
    return str(path), digest_dir(path, "*.arrow")


def _step_row(text: str, labels: list[bool]) -> dict:
    return {
        "prompt": Q,
        "completions": text.split("\n"),
        "labels": labels,
        "soft_labels": [float(x) for x in labels],
        "exact_labels": labels,
        "completion": text,
    }


@pytest.fixture
def reward_data(tmp_path) -> dict:
    pair = {"prompt": Q, "chosen": RIGHT, "rejected": WRONG}
    sol = [{"prompt": Q, "completion": RIGHT, "correct": True}, {"prompt": Q, "completion": WRONG, "correct": False}]
    out: dict = {}
    for name, train, test in (
        ("pairs", [pair] * 4, [pair]),
        ("solutions", sol * 2, sol),
        # Held-out steps all labelled right: one class, so the step AUC is undefined.
        ("steps", [_step_row(RIGHT, [True] * 3), _step_row(WRONG, [False] * 3)] * 2, [_step_row(RIGHT, [True] * 3)]),
    ):
        path, digest = _save(tmp_path / "rd", name, train, test)
        out[name] = Ref(path=path, digest=digest)
    return out


def test_prm_with_an_undefined_heldout_auc_still_publishes_its_own_model(
    tmp_path, tiny_cfg, tiny_model_dir, reward_data
):
    cfg = tiny_cfg(tmp_path, prm__batch_size=2, prm__lr=1e-3)
    out = tmp_path / "prm"
    (out / "best").mkdir(parents=True)
    (out / "best" / "stale-marker").write_text("a model from another run")
    manifest = run_reward_model(cfg, "prm", reward_data, tiny_model_dir, out)
    assert math.isnan(manifest["heldout"]["step_auc"])
    assert (Path(manifest["model"]) / "config.json").exists()
    assert not (Path(manifest["model"]) / "stale-marker").exists()


def test_orm_more_epochs_resume_from_the_last_epoch(tmp_path, tiny_cfg, tiny_model_dir, reward_data):
    """Raising `orm.epochs` is a budget change: the second run continues at step 2, not from scratch."""
    out = tmp_path / "orm"
    first = run_reward_model(
        tiny_cfg(tmp_path, orm__batch_size=2, orm__epochs=1), "orm", reward_data, tiny_model_dir, out
    )
    assert (first["steps"], first["epochs"]) == (2, 1)
    second = run_reward_model(
        tiny_cfg(tmp_path, orm__batch_size=2, orm__epochs=2), "orm", reward_data, tiny_model_dir, out
    )
    assert (second["steps"], second["epochs"]) == (4, 2)
    assert not list(tmp_path.glob("orm/checkpoints.stale-*"))
    assert 0.0 <= second["heldout"]["pairwise_accuracy"] <= 1.0 and 0.0 <= second["heldout"]["auc"] <= 1.0


def test_empty_heldout_split_is_a_clear_error(tmp_path, tiny_cfg, tiny_model_dir, reward_data):
    sol = {"prompt": Q, "completion": RIGHT, "correct": True}
    path = tmp_path / "rd" / "solutions_empty"
    DatasetDict(
        {"train": Dataset.from_list([sol]), "test": Dataset.from_dict({"prompt": [], "completion": [], "correct": []})}
    ).save_to_disk(str(path), num_shards={"train": 1, "test": 1})
    data = {**reward_data, "solutions": Ref(path=str(path), digest=digest_dir(path, "*.arrow"))}
    with pytest.raises(ValueError, match="no held-out rows .*solutions_empty"):
        run_reward_model(tiny_cfg(tmp_path), "orm", data, tiny_model_dir, tmp_path / "orm")


@pytest.mark.parametrize("objective,steps", [("pointwise", 2), ("pairwise", 2), ("both", 4)])
def test_orm_objectives_train_on_their_datasets(tmp_path, tiny_cfg, tiny_model_dir, reward_data, objective, steps):
    """pointwise: the 4 checked solutions; pairwise: the 4 pairs; both: the 8 rows, 2 per batch."""
    cfg = tiny_cfg(tmp_path, orm__batch_size=2, orm__epochs=1, orm__objective=objective)
    manifest = run_reward_model(cfg, "orm", reward_data, tiny_model_dir, tmp_path / "orm")
    assert manifest["steps"] == steps
    assert manifest["replay"]["fresh"] == 2 * steps
    # The gate reads what GRPO sees: the ranking of one question's solutions (here one question, mixed).
    assert manifest["quality_gate"]["metric"] == "within_question_auc" and manifest["heldout"]["mixed_questions"] == 1
    assert manifest["quality_gate"]["passed"] == (manifest["heldout"]["within_question_auc"] >= 0.6)


@pytest.mark.parametrize("kind", ["orm", "prm"])
def test_every_reward_model_is_measured_against_the_zero_training_verifier(
    tmp_path, tiny_cfg, tiny_model_dir, reward_data, kind
):
    """``baseline``: the SFT model's own likelihood on the same held-out rows, by the same metrics; a
    reward model that does not beat it fails its gate. The trained model's ranking is also paired
    with the baseline's question by question."""
    from grpo_core.stages.reward_model import evaluate_likelihood

    cfg = tiny_cfg(tmp_path, **{f"{kind}__batch_size": 2, f"{kind}__epochs": 1})
    manifest = run_reward_model(cfg, kind, reward_data, tiny_model_dir, tmp_path / kind, baseline=tiny_model_dir)
    baseline, gate = manifest["baseline"], manifest["quality_gate"]
    paired = {f"within_question_auc_minus_baseline{end}" for end in ("", "_low", "_high")}
    assert set(baseline) == set(manifest["heldout"]) - {"pairwise_accuracy"} - paired
    held_out = "solutions" if kind == "orm" else "steps"
    from datasets import load_from_disk

    rows = load_from_disk(reward_data[held_out].path)["test"].to_list()
    expected, by_question = evaluate_likelihood(tiny_model_dir, kind, rows, "\n", 4)
    assert baseline == pytest.approx(expected, nan_ok=True) and len(by_question) == baseline["mixed_questions"]
    value = manifest["heldout"]["within_question_auc"]
    # The same rows, so the same questions ranked: the mean difference is the difference of the means.
    gain = manifest["heldout"]["within_question_auc_minus_baseline"]
    assert gain == pytest.approx(value - baseline["within_question_auc"], nan_ok=True)
    assert gate["baseline"] == pytest.approx(baseline["within_question_auc"], nan_ok=True)
    assert gate["beats_baseline"] == (value > gate["baseline"])
    assert gate["passed"] == (value >= 0.6 and gate["beats_baseline"])


def test_reward_model_init_tiny_is_a_fresh_model_of_another_shape(tmp_path, tiny_cfg, tiny_model_dir, reward_data):
    """orm.init=tiny: a new Llama of the recipe's shape with the `tiny` changes, on the SFT tokenizer."""
    from transformers import AutoConfig

    cfg = tiny_cfg(tmp_path, orm__epochs=1, orm__init="tiny", orm__tiny={"hidden_size": 48, "num_layers": 3})
    manifest = run_reward_model(cfg, "orm", reward_data, tiny_model_dir, tmp_path / "orm")
    config = AutoConfig.from_pretrained(manifest["model"])
    assert (config.hidden_size, config.num_hidden_layers) == (48, 3)
    assert manifest["init_from"] == "tiny"


def test_reward_model_init_folder_with_another_tokenizer_is_refused(tmp_path, tiny_cfg, tiny_model_dir, reward_data):
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    import shutil

    shutil.copytree(tiny_model_dir, other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    cfg = tiny_cfg(tmp_path, orm__epochs=1, orm__init=str(other))
    with pytest.raises(ValueError, match="tokenizer differs"):
        run_reward_model(cfg, "orm", reward_data, tiny_model_dir, tmp_path / "orm")


def test_reward_data_stage_writes_reloadable_splits_even_when_empty(tmp_path, tiny_cfg, tiny_model_dir, tiny_data_dir):
    """An untrained policy is never right: no pairs at all, yet every dataset reloads (0 rows)."""
    from datasets import load_from_disk

    from grpo_core.stages.reward_data import COLUMNS, run_reward_data

    cfg = tiny_cfg(
        tmp_path,
        reward_data__questions=6,
        reward_data__samples_per_question=2,
        reward_data__max_new_tokens=8,
        reward_data__mc_rollouts=1,
        reward_data__heldout_fraction=0.34,
    )
    manifest = run_reward_data(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "rd")
    for name, columns in COLUMNS.items():
        data = load_from_disk(manifest[f"{name}_dir"])
        assert set(data) == {"train", "test"}
        assert (
            len(data["train"]) + len(data["test"])
            == manifest["metrics"][f"train/n_{name}"] + manifest["metrics"][f"test/n_{name}"]
        )
    assert manifest["metrics"]["train/n_pairs"] == 0 and manifest["metrics"]["train/n_solutions"] == 4 * 2
    assert manifest["metrics"]["perf/train/step_labels_per_s"] > 0  # Monte-Carlo labels, what they cost
    assert manifest["metrics"]["train/mc_rollouts"] % cfg.reward_data.mc_rollouts == 0
    # Each sampled question's pass rate (the curriculum's): every question once, its samples counted.
    from grpo_core.stages.outputs import RewardDataOutput
    from grpo_core.stages.questions import read_pass_rates

    rates = read_pass_rates(Path(manifest["pass_rates"]) / "pass_rates.jsonl")
    assert len(rates) == 6 and all(n == 2 and right == 0 for right, n in rates.values())
    assert RewardDataOutput.model_validate(manifest).damaged() is None


def test_planted_errors_join_the_training_split_only(tmp_path, tiny_cfg, tiny_model_dir, tiny_data_dir):
    from datasets import load_from_disk

    from grpo_core.stages.reward_data import run_reward_data

    cfg = tiny_cfg(
        tmp_path,
        reward_data__questions=6,
        reward_data__samples_per_question=2,
        reward_data__max_new_tokens=8,
        reward_data__labeler="exact",
        reward_data__heldout_fraction=0.34,
        reward_data__planted_errors=3,
    )
    manifest = run_reward_data(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "rd")
    # 4 training questions x 3 planted solutions, every one wrong, each with exact step labels.
    assert manifest["metrics"]["train/planted_solutions"] == 4 * 3
    solutions = load_from_disk(manifest["solutions_dir"])
    planted = [
        r for r in solutions["train"] if r["completion"].startswith(tuple("0123456789-")) and "####" in r["completion"]
    ]
    assert len(planted) >= 4 * 3 - 4 and not any(r["correct"] for r in planted)  # (distinct: alike ones once)
    steps = load_from_disk(manifest["steps_dir"])
    assert any(False in r["labels"] for r in steps["train"])
    assert len(solutions["test"]) == 2 * 2  # held-out: the policy's own samples only


@pytest.mark.parametrize("head", ["likelihood", "lm"])
@pytest.mark.parametrize("kind", ["orm", "prm"])
def test_a_verifier_head_trains_the_models_own_weights(tmp_path, tiny_cfg, tiny_model_dir, reward_data, kind, head):
    """<kind>.head: likelihood or lm: the stage trains the SFT model itself and two calibration
    numbers, publishes a causal-LM folder, and GRPO's scorer reads it."""
    import torch

    from grpo_core.lm.modeling import load_model, load_tokenizer
    from grpo_core.lm.policy import encode
    from grpo_core.rewards.likelihood import VerifierHead
    from grpo_core.rewards.score_command import reward_model_kind
    from grpo_core.rewards.scorer import RewardScorer

    cfg = tiny_cfg(
        tmp_path, **{f"{kind}__batch_size": 2, f"{kind}__epochs": 1, f"{kind}__head": head, f"{kind}__lr": 1e-3}
    )
    manifest = run_reward_model(cfg, kind, reward_data, tiny_model_dir, tmp_path / kind)
    assert reward_model_kind(manifest["model"]) == kind and manifest["steps"] == 2
    trained, start = load_model(manifest["model"])[0], load_model(tiny_model_dir)[0]
    moved = [n for n, p in trained.named_parameters() if not torch.equal(p, dict(start.named_parameters())[n])]
    assert moved  # the model's own weights learnt (no fresh head)
    # The calibration learns at 100x the lr: Adam's first step alone moves it by that lr (0.1), at
    # the model's lr it could not pass 0.002 in two steps.
    calibration, (scale, bias) = trained.config.reward_head, VerifierHead.START[head]
    assert calibration["reading"] == head
    assert max(abs(calibration["scale"] - scale), abs(calibration["bias"] - bias)) > 0.02
    tok = load_tokenizer(tiny_model_dir)
    gc = GRPOConfig(reward_weights={kind: 1.0})
    scorer = RewardScorer.for_recipe(gc, tok, "\n", {kind: manifest["model"]})
    assert isinstance(getattr(scorer, kind), VerifierHead)
    scored = scorer(encode(tok, [Q, Q], [RIGHT, WRONG]), ["3", "3"])
    assert scored.outcome.shape == (2,) and bool(torch.isfinite(scored.outcome).all())


def test_reward_data_sampling_says_how_far_it_is(monkeypatch, capsys):
    """Each call (a split's solutions, its Monte-Carlo rollouts) speaks by its name and its own size:
    a line after the first batch, then every PROGRESS_EVERY_S, with the time that call has left."""
    import grpo_core.stages.reward_data as rd

    named = rd.said_every(lambda prompts: [p + "!" for p in prompts], "reward_data, round 2", batch=2)
    solutions = named("held-out solutions")
    assert solutions(["a", "b", "c"]) == ["a!", "b!", "c!"]
    first = capsys.readouterr().err.splitlines()  # the first batch speaks; the next, within 30 s, does not
    assert len(first) == 1 and first[0].startswith("[reward_data, round 2] 2 of 3 held-out solutions, ")
    assert first[0].endswith(" s left")
    monkeypatch.setattr(rd, "PROGRESS_EVERY_S", 0.0)  # a line at every batch
    assert named("held-out Monte-Carlo rollouts")(["d"]) == ["d!"]
    done = capsys.readouterr().err.splitlines()  # a call's last line: all of its own, no time left
    assert len(done) == 1 and done[0].startswith("[reward_data, round 2] 1 of 1 held-out Monte-Carlo rollouts, ")
    assert done[0].endswith("/s")
    # One call of a whole split's prompts speaks between its batches, and passes them on batch by batch.
    calls = []
    long = rd.said_every(lambda prompts: calls.append(len(prompts)) or prompts, "reward_data, round 1", batch=2)
    assert long("training solutions")(list("abcde")) == list("abcde") and calls == [2, 2, 1]
    lines = [line.removeprefix("[reward_data, round 1] ") for line in capsys.readouterr().err.splitlines()]
    assert [line.split(",")[0] for line in lines] == [f"{n} of 5 training solutions" for n in (2, 4, 5)]


def test_the_reward_models_held_out_questions_have_no_near_duplicate_among_their_training_ones():
    """Whole clusters of near-duplicates go to one side (the data split's own clusters), the same
    split in the same order from any order of the pool (questions of one text with other answers
    included), the held-out side within its fraction of the distinct questions; a cluster bigger than
    what is left of it goes to training."""
    from grpo_core.benchmarks import clusters
    from grpo_core.data import Example
    from grpo_core.stages.reward_data import heldout_split

    ask = "Ann has {} red apples and buys {} more. How many apples {}?"
    pool = {Example(ask.format(n, n + 3, "now"), str(2 * n + 3), idx=n) for n in range(40)}
    pool |= {Example(ask.format(n, n + 3, "does she have"), "x", idx=100 + n) for n in range(40)}  # near-duplicates
    pool |= {Example(ask.format(n, n + 3, "now"), "y", idx=200 + n) for n in range(5)}  # the same text again
    pool |= {Example(f"Bob has {k} hats. How many hats?", "9", idx=300 + k) for k in range(3)}  # 3 clusters of 1
    big = {
        Example(f"Cid has 7 pens and 9 cups. {w} pens and cups?", "16", idx=400 + i)
        for i, w in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    }
    pool |= big  # one cluster of 26, more than a fifth of the pool: never held out whole past the first
    held, train = heldout_split(pool, 0.2)
    assert sorted(held + train, key=str) == sorted(pool, key=str)
    assert len(held) <= round(len(pool) * 0.2) or len(held) == len(big)
    cluster_of = dict(zip(sorted(pool, key=str), clusters([e.question for e in sorted(pool, key=str)])))
    assert {cluster_of[e] for e in held}.isdisjoint(cluster_of[e] for e in train)
    for reordered in (sorted(pool, key=str, reverse=True), sorted(pool, key=lambda e: e.idx)):
        assert heldout_split(set(reordered), 0.2) == (held, train)

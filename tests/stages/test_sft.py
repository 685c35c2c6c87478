"""SFT stage: packing, the saved model, and resume (N steps straight == k steps, stop, resume)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.data import Example, prompt_text, read_split
from grpo_core.digests import digest_dir
from grpo_core.lm.modeling import char_tokenizer, load_model
from grpo_core.lm.packing import IGNORE, encode_examples, pack
from grpo_core.stages.sft import run_sft
from grpo_core.tracking import NullLogger
from grpo_core.training.checkpoint import MARKER, complete_checkpoints, latest_checkpoint, load_state, save_checkpoint


def _state(path: Path) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_weights(a: Path, b: Path) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    diff = {k: float((sa[k] - sb[k]).abs().max()) for k in sa if not torch.equal(sa[k], sb[k])}
    assert not diff, f"weights differ (max abs diff per tensor): {diff}"


def _train_losses(logger: NullLogger) -> dict[int, float]:
    return {step: m["train/loss"] for step, m in logger.history if "train/loss" in m}


# ---------------------------------------------------------------------------- packing


@pytest.fixture(scope="module")
def encoded_examples(tiny_data_dir):
    tok = char_tokenizer()
    examples = read_split(tiny_data_dir, "sft")[:12]
    return tok, examples


@pytest.mark.parametrize("loss_on_prompt", [True, False])
def test_pack_holds_every_example_once(encoded_examples, loss_on_prompt):
    tok, examples = encoded_examples
    encoded = encode_examples(examples, tok, loss_on_prompt)
    ids, labels = pack(encoded, 64, tok.pad_token_id, random.Random(3))
    assert ids.shape == labels.shape and ids.shape[1] == 64
    flat_ids, flat_labels = ids.flatten().tolist(), labels.flatten().tolist()
    total = sum(len(e[0]) for e in encoded)
    assert ids.shape[0] == -(-total // 64)  # as few rows as fit
    # Only the tail of the last row is padding (ignored by the loss).
    assert set(flat_ids[total:]) <= {tok.pad_token_id} and set(flat_labels[total:]) <= {IGNORE}
    # Split the stream at BOS (which only starts examples): every example appears exactly once.
    pieces, cur = [], None
    for i, (t, lab) in enumerate(zip(flat_ids[:total], flat_labels[:total])):
        if t == tok.bos_token_id:
            cur = ([], [])
            pieces.append(cur)
        cur[0].append(t)
        cur[1].append(lab)
    assert Counter(tuple(p[0]) for p in pieces) == Counter(tuple(e[0]) for e in encoded)
    assert Counter((tuple(p[0]), tuple(p[1])) for p in pieces) == Counter((tuple(e[0]), tuple(e[1])) for e in encoded)
    # The order is shuffled by the rng, reproducibly.
    again, _ = pack(encoded, 64, tok.pad_token_id, random.Random(3))
    assert torch.equal(ids, again)
    in_order, _ = pack(encoded, 64, tok.pad_token_id, None)
    assert in_order.flatten().tolist()[:total] == [t for e in encoded for t in e[0]]
    assert not torch.equal(in_order, ids)


def test_encode_masks_prompt_labels_unless_loss_on_prompt():
    tok = char_tokenizer()
    ex = Example(question="What is 2 + 3?", gold="5", solution="2 + 3 = 5\n#### 5")
    n_prompt = len(prompt_text(ex.question))  # one token per character
    ((ids, labels),) = encode_examples([ex], tok, loss_on_prompt=False)
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert len(ids) == 1 + n_prompt + len(ex.solution) + 1
    assert labels[: 1 + n_prompt] == [IGNORE] * (1 + n_prompt)
    assert labels[1 + n_prompt :] == ids[1 + n_prompt :]
    assert tok.decode(labels[1 + n_prompt : -1]) == ex.solution
    ((ids2, labels2),) = encode_examples([ex], tok, loss_on_prompt=True)
    assert ids2 == ids and labels2 == ids
    # Examples without a worked solution (RL-only) are skipped.
    assert encode_examples([Example("What is 1 + 1?", "2")], tok, True) == []


def test_packed_prompt_labels_masked(encoded_examples):
    tok, examples = encoded_examples
    ids, labels = pack(encode_examples(examples, tok, False), 64, tok.pad_token_id, random.Random(0))
    flat_ids, flat_labels = ids.flatten().tolist(), labels.flatten().tolist()
    # Inside every example, labels are IGNORE from BOS through "Answer:\n" and equal ids after it.
    answer_tail = tok("Answer:\n", add_special_tokens=False).input_ids
    starts = [i for i, t in enumerate(flat_ids) if t == tok.bos_token_id]
    for s in starts:
        j = s
        while flat_ids[j - len(answer_tail) + 1 : j + 1] != answer_tail:
            assert flat_labels[j] == IGNORE
            j += 1
        assert flat_labels[j] == IGNORE
        k = j + 1
        while flat_ids[k] != tok.eos_token_id:
            assert flat_labels[k] == flat_ids[k]
            k += 1
        assert flat_labels[k] == tok.eos_token_id


# ---------------------------------------------------------------------------- checkpoints


def test_checkpoint_rotation_and_incomplete_folders_ignored(tmp_path, tiny_model_dir):
    model, tok = load_model(tiny_model_dir)
    root = tmp_path / "ckpt"
    for step in (1, 2, 3):
        save_checkpoint(root, step, model, tok, {"step": step}, keep=2)
    done = complete_checkpoints(root)
    assert [p.name for p in done] == ["step-00000002", "step-00000003"]
    assert load_state(done[-1]) == {"step": 3}
    # A crash mid-write leaves a folder without the marker (or a temporary folder): never loaded.
    (root / "step-00000009").mkdir()
    (root / ".tmp-step-00000010").mkdir()
    assert latest_checkpoint(root) == root / "step-00000003"
    (root / "step-00000003" / MARKER).unlink()
    assert latest_checkpoint(root) == root / "step-00000002"
    assert latest_checkpoint(tmp_path / "absent") is None


# ---------------------------------------------------------------------------- run_sft


def test_run_sft_writes_loadable_model_and_manifest(tmp_path, tiny_cfg, tiny_data_dir):
    cfg = tiny_cfg(tmp_path, sft__max_steps=3, sft__eval_every=2)
    log = NullLogger()
    manifest = run_sft(cfg, tiny_data_dir, tmp_path / "sft", log)
    on_disk = json.loads((tmp_path / "sft" / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["stage"] == "sft" and manifest["steps"] == 3
    assert manifest["model"] == str(tmp_path / "sft" / "model")
    assert manifest["best_step"] in (2, 3) and 0.0 <= manifest["best_val_accuracy"] <= 1.0
    assert manifest["n_train_examples"] == 40
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "sft" / "model")
    tok = AutoTokenizer.from_pretrained(tmp_path / "sft" / "model")
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert tok.decode(tok("What is 1 + 2?", add_special_tokens=False).input_ids) == "What is 1 + 2?"
    with torch.no_grad():
        out = model(**tok(["<bos>Question:"], return_tensors="pt", add_special_tokens=False))
    assert out.logits.shape[-1] == len(tok)
    # Metrics: one train/loss per step, validation only at eval_every (an extra evaluation at the
    # last step would change the best-so-far and so break resume equivalence).
    assert sorted(_train_losses(log)) == [1, 2, 3]
    assert [s for s, m in log.history if "val/accuracy" in m] == [2]
    assert all(m["train/lr"] == cfg.sft.lr for _, m in log.history if "train/lr" in m)


def test_sft_loss_goes_down(tmp_path, tiny_cfg, tiny_data_dir):
    cfg = tiny_cfg(tmp_path, sft__max_steps=8, sft__eval_every=100, sft__checkpoint_every=100)
    log = NullLogger()
    run_sft(cfg, tiny_data_dir, tmp_path / "sft", log)
    losses = _train_losses(log)
    assert losses[8] < losses[1]


DATA_COUNTERS = ("step", "epoch", "row", "tokens")
ALL_COUNTERS = DATA_COUNTERS + ("best_step", "best_acc", "plateau_lr", "bad_evals")


def _check_resumed_equals_straight(
    tmp_path: Path, log_a, log_b1, log_b2, stop: int, n: int, counters: tuple[str, ...] = ALL_COUNTERS
) -> None:
    la = _train_losses(log_a)
    assert sorted(la) == list(range(1, n + 1))
    # The second leg resumed (it logged the remaining steps only) and reproduced the straight run.
    assert sorted(_train_losses(log_b2)) == list(range(stop + 1, n + 1))
    lr_a = {s: m["train/lr"] for s, m in log_a.history if "train/lr" in m}
    lr_b = {s: m["train/lr"] for s, m in log_b1.history + log_b2.history if "train/lr" in m}
    assert lr_b == lr_a, "learning rates differ"
    assert {**_train_losses(log_b1), **_train_losses(log_b2)} == la, "losses differ"
    last = f"step-{n:08d}"
    _assert_same_weights(tmp_path / "A" / "checkpoints" / last, tmp_path / "B" / "checkpoints" / last)
    _assert_same_weights(tmp_path / "A" / "model", tmp_path / "B" / "model")
    sa = load_state(tmp_path / "A" / "checkpoints" / last)
    sb = load_state(tmp_path / "B" / "checkpoints" / last)
    for k in counters:
        assert sa["counters"][k] == sb["counters"][k], k
    assert not (tmp_path / "B" / "checkpoints.stale-0").exists()


def test_sft_resume_equals_straight_run(tmp_path, tiny_cfg, tiny_data_dir):
    """8 steps straight == 3 steps (max_steps=3), then the same out dir with max_steps=8: same
    weights bit for bit, same losses.

    The 40 examples pack into 21 rows of 128 tokens: with batch 4 the run stops mid-epoch (row 12)
    and crosses an epoch boundary at step 7 after the resume, so the resumed run must restore the
    data position, the epoch counter and the epoch's shuffle.
    """
    common = dict(sft__checkpoint_every=1, sft__eval_every=2)
    cfg_full = tiny_cfg(tmp_path, sft__max_steps=8, **common)
    log_a, log_b1, log_b2 = NullLogger(), NullLogger(), NullLogger()
    a = run_sft(cfg_full, tiny_data_dir, tmp_path / "A", log_a)
    assert a["epochs"] == 1, "the test should cross an epoch boundary"
    b1 = run_sft(tiny_cfg(tmp_path, sft__max_steps=3, **common), tiny_data_dir, tmp_path / "B", log_b1)
    assert b1["steps"] == 3 and b1["epochs"] == 0
    b2 = run_sft(cfg_full, tiny_data_dir, tmp_path / "B", log_b2)
    assert b2["steps"] == 8 and b2["epochs"] == 1
    # Only the data counters: leg 1's closing validation at its max_steps (step 3) feeds the
    # plateau/patience controller, which a straight run never does (see the plateau test below).
    _check_resumed_equals_straight(tmp_path, log_a, log_b1, log_b2, stop=3, n=8, counters=DATA_COUNTERS)


class Crash(Exception):
    pass


class CrashingLogger(NullLogger):
    """Raises on the first metrics of step ``at``: after that step's update, before its checkpoint,
    like a process killed mid-run."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def log_metrics(self, metrics, step=None):
        if step == self.at and "train/loss" in metrics:
            raise Crash(step)
        super().log_metrics(metrics, step)


@pytest.mark.parametrize("schedule", ["constant", "cosine", "plateau"])
def test_sft_resume_after_crash_equals_straight_run(tmp_path, tiny_cfg, tiny_data_dir, schedule):
    """The same recipe (8 steps) killed during step 4 (last checkpoint: step 3) and started again."""
    cfg = tiny_cfg(
        tmp_path, sft__max_steps=8, sft__checkpoint_every=1, sft__eval_every=2, sft__schedule=schedule, sft__min_lr=1e-4
    )
    log_a, log_b1, log_b2 = NullLogger(), NullLogger(), NullLogger()
    run_sft(cfg, tiny_data_dir, tmp_path / "A", log_a)
    crashing = CrashingLogger(at=4)
    with pytest.raises(Crash):
        run_sft(cfg, tiny_data_dir, tmp_path / "B", crashing)
    assert latest_checkpoint(tmp_path / "B" / "checkpoints").name == "step-00000003"
    log_b1.history = crashing.history
    run_sft(cfg, tiny_data_dir, tmp_path / "B", log_b2)
    _check_resumed_equals_straight(tmp_path, log_a, log_b1, log_b2, stop=3, n=8)


@pytest.mark.parametrize("schedule", ["plateau"])
def test_sft_extending_a_plateau_run_equals_straight_run(tmp_path, tiny_cfg, tiny_data_dir, schedule):
    """Stopping at max_steps=3 and extending to 8 must give what 8 steps straight give, for the
    reduce-on-plateau schedule too (max_steps is a budget field: extending keeps the checkpoints).

    Only the regular evaluations (multiples of eval_every) drive the plateau controller
    (bad_evals, plateau_lr); an extra evaluation at leg 1's last step (3) would change the lr the
    extended run trains at.
    """
    common = dict(sft__checkpoint_every=1, sft__eval_every=2, sft__schedule=schedule, sft__min_lr=1e-4)
    cfg_full = tiny_cfg(tmp_path, sft__max_steps=8, **common)
    log_a, log_b1, log_b2 = NullLogger(), NullLogger(), NullLogger()
    run_sft(cfg_full, tiny_data_dir, tmp_path / "A", log_a)
    run_sft(tiny_cfg(tmp_path, sft__max_steps=3, **common), tiny_data_dir, tmp_path / "B", log_b1)
    run_sft(cfg_full, tiny_data_dir, tmp_path / "B", log_b2)
    _check_resumed_equals_straight(tmp_path, log_a, log_b1, log_b2, stop=3, n=8)


def test_sft_checkpoints_of_another_recipe_are_set_aside(tmp_path, tiny_cfg, tiny_data_dir, capsys):
    out = tmp_path / "sft"
    run_sft(tiny_cfg(tmp_path, sft__max_steps=2, sft__checkpoint_every=1), tiny_data_dir, out)
    old = sorted(p.name for p in (out / "checkpoints").iterdir())
    log = NullLogger()
    # A different learning rate is another recipe: its checkpoints must not be resumed.
    manifest = run_sft(
        tiny_cfg(tmp_path, sft__max_steps=3, sft__checkpoint_every=1, sft__lr=5e-4), tiny_data_dir, out, log
    )
    assert "moved to" in capsys.readouterr().err
    stale = out / "checkpoints.stale-0"
    assert stale.is_dir() and sorted(p.name for p in stale.iterdir()) == old
    assert sorted(_train_losses(log)) == [1, 2, 3]  # a fresh start, not a resume from step 2
    assert manifest["steps"] == 3
    assert latest_checkpoint(out / "checkpoints").name == "step-00000003"
    # A second mismatch does not overwrite the first set-aside folder.
    run_sft(tiny_cfg(tmp_path, sft__max_steps=1, sft__lr=2e-4), tiny_data_dir, out)
    assert (out / "checkpoints.stale-1").is_dir() and stale.is_dir()


@pytest.mark.parametrize("stop", ["patience", "max_seconds"])
def test_rerunning_a_stopped_sft_does_not_train_again(tmp_path, tiny_cfg, tiny_data_dir, stop):
    """A run that stopped early (patience, or its time budget) and is started again with the same
    recipe (e.g. the pipeline re-running a stage whose manifest went missing) must not train further:
    it should return the same result, as a run that reached max_steps does."""
    budget = {"patience": dict(sft__patience=1, sft__eval_every=1), "max_seconds": dict(sft__max_seconds=1e-3)}[stop]
    cfg = tiny_cfg(tmp_path, sft__max_steps=20, sft__checkpoint_every=100, **budget)
    first = run_sft(cfg, tiny_data_dir, tmp_path / "sft")
    assert first["steps"] < 20 and first["stopped"] != "max_steps reached"
    log = NullLogger()
    again = run_sft(cfg, tiny_data_dir, tmp_path / "sft", log)
    assert _train_losses(log) == {}, f"the re-run trained steps {sorted(_train_losses(log))}"
    assert again["steps"] == first["steps"]


@pytest.mark.parametrize("max_steps", [4, 3])
def test_rerunning_a_finished_sft_does_not_train_again(tmp_path, tiny_cfg, tiny_data_dir, max_steps):
    """A run that reached max_steps, started again, returns without training (GRPO checkpoints its
    last step for this; with max_steps=3 and checkpoint_every=2 SFT's last checkpoint is step 2)."""
    cfg = tiny_cfg(tmp_path, sft__max_steps=max_steps, sft__checkpoint_every=2)
    first = run_sft(cfg, tiny_data_dir, tmp_path / "sft")
    digest = digest_dir(tmp_path / "sft" / "model")
    log = NullLogger()
    again = run_sft(cfg, tiny_data_dir, tmp_path / "sft", log)
    assert _train_losses(log) == {}, f"the re-run trained steps {sorted(_train_losses(log))}"
    assert again["steps"] == first["steps"] == max_steps
    assert digest_dir(tmp_path / "sft" / "model") == digest


def test_plateau_decays_only_after_decay_patience_evaluations(tmp_path, tiny_cfg, tiny_data_dir):
    """decay_patience=2: the lr halves after every second evaluation without improvement.

    A tiny model after a few steps answers nothing correctly, so validation accuracy is 0.0 at every
    evaluation: eval 1 improves on -1 (the initial best), evals 2.. do not. The lr used at step s is
    the one in force after eval s-1: steps 1-3 at 1e-3, bad evals 2 and 3 -> one decay -> steps 4-5
    at 5e-4, bad eval 5 (the 4th bad one) -> step 6 at 2.5e-4.
    """
    cfg = tiny_cfg(
        tmp_path, sft__max_steps=6, sft__eval_every=1, sft__schedule="plateau", sft__decay_patience=2, sft__lr=1e-3
    )
    log = NullLogger()
    run_sft(cfg, tiny_data_dir, tmp_path / "sft", log)
    accs = [m["val/accuracy"] for _, m in log.history if "val/accuracy" in m]
    assert accs == [0.0] * 6
    lrs = {step: m["train/lr"] for step, m in log.history if "train/lr" in m}
    assert [lrs[s] for s in range(1, 7)] == pytest.approx([1e-3, 1e-3, 1e-3, 5e-4, 5e-4, 2.5e-4])


# ---------------------------------------------------------------------------- packing: documents


def test_document_positions_restart_after_each_end_token():
    from grpo_core.stages.lm_step import document_positions

    eos = 9
    ids = torch.tensor([[5, 6, 9, 7, 7, 7, 9, 0], [7, 9, 9, 5, 5, 5, 5, 5]])
    assert document_positions(ids, eos).tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 0, 0, 1, 2, 3, 4]]


def test_documents_packing_reads_each_example_as_if_alone(tiny_model_dir):
    """packing: documents - the loss of a packed row is the sum of its examples' losses each in a row
    of its own (attention within the example, positions from 0); concatenate differs (the second
    example sees the first)."""
    from grpo_core.stages.lm_step import lm_loss

    model, tok = load_model(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    examples = [
        Example("What is 2 + 3?", "5", "2 + 3 = 5\n#### 5"),
        Example("What is 9 - 4 - 1?", "4", "9 - 4 = 5\n5 - 1 = 4\n#### 4"),
    ]
    encoded = encode_examples(examples, tok, loss_on_prompt=True)
    ids, labels = pack(encoded, 128, tok.pad_token_id, rng=None)
    assert len(ids) == 1  # both in one row
    alone = [pack([e], 128, tok.pad_token_id, rng=None) for e in encoded]
    with torch.no_grad():
        separate = sum(float(lm_loss(model, i, lab)[0]) for i, lab in alone)
        documents = float(lm_loss(model, ids, labels, eos_id=tok.eos_token_id)[0])
        concatenated = float(lm_loss(model, ids, labels)[0])
    assert documents == pytest.approx(separate, rel=1e-5)
    assert abs(concatenated - separate) > 1e-3


def test_the_loss_shifts_its_targets_not_its_logits_and_every_gradient_is_the_same(tiny_model_dir):
    """lm_loss reads the logits of every position (the last one's target -100) instead of a shifted
    copy of them: the same loss, and bit for bit the same gradient of every weight as the loss read
    from the shifted logits, so that SFT trains the same model with one [B, T, V] copy less."""
    import torch.nn.functional as F

    from grpo_core.stages.lm_step import document_positions, lm_loss

    model, tok = load_model(tiny_model_dir)
    examples = [
        Example("What is 2 + 3?", "5", "2 + 3 = 5\n#### 5"),
        Example("What is 9 - 4 - 1?", "4", "9 - 4 = 5\n5 - 1 = 4\n#### 4"),
        Example("What is 6 * 7?", "42", "6 * 7 = 42\n#### 42"),
    ]
    ids, labels = pack(encode_examples(examples, tok, loss_on_prompt=False), 48, tok.pad_token_id, rng=None)
    eos = tok.eos_token_id

    def grads(loss) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    targets = labels[:, 1:].masked_fill(ids[:, :-1] == eos, -100)  # the shifted form, by hand
    logits = model(input_ids=ids, position_ids=document_positions(ids, eos), use_cache=False).logits[:, :-1]
    shifted = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
    expected = grads(shifted)
    loss, n_tokens = lm_loss(model, ids, labels, eos_id=eos)
    assert n_tokens == float((targets != -100).sum()) and float(loss.detach()) == pytest.approx(
        float(shifted.detach()), rel=1e-6
    )
    assert all(torch.equal(a, b) for a, b in zip(grads(loss), expected))


def test_with_the_calculator_sft_learns_the_lines_not_the_results():
    """The solution in the calculator's form (a wrong result replaced by its), every result it writes
    left out of the labels; the rest of the text learnt as before."""
    tok = char_tokenizer()
    ex = Example(question="What is 2 * 6?", gold="12", solution="2 * 6 = 11\n#### 12")
    n_prompt = 1 + len(prompt_text(ex.question))  # BOS, then one token per character
    ((ids, labels),) = encode_examples([ex], tok, loss_on_prompt=False, calculator=True)
    assert tok.decode(ids[n_prompt:-1]) == "2 * 6 = 12\n#### 12"
    learnt = "".join(tok.decode([t]) if t != IGNORE else "_" for t in labels[n_prompt:-1])
    assert learnt == "2 * 6 =___\n#### 12"  # " 12" is the calculator's
    assert labels[-1] == tok.eos_token_id
    ((plain_ids, plain_labels),) = encode_examples([ex], tok, loss_on_prompt=False)
    assert tok.decode(plain_ids[n_prompt:-1]) == ex.solution and IGNORE not in plain_labels[n_prompt:]


def test_sft_with_the_calculator_saves_it_with_the_model_and_its_samplers_use_it(tmp_path, tiny_cfg, tiny_data_dir):
    from grpo_core.lm.policy import generate

    cfg = tiny_cfg(tmp_path, sft__max_steps=2, sft__eval_every=2, model__calculator=True)
    run_sft(cfg, tiny_data_dir, tmp_path / "sft", NullLogger())
    model, tok = load_model(tmp_path / "sft" / "model")
    assert model.config.calculator is True
    rollout = generate(model, tok, [prompt_text("What is 1 + 2?")], max_new_tokens=4)
    assert rollout.tool_mask is not None  # the calculator on, by the model's own setting
    assert generate(model, tok, [prompt_text("What is 1 + 2?")], max_new_tokens=4, calculator=False).tool_mask is None

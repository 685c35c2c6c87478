"""Resume equivalence under a hard kill: each training stage runs N steps straight in one process,
and in another it is SIGKILLed (no exception handler, no cleanup) right after checkpoint k, or while
checkpoint k is being written, then run again. The re-run resumes from the last complete
checkpoint and logs the same losses, step for step, and ends with the same weights, bit for bit
(CPU, the same thread count: nothing in these stages depends on timing)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict
from safetensors.torch import load_file

from grpo_core.data import prompt_text
from grpo_core.digests import digest_dir
from grpo_core.training.checkpoint import complete_checkpoints

WORKER = Path(__file__).with_name("stage_worker.py")

STAGES = {  # overrides, and the checkpoint the kill follows
    "sft": ({"sft__max_steps": 6, "sft__checkpoint_every": 2, "sft__eval_every": 2}, 4),
    "grpo": ({"grpo__max_steps": 4, "grpo__checkpoint_every": 1, "grpo__eval_every": 2, "grpo__beta": 0.04}, 2),
    "orm": ({"orm__batch_size": 2, "orm__epochs": 2, "orm__lr": 1e-3, "orm__checkpoint_every": 1}, 3),
    "prm": ({"prm__batch_size": 2, "prm__epochs": 2, "prm__lr": 1e-3, "prm__checkpoint_every": 1}, 3),
    "prm-likelihood": (
        {
            "prm__batch_size": 2,
            "prm__epochs": 2,
            "prm__lr": 1e-3,
            "prm__checkpoint_every": 1,
            "prm__head": "likelihood",
        },
        3,
    ),
}


@pytest.fixture(scope="module")
def reward_data(tmp_path_factory) -> dict:
    """Hand-made reward data in the reward-data stage's format (4 training rows: 2 steps an epoch)."""
    root = tmp_path_factory.mktemp("reward_data")

    def step_row(q, text, labels):
        return {
            "prompt": q,
            "completions": text.split("\n"),
            "labels": labels,
            "soft_labels": [float(x) for x in labels],
            "exact_labels": labels,
            "completion": text,
        }

    # Distinct rows, so that a resume at the wrong batch or in another order changes the losses.
    pairs, solutions, steps = [], [], []
    for a, b in ((7, 5), (3, 4), (9, 1), (2, 8), (6, 6)):
        q = prompt_text(f"What is {a} + {b} - 1?")
        right, wrong = (
            f"{a} + {b} = {a + b}\n{a + b} - 1 = {a + b - 1}\n#### {a + b - 1}",
            f"{a} + {b} = {a + b + 1}\n{a + b + 1} - 1 = {a + b}\n#### {a + b}",
        )
        pairs.append({"prompt": q, "chosen": right, "rejected": wrong})
        solutions += [
            {"prompt": q, "completion": right, "correct": True},
            {"prompt": q, "completion": wrong, "correct": False},
        ]
        steps += [step_row(q, right, [True] * 3), step_row(q, wrong, [False] * 3)]
    out = {}
    for name, train, test in (
        ("pairs", pairs[:4], pairs[4:]),
        ("solutions", solutions[:8], solutions[8:]),
        ("steps", steps[:4], steps[8:]),
    ):
        DatasetDict({"train": Dataset.from_list(train), "test": Dataset.from_list(test)}).save_to_disk(str(root / name))
        out[f"{name}_dir"], out[f"{name}_digest"] = str(root / name), digest_dir(root / name, "*.arrow")
    return out


def _run(tmp_path: Path, stage: str, out: str, deps: dict, kill: dict | None = None) -> int:
    spec = {
        "stage": stage,
        "root": str(tmp_path),
        "out": str(tmp_path / out),
        "overrides": STAGES[stage][0],
        "kill": kill,
        **deps,
    }
    path = tmp_path / f"{out}-{len(list(tmp_path.glob(out + '-*.json')))}.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, str(WORKER), str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr[-3000:]
    return done.returncode


def _losses(tmp_path: Path, out: str) -> dict[int, float]:
    """step -> train/loss; a step logged twice (redone after a resume) must repeat its loss exactly."""
    seen: dict[int, float] = {}
    for line in (tmp_path / f"{out}.metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "train/loss" in record:
            step, loss = record["step"], record["train/loss"]
            assert seen.setdefault(step, loss) == loss, f"step {step} redone with another loss"
    return seen


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(next(folder.glob("*.safetensors"))))


def _assert_same_end(a: Path, b: Path) -> None:
    last_a, last_b = complete_checkpoints(a / "checkpoints")[-1], complete_checkpoints(b / "checkpoints")[-1]
    assert last_a.name == last_b.name
    for x, y in ((last_a, last_b), (a / "best", b / "best")):
        wa, wb = _weights(x), _weights(y)
        assert wa.keys() == wb.keys()
        different = [k for k in wa if not torch.equal(wa[k], wb[k])]
        assert not different, f"{x.name}: {different}"


@pytest.mark.parametrize(
    "stage, kill",
    [
        ("sft", "after_checkpoint"),
        ("sft", "while_writing"),
        ("grpo", "after_checkpoint"),
        ("grpo", "while_writing"),
        ("orm", "after_checkpoint"),
        ("prm", "after_checkpoint"),
        ("prm-likelihood", "after_checkpoint"),
    ],
)
def test_a_hard_kill_then_a_rerun_equals_a_straight_run(
    tmp_path, tiny_data_dir, tiny_model_dir, reward_data, stage, kill
):
    deps = {"data_dir": str(tiny_data_dir), "model_dir": str(tiny_model_dir), "reward_data": reward_data}
    at = STAGES[stage][1]
    assert _run(tmp_path, stage, "straight", deps) == 0
    assert _run(tmp_path, stage, "killed", deps, kill={kill: at}) == -signal.SIGKILL
    ckpts = tmp_path / "killed" / "checkpoints"
    names = [p.name for p in complete_checkpoints(ckpts)]
    if kill == "after_checkpoint":
        assert names[-1] == f"step-{at:08d}"
    else:  # the half-written checkpoint is left as a temporary folder and never taken for one
        assert (ckpts / f".tmp-step-{at:08d}").is_dir() and f"step-{at:08d}" not in names
    before_rerun = _losses(tmp_path, "killed")
    assert max(before_rerun) == at  # the kill really came mid-run
    assert _run(tmp_path, stage, "killed", deps) == 0
    straight, resumed = _losses(tmp_path, "straight"), _losses(tmp_path, "killed")
    assert resumed == straight and len(straight) > at
    _assert_same_end(tmp_path / "straight", tmp_path / "killed")
    manifest = json.loads((tmp_path / "killed" / "manifest.json").read_text())
    if "resumed_from_step" in manifest:  # SFT and GRPO report it
        every = STAGES[stage][0][f"{stage}__checkpoint_every"]
        assert manifest["resumed_from_step"] == (at if kill == "after_checkpoint" else at - every)


def test_a_same_step_rewrite_interrupted_between_its_renames_is_finished(tmp_path, tiny_model_dir):
    """save_checkpoint moves an existing step-N aside before renaming the new copy into place; a
    crash in between leaves .old-step-N and .tmp-step-N. The next listing restores step-N: the new
    copy when its marker says it is complete, else the old one."""
    from grpo_core.lm.modeling import load_model
    from grpo_core.training.checkpoint import MARKER, save_checkpoint

    model, tok = load_model(tiny_model_dir)
    root = tmp_path / "checkpoints"
    for new_complete in (True, False):
        final = save_checkpoint(root, 2, model, tok, {"which": "old"}, keep=2)
        new = root / ".tmp-step-00000002"
        shutil.copytree(final, new)
        torch.save({"which": "new"}, new / "trainer_state.pt")
        if not new_complete:
            (new / MARKER).unlink()
        final.rename(root / ".old-step-00000002")
        [restored] = complete_checkpoints(root)
        expected = "new" if new_complete else "old"
        assert restored.name == "step-00000002"
        assert torch.load(restored / "trainer_state.pt", weights_only=False)["which"] == expected
        assert not (root / ".old-step-00000002").exists()
        for leftover in root.glob(".tmp-*"):  # the unused new copy, for the second round
            shutil.rmtree(leftover)

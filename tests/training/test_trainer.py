"""The one training loop, on a model it knows nothing of: checkpoint and evaluation cadence, keep-best,
the plateau schedule and patience, epochs, and resume equal to a straight run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_core.recipe import load_config
from grpo_core.training.checkpoint import complete_checkpoints
from grpo_core.training.distributed import Dist
from grpo_core.training.trainer import Plan, Trainer, optimizer_step
from grpo_core.tracking import NullLogger


class Tiny(torch.nn.Linear):
    def save_pretrained(self, path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "weights.pt")


class Tokenizer:
    def save_pretrained(self, path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)


def _trainer(tmp_path, plan: Plan, *sets: str, log=None):
    torch.manual_seed(0)
    cfg = load_config(None, [*sets, "sft.keep_checkpoints=100"])
    trainer = Trainer(cfg, "sft", tmp_path, {"test": 1}, Dist(), log or NullLogger())
    model = Tiny(2, 1)
    if trainer.resume is not None:
        model.load_state_dict(torch.load(trainer.resume / "weights.pt"))
    trainer.start(model, Tokenizer(), plan)
    x = torch.tensor([[1.0, 2.0]])

    def step(st):  # epochs of 3 batches; the loss pulls the output towards 1
        st.row += 1
        if st.row == 3:
            st.epoch, st.row = st.epoch + 1, 0
        loss = (model(x) - 1.0).pow(2).sum()
        return {
            "train/loss": loss.item(),
            "train/grad_norm": optimizer_step(trainer.model, trainer.opt, loss, 1.0, trainer.sc.max_grad_norm),
        }

    return trainer, step


def _steps(root: Path) -> list[int]:
    return [int(p.name.removeprefix("step-")) for p in complete_checkpoints(root / "checkpoints")]


def test_checkpoints_on_the_grid_and_at_the_end_not_at_epoch_ends(tmp_path):
    trainer, step = _trainer(tmp_path, Plan(max_steps=10), "sft.checkpoint_every=4")
    st = trainer.fit(step)
    assert (st.step, st.epoch, trainer.stop_reason()) == (10, 3, "max_steps reached")
    assert _steps(tmp_path) == [4, 8, 10]


def test_per_epoch_plans_evaluate_and_checkpoint_when_an_epoch_ends(tmp_path):
    seen = []
    trainer, step = _trainer(
        tmp_path, Plan(max_epochs=2, per_epoch=True, keep_best="score"), "sft.checkpoint_every=100"
    )
    st = trainer.fit(step, lambda st: seen.append(st.step) or {"score": float(st.step)})
    assert seen == [3, 6] and _steps(tmp_path) == [3, 6]
    assert (st.best_acc, st.best_step, trainer.stop_reason()) == (6.0, 6, "epochs done")
    assert (tmp_path / "best" / "weights.pt").exists()


def test_plateau_halves_the_lr_and_patience_stops(tmp_path):
    """Scores 0.5, 0.5, 0.5: the first evaluation improves on nothing, the next two do not; with
    decay_patience 1 each halves the lr, and patience 2 stops the run at the third evaluation."""
    log = NullLogger()
    plan = Plan(max_steps=100, eval_every=2, keep_best="score", patience=2, decay_patience=1, decay_factor=0.5)
    trainer, step = _trainer(tmp_path, plan, "sft.schedule=plateau", "sft.lr=0.1", log=log)
    st = trainer.fit(step, lambda st: {"score": 0.5})
    assert (st.step, st.bad_evals, trainer.stop_reason()) == (
        6,
        2,
        "validation accuracy did not improve for 2 evaluations",
    )
    lrs = [m["train/lr"] for s, m in log.history if "train/lr" in m]
    assert lrs == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
    assert st.best_step == 2 and _steps(tmp_path)[-1] == 6


def test_resuming_an_extended_run_equals_the_straight_run(tmp_path, capsys):
    straight, step = _trainer(tmp_path / "a", Plan(max_steps=7), "sft.checkpoint_every=1")
    a = straight.fit(step)
    first, step = _trainer(tmp_path / "b", Plan(max_steps=4), "sft.checkpoint_every=1")
    first.fit(step)
    capsys.readouterr()
    again, step = _trainer(tmp_path / "b", Plan(max_steps=7), "sft.checkpoint_every=1")
    assert again.resume is not None and again.state.step == 4
    assert f"[sft] resuming from step 4 ({tmp_path / 'b' / 'checkpoints' / 'step-00000004'})" in capsys.readouterr().err
    b = again.fit(step)
    assert (a.step, a.epoch, a.row) == (b.step, b.epoch, b.row)
    assert torch.equal(straight.model.weight, again.model.weight)


def test_a_progress_line_says_where_a_stage_is_and_how_long_is_left():
    from grpo_core.training.trainer import Plan, TrainState, progress_line

    st = TrainState(step=120, epoch=1, elapsed=70.0, eval_s=10.0)  # 60 s of training: 2 steps/s
    assert (
        progress_line("prm", st, Plan(max_steps=400, max_epochs=3), None)
        == "[prm] step 120/400, epoch 2/3, 2.00 steps/s, about 2 min left"
    )
    assert progress_line("grpo", st, Plan(max_steps=400), 80.0) == "[grpo] step 120/400, 2.00 steps/s, about 20 s left"
    assert progress_line("sft", st, Plan(), None) == "[sft] step 120, 2.00 steps/s"
    # A reward model's budget is in epochs: its total steps from the epoch's length (3 x 60 = 180).
    assert (
        progress_line("orm", st, Plan(max_epochs=3, steps_per_epoch=60), None)
        == "[orm] step 120/180, epoch 2/3, 2.00 steps/s, about 30 s left"
    )


def test_an_optimizer_step_frees_the_gradients_it_applied():
    """Gradients are not held between steps (through the next rollout and forward): after the update
    every parameter's grad is None, and the update is the one the gradient asked for."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = model.weight.detach().clone()
    x = torch.tensor([[1.0, 2.0]])
    loss = model(x).sum()
    norm = optimizer_step(model, opt, loss, 1.0, 100.0)
    assert all(p.grad is None for p in model.parameters())
    assert norm == pytest.approx((1 + 4 + 1) ** 0.5)  # d/dw = x, d/db = 1
    assert torch.allclose(model.weight, before - 0.5 * x)

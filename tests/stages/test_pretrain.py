"""Continued pretraining: the multi-step schedule by hand, and a short run that learns and resumes."""

from __future__ import annotations

import gzip
import json

import pytest

from grpo_core.config import PretrainConfig
from grpo_core.training.schedules import multistep
from grpo_core.tracking import NullLogger


def test_multistep_schedule_by_hand():
    pc = PretrainConfig(lr=1.0, warmup_steps=4, max_steps=100)
    # warmup: (step + 1) / 4 of the peak
    assert [multistep(pc, s, None) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert multistep(pc, 79, None) == 1.0  # the peak until 80% of training
    assert multistep(pc, 80, None) == pytest.approx(0.316)  # 31.6% from 80%
    assert multistep(pc, 89, None) == pytest.approx(0.316)
    assert multistep(pc, 90, None) == pytest.approx(0.1)  # 10% from 90%
    assert multistep(PretrainConfig(lr=2.0, warmup_steps=0, max_steps=10), 0, None) == 2.0


def test_pretraining_lowers_the_loss_and_resumes(tmp_path, tiny_cfg):
    from grpo_core.stages.pretrain import run_pretrain

    (tmp_path / "corpus").mkdir()
    with gzip.open(tmp_path / "corpus" / "part-00000.jsonl.gz", "wt") as f:
        for i in range(40):
            f.write(json.dumps({"url": f"u{i}", "text": f"{i % 7} + {i % 5} = {i % 7 + i % 5}"}) + "\n")
    cfg = tiny_cfg(
        tmp_path,
        pretrain__lr=3e-3,
        pretrain__warmup_steps=2,
        pretrain__max_steps=6,
        pretrain__batch_size=4,
        pretrain__context_length=64,
        pretrain__checkpoint_every=3,
        pretrain__log_every=1,
    )

    class CrashAt4(NullLogger):  # a crash after the step-3 checkpoint
        def log_metrics(self, metrics, step=None):
            if step == 4:
                raise RuntimeError("crash")
            super().log_metrics(metrics, step)

    straight = NullLogger()
    run_pretrain(cfg, tmp_path / "corpus", tmp_path / "straight", straight)
    with pytest.raises(RuntimeError, match="crash"):
        run_pretrain(cfg, tmp_path / "corpus", tmp_path / "pre", CrashAt4())
    resumed = NullLogger()
    done = run_pretrain(cfg, tmp_path / "corpus", tmp_path / "pre", resumed)
    assert done["steps"] == 6 and done["pages"] == 40
    # Steps 4-6 after the resume repeat the uninterrupted run's losses (same data order and RNG).
    losses = lambda log: [m["train/loss"] for s, m in log.history if s and s > 3]  # noqa: E731
    assert losses(resumed) == pytest.approx(losses(straight), rel=1e-5)
    assert (tmp_path / "pre" / "model" / "config.json").exists()
    with pytest.raises(ValueError, match="no pages to pretrain on"):
        run_pretrain(cfg, tmp_path / "pre", tmp_path / "pre2")

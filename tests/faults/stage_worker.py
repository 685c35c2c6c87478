"""A training stage in its own process, for the hard-kill tests (tests/faults/test_kill_resume.py).

    python tests/faults/stage_worker.py SPEC.json

SPEC: {"stage": "sft" | "orm" | "prm" | "prm-likelihood" | "grpo", "root": tmp dir for the recipe, "out": stage folder,
"data_dir", "model_dir", "reward_data" (orm/prm), "overrides": {...}, "kill": null or
{"after_checkpoint": k} (SIGKILL once checkpoint k is complete) or {"while_writing": k} (SIGKILL
when checkpoint k's files are written but not yet in place)}. Every log_metrics call is appended
to OUT/../<name>.metrics.jsonl (one flushed line per call), so the metrics a killed process logged
before dying survive it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class JsonlLogger:
    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf-8")

    def log_metrics(self, metrics, step=None):
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def __getattr__(self, name):  # params, tags, tables, inputs: not compared
        return lambda *a, **k: None


def parity_reward(completions, golds):
    """Deterministic rewards with spread for a model that never answers right (as tests/test_grpo)."""
    import torch

    return torch.tensor([float(sum(map(ord, c)) % 2) for c in completions])


def arm(kill: dict | None) -> None:
    """SIGKILL this process at the requested point of the checkpoint writer."""
    if not kill:
        return
    import grpo_core.training.checkpoint as ckpt

    if "after_checkpoint" in kill:
        real_save = ckpt.save_checkpoint

        def save_then_die(root, step, *a, **k):
            path = real_save(root, step, *a, **k)
            if step == kill["after_checkpoint"]:
                os.kill(os.getpid(), signal.SIGKILL)
            return path

        ckpt.save_checkpoint = save_then_die  # the stages look it up at each call
    else:
        real_fsync = ckpt._fsync_tree

        def die_before_rename(path):
            real_fsync(path)
            if path.name == f".tmp-step-{kill['while_writing']:08d}":
                os.kill(os.getpid(), signal.SIGKILL)

        ckpt._fsync_tree = die_before_rename


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from tests.conftest import make_tiny_cfg

    cfg = make_tiny_cfg(Path(spec["root"]), **spec["overrides"])
    out = Path(spec["out"])
    logger = JsonlLogger(out.parent / f"{out.name}.metrics.jsonl")
    arm(spec.get("kill"))
    stage = spec["stage"]
    if stage == "sft":
        from grpo_core.stages.sft import run_sft

        run_sft(cfg, Path(spec["data_dir"]), out, logger)
    elif stage.split("-")[0] in ("orm", "prm"):  # e.g. prm-likelihood: a PRM with the overrides of that entry
        from grpo_core.stages.inputs import reward_datasets
        from grpo_core.stages.reward_model import run_reward_model

        run_reward_model(cfg, stage.split("-")[0], reward_datasets(spec["reward_data"]), spec["model_dir"], out, logger)
    elif stage == "grpo":
        import grpo_core.rewards.scorer as rewards

        rewards.rule_reward = parity_reward
        from grpo_core.stages.grpo import run_grpo

        run_grpo(cfg, Path(spec["data_dir"]), spec["model_dir"], out, logger)
    else:
        raise SystemExit(f"unknown stage {stage}")


if __name__ == "__main__":
    main()

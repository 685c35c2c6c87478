"""What a stage's output is valid for: the code that made it and the recipe it ran (its budget
aside), so a cached stage or a checkpoint is reused only where nothing it depends on changed."""

from __future__ import annotations

import hashlib
from pathlib import Path

from grpo_core.config import budget_fields


# The library and the task wrappers: a change to either can change what a stage produces.
CODE_ROOTS = [Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2] / "tasks"]


def code_version() -> str:
    """Hash of the library's source: a cached stage reruns when the code that made it changed."""
    h = hashlib.sha256()
    for root in CODE_ROOTS:
        for p in sorted(root.rglob("*.py")):
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def run_identity(cfg, section: str, **extra) -> dict:
    """What makes a stage's checkpoints valid: the recipe minus the section's budget fields
    (``config.BudgetField``: changing them keeps a resume valid, any other change means the
    checkpoints are stale), plus e.g. the digest of the model it started from."""
    cfg_json = cfg.model_dump(mode="json")
    # The lr schedule's shape follows max_steps for the cosine and multi-step schedules.
    shaped = cfg_json[section].get("schedule") in ("cosine", "multistep")
    budget = budget_fields(type(getattr(cfg, section))) - ({"max_steps"} if shaped else set())
    stage = {k: v for k, v in cfg_json[section].items() if k not in budget}
    return {"seed": cfg_json["seed"], "model": cfg_json["model"], "data": cfg_json["data"], section: stage, **extra}

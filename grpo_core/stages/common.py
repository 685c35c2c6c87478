"""Plumbing shared by the training stages: reading splits, manifests, digests, validation."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from grpo_core.data import Example, load_jsonl
from grpo_core.distributed import Dist
from grpo_core.runtime import model_device

SINGLE = Dist()  # one process

# The library and the task wrappers: a change to either can change what a stage produces.
CODE_ROOTS = [Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2] / "tasks"]


def read_split(data_dir: Path, split: str) -> list[Example]:
    return load_jsonl(str(Path(data_dir) / f"{split}.jsonl"))


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write ``manifest.json`` last, atomically: its presence means the stage finished."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, out_dir / "manifest.json")
    return manifest


def digest_dir(path: Path, pattern: str = "*") -> str:
    """sha256 over the names and contents of the files of a folder (a model, a dataset)."""
    h = hashlib.sha256()
    for p in sorted(Path(path).rglob(pattern)):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def code_version() -> str:
    """Hash of the library's source: a cached stage reruns when the code that made it changed."""
    h = hashlib.sha256()
    for root in CODE_ROOTS:
        for p in sorted(root.rglob("*.py")):
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def round_seed(seed: int, round_: int) -> int:
    """The seed of RL round ``round_``: round 1 uses the recipe's seed, later rounds draw other
    questions and samples."""
    return seed + 7919 * (round_ - 1)


def lm_update(model, opt, ids: torch.Tensor, labels: torch.Tensor, lr: float, max_grad_norm: float,
              d: Dist = SINGLE, amp=contextlib.nullcontext):
    """One causal-LM optimizer step at ``lr`` on this rank's [B, T] ``ids`` / ``labels`` (-100 = no
    loss); returns (loss, grad norm before clipping). SFT and continued pretraining share it.

    The loss is the mean over the loss tokens of the whole global batch, whatever the number of
    processes: each rank backpropagates its token sum over the global count, times the world size
    because DDP averages the ranks' gradients. ``amp``: the forward pass's precision context
    (``runtime.autocast``); the backward runs outside it, as torch recommends."""
    import torch.nn.functional as F

    for group in opt.param_groups:
        group["lr"] = lr
    device = model_device(model)
    ids, targets = ids.to(device), labels[:, 1:].to(device)
    with amp():
        logits = model(input_ids=ids).logits[:, :-1].float()
        loss_sum = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
    n_tokens = max(float(d.sum(float((targets != -100).sum()))), 1.0)
    opt.zero_grad(set_to_none=True)
    (loss_sum * (d.world / n_tokens)).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    opt.step()
    return d.sum(loss_sum.detach().cpu()) / n_tokens, grad_norm


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


class Stopwatch:
    """Wall time that survives a resume: ``offset`` is the time spent before the restart."""

    def __init__(self, offset: float = 0.0) -> None:
        self.start = time.perf_counter() - offset

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start


# Fields that only set how long or how often a stage runs: changing them keeps a resume valid
# (extending a run is the point of resuming); any other change means the checkpoints are stale.
BUDGET_FIELDS = {"steps", "max_steps", "epochs", "max_seconds", "log_every", "eval_every", "checkpoint_every",
                 "keep_checkpoints"}


def run_identity(cfg, section: str, **extra) -> dict:
    """What makes a stage's checkpoints valid: the recipe minus budget fields, plus e.g. the digest
    of the model it started from."""
    cfg_json = cfg.model_dump(mode="json")
    # The lr schedule's shape follows max_steps for SFT's cosine and pretraining's multi-step decay.
    shaped = section == "pretrain" or cfg_json[section].get("schedule") == "cosine"
    budget = BUDGET_FIELDS - ({"max_steps"} if shaped else set())
    stage = {k: v for k, v in cfg_json[section].items() if k not in budget}
    return {"seed": cfg_json["seed"], "model": cfg_json["model"], "data": cfg_json["data"],
            section: stage, **extra}


def find_resume(ckpt_root: Path, identity: dict):
    """(checkpoint, state) to resume from, or (None, None) for a fresh start.

    Checkpoints written under another identity are set aside, never silently resumed: they are
    moved to ``<root>.stale-<n>`` so nothing is lost.
    """
    from grpo_core.checkpoint import latest_checkpoint, load_state

    latest = latest_checkpoint(ckpt_root)
    if latest is None:
        return None, None
    state = load_state(latest)
    if state.get("identity") != identity:
        n = 0
        while (stale := ckpt_root.with_name(f"{ckpt_root.name}.stale-{n}")).exists():
            n += 1
        ckpt_root.rename(stale)
        print(f"warning: checkpoints in {ckpt_root} were written by another recipe or start; moved to {stale}")
        return None, None
    return latest, state


def save_trainer_checkpoint(ckpt_root: Path, st: dict, model, tokenizer, opt, identity: dict, cfg,
                            keep: int) -> None:
    """A complete resume point: weights, optimizer, counters (data position, best, schedule), RNG."""
    from grpo_core.checkpoint import rng_state, save_checkpoint

    save_checkpoint(ckpt_root, st["step"], model, tokenizer,
                    {"optimizer": opt.state_dict(), "counters": dict(st), "rng": rng_state(),
                     "identity": identity, "config": cfg.model_dump(mode="json")}, keep=keep)


def restore_trainer_state(saved: dict, opt, st: dict) -> None:
    from grpo_core.checkpoint import set_rng_state

    opt.load_state_dict(saved["optimizer"])
    st.update(saved["counters"])
    set_rng_state(saved["rng"])


def keep_if_best(st: dict, acc: float, model, tokenizer, out_dir: Path, save: bool = True) -> bool:
    """Save ``model`` to ``out_dir/best`` when ``acc`` beats the best so far; True if it did.
    ``save=False`` (ranks other than 0) updates the counters only."""
    import shutil

    from grpo_core.modeling import save_model

    if acc <= st["best_acc"]:
        return False
    st.update(best_acc=acc, best_step=st["step"])
    if save:
        shutil.rmtree(out_dir / "best", ignore_errors=True)
        save_model(model, tokenizer, out_dir / "best")
    return True


def publish_best(out_dir: Path) -> Path:
    """Copy the best-validation model (``best/``) to the stage's published ``model/``."""
    import shutil

    final_dir = out_dir / "model"
    shutil.rmtree(final_dir, ignore_errors=True)
    shutil.copytree(out_dir / "best", final_dir)
    return final_dir

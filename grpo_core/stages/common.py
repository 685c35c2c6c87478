"""Plumbing shared by the training stages: reading splits, manifests, digests, validation."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from grpo_core.config import budget_fields
from grpo_core.data import SPLITS, Example, load_jsonl
from grpo_core.digests import digest_dir, digest_files  # noqa: F401  (the stages import them from here)
from grpo_core.training.distributed import Dist
from grpo_core.lm.runtime import model_device

SINGLE = Dist()  # one process

# The library and the task wrappers: a change to either can change what a stage produces.
CODE_ROOTS = [Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2] / "tasks"]


class Ref(BaseModel):
    """A folder another stage wrote (a model, a dataset), with the digest of its contents (a stage's
    typed output gives its own: ``outputs.ModelOutput.ref``, ``FolderOutput.ref``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str
    digest: str


def read_split(data_dir: Path, split: str) -> list[Example]:
    return load_jsonl(str(Path(data_dir) / f"{split}.jsonl"))


def read_manifest(path: Path) -> dict[str, Any]:
    """A manifest, with its paths where its folder is now (``relocated``), or a ValueError naming
    the file when it is not a JSON object (damaged, cut short)."""
    try:
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable manifest ({e}); the command that wrote it writes it again") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: not a readable manifest (a JSON {type(manifest).__name__}, not an object)")
    return relocated(manifest, Path(path).parent)


def write_manifest(out_dir: Path, manifest: dict[str, Any], run_folder: Path | None = None) -> dict[str, Any]:
    """Write ``manifest.json`` last, atomically: its presence means the stage finished. It records
    the folder it was written in (``written_in``) and the run folder it belongs to (``run_folder``,
    default: its own folder), so that a copied or moved run reads its paths where they are now."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = manifest | {"written_in": str(out_dir.resolve()), "run_folder": str(Path(run_folder or out_dir).resolve())}
    tmp = out_dir / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, out_dir / "manifest.json")
    return manifest


def relocated(manifest: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``manifest`` as if written in ``folder``: where it was written elsewhere (its ``written_in``; a
    copied or moved project or run folder), the paths under its run folder move with it
    (``/a/runs/demo/sft/model`` to ``/b/runs/demo/sft/model`` for ``sft/manifest.json`` now under
    ``/b/runs/demo``); every other path is left as it is. A manifest found at another place within
    its run than the one it was written at moves its own folder's paths only."""
    was, now = manifest.get("written_in"), Path(folder).resolve()
    if was is None or Path(was) == now:  # (written before manifests said where, or not moved)
        return manifest
    root = Path(manifest.get("run_folder") or was)
    within = Path(was).relative_to(root).parts if Path(was).is_relative_to(root) else None
    if within is None or now.parts[len(now.parts) - len(within):] != within:
        root, within = Path(was), ()
    new_root = Path(*now.parts[: len(now.parts) - len(within)])
    return moved(manifest, str(root), str(new_root)) | {"written_in": str(now), "run_folder": str(new_root)}


def moved(value: Any, old: str, new: str) -> Any:
    """``value`` (JSON: strings, lists, dicts) with each path at or under the folder ``old`` put
    under ``new`` instead; other strings as they are."""
    if isinstance(value, str) and (value == old or value.startswith(old.rstrip("/") + "/")):
        return new + value[len(old):]
    if isinstance(value, dict):
        return {k: moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [moved(v, old, new) for v in value]
    return value


def splits_digest(data_dir: Path) -> str:
    """The data stage's digest: its training splits only (held-out sets have their own, in the keys
    of the stages that read them)."""
    return digest_files(Path(data_dir), [Path(data_dir) / f"{split}.jsonl" for split in SPLITS])


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


def document_positions(ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """[B, T] each token's position within its own example of a packed row: 0 at the row's start
    and after every ``eos_id``. Passed as ``position_ids`` with no attention mask, transformers
    reads the restarts as packed sequences and attends within each one only (a block-diagonal
    causal mask: ``masking_utils.find_packed_sequence_indices``)."""
    at = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, :-1] == eos_id
    return at - torch.where(starts, at, 0).cummax(-1).values


def lm_loss(model, ids: torch.Tensor, labels: torch.Tensor, d: Dist = SINGLE, amp=contextlib.nullcontext,
            eos_id: int | None = None):
    """Causal-LM loss of this rank's [B, T] ``ids`` / ``labels`` (-100 = no loss): (the sum over
    its loss tokens, the global batch's loss-token count). SFT and continued pretraining share it.
    ``eos_id``: each example of a packed row sees itself only (``document_positions``) and the
    token after its end is no target; None: a token sees everything before it in its row.

    The loss is the mean over the loss tokens of the whole global batch, whatever the number of
    processes: each rank backpropagates its sum times ``d.world / count`` (DDP averages the ranks'
    gradients). ``amp``: the forward pass's precision context (``runtime.autocast``); the backward
    runs outside it, as torch recommends."""
    import torch.nn.functional as F

    device = model_device(model)
    ids, targets = ids.to(device), labels[:, 1:].to(device)
    positions = None
    if eos_id is not None:  # and no example predicts the next one's first token
        positions, targets = document_positions(ids, eos_id), targets.masked_fill(ids[:, :-1] == eos_id, -100)
    with amp():
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[:, :-1].float()
        loss_sum = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
    return loss_sum, max(float(d.sum(float((targets != -100).sum()))), 1.0)


def packed_lm_step(trainer, rows_of, batch_size: int, trained, d: Dist = SINGLE, amp=contextlib.nullcontext,
                   eos_id: int | None = None):
    """The training step of SFT and continued pretraining, for ``Trainer.fit``: the epoch's next
    ``batch_size`` packed rows (``rows_of(epoch)`` -> [R, T] ids and labels, a fresh concatenation
    per epoch), this process's share of them, and one clipped update on their loss (``lm_loss``,
    with ``eos_id``).
    Returns None for an epoch's last batch when it is too short to give every process a row
    (skipped by all; never in one process)."""
    def step(st) -> dict | None:
        if st.row >= len(rows_of(st.epoch)[0]):  # a new epoch
            st.epoch, st.row = st.epoch + 1, 0
        ids, labels = rows_of(st.epoch)
        n = len(ids[st.row : st.row + batch_size])  # an epoch's last batch may be short
        mine = slice(st.row + d.split(n).start, st.row + d.split(n).stop)
        ids, labels = ids[mine], labels[mine]
        st.row += batch_size
        if n < d.world:
            return None
        loss_sum, n_tokens = lm_loss(trained, ids, labels, d, amp, eos_id)
        grad_norm = trainer.update(loss_sum, d.world / n_tokens)
        st.tokens += int(d.sum(int((labels != -100).sum())))
        return {"train/loss": (d.sum(loss_sum.detach().cpu()) / n_tokens).item(), "train/grad_norm": grad_norm,
                "train/epoch": st.epoch}
    return step


def set_compute(threads: int | None) -> None:
    """How a stage's process computes: the recipe's thread count, and torch's deterministic
    algorithms. Without them the backward of the shared-prompt log-prob pass (the prompts' keys and
    values selected per row, ``policy.CompletionLogprobs``: an indexed accumulation) sums in the
    order the threads finish: on a busy CPU GRPO's weights differed between two runs of the same
    steps (docs/reliability.md). ``warn_only``: an operation without a deterministic kernel warns."""
    if threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)


def run_identity(cfg, section: str, **extra) -> dict:
    """What makes a stage's checkpoints valid: the recipe minus the section's budget fields
    (``config.BudgetField``: changing them keeps a resume valid, any other change means the
    checkpoints are stale), plus e.g. the digest of the model it started from."""
    cfg_json = cfg.model_dump(mode="json")
    # The lr schedule's shape follows max_steps for the cosine and multi-step schedules.
    shaped = cfg_json[section].get("schedule") in ("cosine", "multistep")
    budget = budget_fields(type(getattr(cfg, section))) - ({"max_steps"} if shaped else set())
    stage = {k: v for k, v in cfg_json[section].items() if k not in budget}
    return {"seed": cfg_json["seed"], "model": cfg_json["model"], "data": cfg_json["data"],
            section: stage, **extra}

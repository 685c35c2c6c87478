"""The causal-LM training step that SFT and continued pretraining share: the loss of packed rows
(each example attends within itself) and one clipped update per batch."""

from __future__ import annotations

import contextlib

import torch

from grpo_core.lm.runtime import model_device
from grpo_core.training.distributed import Dist, SINGLE
from grpo_core.training.trainer import optimizer_step


def document_positions(ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """[B, T] each token's position within its own example of a packed row: 0 at the row's start
    and after every ``eos_id``. Passed as ``position_ids`` with no attention mask, transformers
    reads the restarts as packed sequences and attends within each one only (a block-diagonal
    causal mask: ``masking_utils.find_packed_sequence_indices``)."""
    at = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, :-1] == eos_id
    return at - torch.where(starts, at, 0).cummax(-1).values


def lm_loss(
    model,
    ids: torch.Tensor,
    labels: torch.Tensor,
    d: Dist = SINGLE,
    amp=contextlib.nullcontext,
    eos_id: int | None = None,
):
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
    ids, labels = ids.to(device), labels.to(device)
    # Position t predicts token t + 1; the last position predicts nothing (-100). The targets shift,
    # not the [B, T, V] logits: no copy of them is made (each position's gradient is the same).
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
    positions = None
    if eos_id is not None:  # and no example predicts the next one's first token
        positions, targets = document_positions(ids, eos_id), targets.masked_fill(ids == eos_id, -100)
    with amp():
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits.float()
        loss_sum = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
    return loss_sum, max(float(d.sum(float((targets != -100).sum()))), 1.0)


def packed_lm_step(
    trainer, rows_of, batch_size: int, trained, d: Dist = SINGLE, amp=contextlib.nullcontext, eos_id: int | None = None
):
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
        grad_norm = optimizer_step(trainer.model, trainer.opt, loss_sum, d.world / n_tokens, trainer.sc.max_grad_norm)
        st.tokens += int(d.sum(int((labels != -100).sum())))
        return {
            "train/loss": (d.sum(loss_sum.detach().cpu()) / n_tokens).item(),
            "train/grad_norm": grad_norm,
            "train/epoch": st.epoch,
        }

    return step

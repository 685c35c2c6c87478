"""SFT: packed causal-LM training on worked solutions, until validation accuracy stops improving.

Setup, then the shared training loop (``trainer.py``) with this stage's step (a batch of packed
rows, reshuffled every epoch) and evaluation (greedy validation accuracy). The model kept is the
one with the best validation accuracy, saved to ``model/``.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from dataclasses import dataclass

import torch

from grpo_core.config import PipelineConfig, SFTConfig
from grpo_core.data import Example, read_split
from grpo_core.digests import digest_dir
from grpo_core.evaluation import greedy_accuracy
from grpo_core.lm.modeling import ModelError, init_model, load_model, load_trainable
from grpo_core.lm.packing import encode_examples, pack
from grpo_core.lm.runtime import autocast, model_device, place, set_compute
from grpo_core.manifests import write_manifest
from grpo_core.stages.identity import run_identity
from grpo_core.stages.lm_step import lm_loss, packed_lm_step
from grpo_core.tracking import MetricLogger, NullLogger
from grpo_core.training import distributed
from grpo_core.training.checkpoint import latest_checkpoint, load_state
from grpo_core.training.schedules import learning_rate
from grpo_core.training.trainer import Plan, Started, TrainState, Trainer


@torch.no_grad()
def validation_loss(
    model, val_ids: torch.Tensor, val_labels: torch.Tensor, batch: int = 8, eos_id: int | None = None
) -> float:
    """The mean loss per loss token of packed rows, read as training reads them (``lm_loss``), ``batch``
    rows at a time (their [batch, T, vocabulary] logits are the pass's memory: training's batch)."""
    total, count = 0.0, 0.0
    for i in range(0, len(val_ids), batch):
        total += float(lm_loss(model, val_ids[i : i + batch], val_labels[i : i + batch], eos_id=eos_id)[0])
        count += float((val_labels[i : i + batch, 1:] != -100).sum())
    return total / max(count, 1.0)


def run_sft(
    cfg: PipelineConfig, data_dir: Path, out_dir: Path, logger: MetricLogger | None = None, init_from: str | None = None
) -> dict:
    """Train, or resume from the last complete checkpoint under ``out_dir/checkpoints``.

    Under torchrun each process trains on its share of every batch of ``sft.batch_size`` rows;
    rank 0 validates, logs, checkpoints and returns the manifest (the others return None)."""
    run = build(cfg, data_dir, out_dir, logger, init_from)
    trainer, model, tokenizer, sc = run.trainer, run.model, run.tokenizer, cfg.sft

    @functools.lru_cache(maxsize=1)
    def rows_of(epoch: int) -> tuple[torch.Tensor, torch.Tensor]:  # a fresh random concatenation per epoch
        return pack(run.train, sc.context_length, tokenizer.pad_token_id, random.Random(cfg.seed * 1000 + epoch))

    eos_id = tokenizer.eos_token_id if sc.packing == "documents" else None
    step = packed_lm_step(trainer, rows_of, sc.batch_size, run.trained, run.d, run.amp, eos_id)

    def evaluate(st: TrainState) -> dict:
        model.eval()
        acc = greedy_accuracy(model, tokenizer, run.val_examples, cfg.eval.max_new_tokens)
        metrics = {
            "val/accuracy": acc,
            "val/loss": validation_loss(model, run.val_ids, run.val_labels, sc.batch_size, eos_id),
        }
        model.train()
        return metrics

    # The loop: update -> log -> [validate -> keep best / decay lr / stop] -> checkpoint.
    st = trainer.fit(step, evaluate)
    final_dir = trainer.publish()
    if not run.d.main:
        return None
    run.logger.log_metrics({"val/best_accuracy": st.best_acc, "time/wall_s": st.elapsed}, step=st.step)
    return write_manifest(out_dir, manifest(trainer, st, final_dir, init_from, len(run.train)))


@dataclass(frozen=True)
class Built(Started):
    """``Started``, with the encoded training examples and the validation questions with their
    packed rows."""

    train: list
    val_examples: list[Example]
    val_ids: torch.Tensor
    val_labels: torch.Tensor


def build(
    cfg: PipelineConfig, data_dir: Path, out_dir: Path, logger: MetricLogger | None, init_from: str | None
) -> Built:
    """The run's set-up (``run_sft``'s arguments): the model to start from (a checkpoint to resume,
    --init, or a fresh one), the data, and the loop started on its plan."""
    d = distributed.init(cfg.launch)
    logger = (logger or NullLogger()) if d.main else NullLogger()
    sc = cfg.sft
    set_compute(cfg.threads)
    start = init_from or (cfg.model.path if cfg.model.init == "pretrained" else None)
    if sc.lora is not None and start is None:
        raise ModelError(
            "sft.lora trains an adapter on a saved model, but SFT starts from a fresh tiny model: "
            "set model.init=pretrained with model.path, or pretrain.train"
        )
    # An adapter's checkpoints belong to the weights under it: other weights at model.path set them aside.
    identity = run_identity(cfg, "sft", init=digest_dir(Path(start)) if init_from or sc.lora else "config")
    trainer = Trainer(cfg, "sft", out_dir, identity, d, logger)
    if sc.lora is not None or trainer.resume is not None or init_from is not None:
        model, tokenizer = (
            load_trainable(start, sc.lora, trainer.resume, cfg.seed) if start else load_model(trainer.resume)
        )
    else:
        model, tokenizer = init_model(cfg.model, cfg.seed)
    place(model, cfg.launch, train="sft")
    if cfg.model.calculator:
        model.config.calculator = True  # saved with the model: every sampler of it uses the calculator
    amp = functools.partial(autocast, cfg.launch, model_device(model))
    train = encode_examples(read_split(data_dir, "sft"), tokenizer, sc.loss_on_prompt, cfg.model.calculator)
    val_examples = read_split(data_dir, "val")
    val_ids, val_labels = pack(
        encode_examples(val_examples, tokenizer, sc.loss_on_prompt, cfg.model.calculator),
        sc.context_length,
        tokenizer.pad_token_id,
        rng=None,
    )
    model.train()
    trained = trainer.wrap(model)
    trainer.start(model, tokenizer, plan(sc, init_from))
    return Built(d, logger, trainer, model, tokenizer, trained, amp, train, val_examples, val_ids, val_labels)


def plan(sc: SFTConfig, init_from: str | None) -> Plan:
    """How long and how often. SFT continued from a trained model (the no-RL baseline) has it as its
    step-0 candidate, as GRPO has: neither returns a model worse on validation than the one it
    started from."""
    return Plan(
        max_steps=sc.max_steps,
        log_every=sc.log_every,
        eval_every=sc.eval_every,
        keep_best="val/accuracy",
        eval_first=init_from is not None,
        patience=sc.patience,
        decay_patience=sc.decay_patience,
        decay_factor=sc.decay_factor,
        min_lr=sc.min_lr,
    )


def manifest(trainer: Trainer, st: TrainState, final_dir: Path, init_from: str | None, n_train: int) -> dict:
    """The stage's manifest: the published model, where it started and how training went."""
    return {
        "stage": "sft",
        "model": str(final_dir),
        "init": init_from or "config",
        "best_val_accuracy": st.best_acc,
        "best_step": st.best_step,
        "steps": st.step,
        "epochs": st.epoch,
        "wall_s": round(st.elapsed, 2),
        "train_s": round(st.train_s, 2),
        "stopped": trainer.stop_reason(),
        "final_lr": learning_rate(trainer.sc, st.step, st.plateau_lr),
        "n_train_examples": n_train,
        "curve": st.curve,
    }


def continued(cfg: PipelineConfig, sft_manifest: dict) -> PipelineConfig:
    """The recipe with ``sft.lr`` at the lr the SFT stage ended with, for SFT continued from its model
    (the no-RL baseline): restarting at the peak would first undo some of its training (measured on
    the demo: 2e-3 after a plateau schedule ended at 5e-4 took validation accuracy from 84% to 71%),
    a weaker baseline than a user would run. Manifests from before ``final_lr`` was recorded: read
    from the stage's last checkpoint."""
    lr = sft_manifest.get("final_lr")
    if lr is None:
        ckpt = latest_checkpoint(Path(sft_manifest["model"]).parent / "checkpoints")
        counters = load_state(ckpt)["counters"] if ckpt else None
        lr = learning_rate(cfg.sft, counters["step"], counters["plateau_lr"]) if counters else cfg.sft.lr
    return cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"lr": lr})})

"""SFT: packed causal-LM training on worked solutions, until validation accuracy stops improving.

setup -> (batch -> update -> log -> [validate -> keep best / decay lr / stop] -> checkpoint)* -> save.
The model kept is the one with the best validation accuracy (greedy pass@1), saved to ``model/``.
"""
from __future__ import annotations

import argparse
import functools
import math
import random
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from grpo_core import distributed
from grpo_core.env import setup_environment
from grpo_core.config import PipelineConfig, SFTConfig, load_config
from grpo_core.evaluation import greedy_accuracy
from grpo_core.modeling import init_model, load_model
from grpo_core.runtime import autocast, model_device, place
from grpo_core.packing import encode_examples, pack
from grpo_core.stages.common import (Stopwatch, digest_dir, find_resume, keep_if_best, lm_update, publish_best,
                                     read_split, restore_trainer_state, run_identity,
                                     save_trainer_checkpoint, set_threads, write_manifest)
from grpo_core.tracking import MetricLogger, NullLogger, logger_from_env


STOP_REASONS = {
    "": "max_steps reached",
    "patience": "validation accuracy did not improve for {sc.patience} evaluations",
    "time": "time budget of {sc.max_seconds}s reached",
}


def lr_at(cfg: SFTConfig, step: int, plateau_lr: float) -> float:
    """Constant (paper), cosine to ``min_lr`` over ``max_steps``, or the reduce-on-plateau value."""
    if cfg.schedule == "cosine":
        frac = min(step / cfg.max_steps, 1.0)
        return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * frac))
    if cfg.schedule == "plateau":
        return plateau_lr
    return cfg.lr


@torch.no_grad()
def validation_loss(model, val_ids: torch.Tensor, val_labels: torch.Tensor, batch: int = 32) -> float:
    total, count = 0.0, 0
    device = model_device(model)
    for i in range(0, len(val_ids), batch):
        labels = val_labels[i : i + batch]
        n = int((labels[:, 1:] != -100).sum())
        if n:
            total += float(model(input_ids=val_ids[i : i + batch].to(device), labels=labels.to(device)).loss) * n
            count += n
    return total / max(count, 1)


def run_sft(cfg: PipelineConfig, data_dir: Path, out_dir: Path, logger: MetricLogger | None = None,
            init_from: str | None = None) -> dict:
    """Train, or resume from the last complete checkpoint under ``out_dir/checkpoints``.

    Under torchrun each process trains on its share of every batch of ``sft.batch_size`` rows;
    rank 0 validates, logs, checkpoints and returns the manifest (the others return None)."""
    d = distributed.init(cfg.launch)
    logger = (logger or NullLogger()) if d.main else NullLogger()
    sc = cfg.sft
    set_threads(cfg.threads)
    ckpt_root = out_dir / "checkpoints"
    identity = run_identity(cfg, "sft", init=digest_dir(Path(init_from)) if init_from else "config")
    resume, saved = d.main_first(lambda: find_resume(ckpt_root, identity))
    if resume is not None:
        model, tokenizer = load_model(resume)
    elif init_from is not None:
        model, tokenizer = load_model(init_from)
    else:
        model, tokenizer = init_model(cfg.model, cfg.seed)
    place(model, cfg.launch, train=True)
    amp = functools.partial(autocast, cfg.launch, model_device(model))
    max_new = cfg.eval.max_new_tokens
    train = encode_examples(read_split(data_dir, "sft"), tokenizer, sc.loss_on_prompt)
    val_examples = read_split(data_dir, "val")
    val_ids, val_labels = pack(encode_examples(val_examples, tokenizer, sc.loss_on_prompt),
                               sc.context_length, tokenizer.pad_token_id, rng=None)
    opt = torch.optim.AdamW(model.parameters(), lr=sc.lr, betas=(0.9, 0.95), weight_decay=sc.weight_decay)
    st = {"step": 0, "epoch": 0, "row": 0, "best_acc": -1.0, "best_step": 0, "bad_evals": 0,
          "plateau_lr": sc.lr, "elapsed": 0.0, "tokens": 0, "stopped": ""}
    if resume is not None:
        restore_trainer_state(saved, opt, st)
    clock = Stopwatch(st["elapsed"])
    rows_ids, rows_labels = pack(train, sc.context_length, tokenizer.pad_token_id, random.Random(cfg.seed * 1000 + st["epoch"]))
    if st["stopped"] == "time" and (sc.max_seconds is None or st["elapsed"] < sc.max_seconds):
        st["stopped"] = ""  # resumed with a larger time budget
    model.train()
    trained = d.wrap(model)
    while st["step"] < sc.max_steps and not st["stopped"]:
        if st["row"] >= len(rows_ids):  # new epoch: a fresh random concatenation
            st["epoch"] += 1
            st["row"] = 0
            rows_ids, rows_labels = pack(train, sc.context_length, tokenizer.pad_token_id,
                                         random.Random(cfg.seed * 1000 + st["epoch"]))
        n = len(rows_ids[st["row"] : st["row"] + sc.batch_size])  # an epoch's last batch may be short
        mine = slice(st["row"] + d.split(n).start, st["row"] + d.split(n).stop)
        ids, labels = rows_ids[mine], rows_labels[mine]
        st["row"] += sc.batch_size
        if n < d.world:  # too short to give every process a row: skipped (never in one process)
            continue
        lr = lr_at(sc, st["step"], st["plateau_lr"])
        loss, grad_norm = lm_update(trained, opt, ids, labels, lr, max_grad_norm=1.0, d=d, amp=amp)
        st["step"] += 1
        st["tokens"] += int(d.sum(int((labels != -100).sum())))
        st["elapsed"] = clock.elapsed
        if st["step"] % sc.log_every == 0:  # a tracking call per step would cost more than the step
            logger.log_metrics({"train/loss": loss.item(), "train/lr": lr, "train/grad_norm": float(grad_norm),
                                "train/epoch": st["epoch"],
                                "perf/tokens_per_s": st["tokens"] / max(st["elapsed"], 1e-9)}, step=st["step"])
        if sc.max_seconds is not None and st["elapsed"] >= sc.max_seconds:
            st["stopped"] = "time"
        st["stopped"] = d.broadcast(st["stopped"])  # rank 0's clock decides for all
        on_grid = st["step"] % sc.eval_every == 0
        last = st["step"] == sc.max_steps or st["stopped"]
        if on_grid or (last and st["best_acc"] < 0):
            acc = None
            if d.main:
                model.eval()
                acc = greedy_accuracy(model, tokenizer, val_examples, max_new)
                logger.log_metrics({"val/accuracy": acc, "val/loss": validation_loss(model, val_ids, val_labels)},
                                   step=st["step"])
                model.train()
            acc = d.broadcast(acc)
            if keep_if_best(st, acc, model, tokenizer, out_dir, save=d.main):
                st["bad_evals"] = 0
            elif on_grid:  # only the regular evaluations drive the schedule, so a resume is exact
                st["bad_evals"] += 1
                if st["bad_evals"] % sc.decay_patience == 0:
                    st["plateau_lr"] = max(st["plateau_lr"] * sc.decay_factor, sc.min_lr)
                if sc.patience and st["bad_evals"] >= sc.patience:
                    st["stopped"] = "patience"
        if st["step"] % sc.checkpoint_every == 0 or st["step"] == sc.max_steps or st["stopped"]:
            st["elapsed"] = clock.elapsed
            if d.main:
                save_trainer_checkpoint(ckpt_root, st, model, tokenizer, opt, identity, cfg, sc.keep_checkpoints)
    if not d.main:
        return None
    final_dir = publish_best(out_dir)
    summary = {"best_val_accuracy": st["best_acc"], "best_step": st["best_step"], "steps": st["step"],
               "epochs": st["epoch"], "wall_s": round(st["elapsed"], 1),
               "stopped": STOP_REASONS[st["stopped"]].format(sc=sc), "n_train_examples": len(train)}
    logger.log_metrics({"val/best_accuracy": st["best_acc"], "time/wall_s": st["elapsed"]}, step=st["step"])
    return write_manifest(out_dir, {"stage": "sft", "model": str(final_dir), "init": init_from or "config", **summary})


@record  # under torchrun, a failing rank's traceback goes into the launcher's summary
def main(argv: list[str] | None = None) -> None:
    setup_environment()
    p = argparse.ArgumentParser(description="SFT stage")
    p.add_argument("--config", required=True)
    p.add_argument("--data", required=True, help="folder with sft.jsonl and val.jsonl")
    p.add_argument("--out", required=True)
    p.add_argument("--init", help="HF folder to start from (default: a fresh model from the recipe)")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    a = p.parse_args(argv)
    manifest = run_sft(load_config(a.config, a.overrides), Path(a.data), Path(a.out), logger_from_env(), init_from=a.init)
    distributed.finish()
    if manifest is not None:  # rank 0
        print(manifest)


if __name__ == "__main__":
    main()

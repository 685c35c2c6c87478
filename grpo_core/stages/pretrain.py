"""Continued pretraining: causal LM on the corpus stage's pages, with DeepSeekMath's optimiser
settings (AdamW(0.9, 0.95), weight decay 0.1) and DeepSeek LLM's multi-step schedule.

setup -> (batch -> update -> log -> checkpoint)* -> save ``model/``. Pages are ``<bos> text <eos>``
packed into rows of the context length, reshuffled every epoch. Resumes from the last complete
checkpoint of the same recipe, start model and corpus.
"""
from __future__ import annotations

import argparse
import functools
import gzip
import json
import random
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from grpo_core import distributed
from grpo_core.config import PipelineConfig, PretrainConfig, load_config
from grpo_core.env import setup_environment
from grpo_core.modeling import init_model, load_model, save_model
from grpo_core.runtime import autocast, model_device, place
from grpo_core.packing import pack
from grpo_core.stages.common import (Stopwatch, digest_dir, find_resume, lm_update, restore_trainer_state, run_identity,
                                     save_trainer_checkpoint, set_threads, write_manifest)
from grpo_core.tracking import MetricLogger, NullLogger, logger_from_env


def multistep_lr(pc: PretrainConfig, step: int) -> float:
    """lr of optimizer step ``step`` (0-based): linear warmup to the peak over ``warmup_steps``, the
    peak until 80% of ``max_steps``, 31.6% of it until 90%, then 10% (DeepSeek LLM §2.3)."""
    if step < pc.warmup_steps:
        return pc.lr * (step + 1) / pc.warmup_steps
    if step < 0.8 * pc.max_steps:
        return pc.lr
    if step < 0.9 * pc.max_steps:
        return pc.lr * 0.316
    return pc.lr * 0.1


def corpus_texts(corpus_dir: Path) -> list[str]:
    texts = []
    for f in sorted(Path(corpus_dir).glob("*.jsonl.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            texts += [json.loads(line)["text"] for line in fh if line.strip()]
    if not texts:
        raise ValueError(f"{corpus_dir}: the corpus has no pages to pretrain on")
    return texts


def encode_pages(texts: list[str], tokenizer) -> list[tuple[list[int], list[int]]]:
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    out = []
    for t in texts:
        ids = bos + tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        out.append((ids, list(ids)))
    return out


def run_pretrain(cfg: PipelineConfig, corpus_dir: Path, out_dir: Path, logger: MetricLogger | None = None) -> dict:
    logger = logger or NullLogger()
    d = distributed.init(cfg.launch)
    if not d.main:
        logger = NullLogger()
    pc = cfg.pretrain
    set_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    ckpt_root = out_dir / "checkpoints"
    identity = run_identity(cfg, "pretrain", corpus=digest_dir(Path(corpus_dir)))
    resume, saved = d.main_first(lambda: find_resume(ckpt_root, identity))
    if resume is not None:
        model, tokenizer = load_model(resume)
    elif cfg.model.init == "pretrained":
        model, tokenizer = load_model(cfg.model.path)
    else:
        model, tokenizer = init_model(cfg.model, cfg.seed)
    place(model, cfg.launch, train=True)
    amp = functools.partial(autocast, cfg.launch, model_device(model))
    pages = encode_pages(corpus_texts(corpus_dir), tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=pc.lr, betas=(0.9, 0.95), weight_decay=pc.weight_decay)
    st = {"step": 0, "epoch": 0, "row": 0, "elapsed": 0.0, "tokens": 0, "stopped": ""}
    if resume is not None:
        restore_trainer_state(saved, opt, st)
    clock = Stopwatch(st["elapsed"])
    if pc.max_seconds is None or st["elapsed"] < pc.max_seconds:
        st["stopped"] = ""
    rows = pack(pages, pc.context_length, tokenizer.pad_token_id, random.Random(cfg.seed * 1000 + st["epoch"]))[0]
    model.train()
    trained = d.wrap(model)
    loss = torch.tensor(float("nan"))
    while st["step"] < pc.max_steps and not st["stopped"]:
        if st["row"] >= len(rows):  # a new epoch: a fresh random concatenation
            st["epoch"] += 1
            st["row"] = 0
            rows = pack(pages, pc.context_length, tokenizer.pad_token_id, random.Random(cfg.seed * 1000 + st["epoch"]))[0]
        n = len(rows[st["row"] : st["row"] + pc.batch_size])  # an epoch's last batch may be short
        ids = rows[st["row"] + d.split(n).start : st["row"] + d.split(n).stop]
        st["row"] += pc.batch_size
        if n < d.world:  # too short to give every process a row: skipped (never in one process)
            continue
        lr = multistep_lr(pc, st["step"])
        labels = ids.masked_fill(ids == tokenizer.pad_token_id, -100)
        loss, grad_norm = lm_update(trained, opt, ids, labels, lr, pc.max_grad_norm, d, amp)
        st["step"] += 1
        st["tokens"] += int(d.sum(int((labels != -100).sum())))
        st["elapsed"] = clock.elapsed
        if st["step"] % pc.log_every == 0:
            logger.log_metrics({"train/loss": loss.item(), "train/lr": lr, "train/grad_norm": float(grad_norm),
                                "train/epoch": st["epoch"], "perf/tokens_per_s": st["tokens"] / max(st["elapsed"], 1e-9)},
                               step=st["step"])
        if pc.max_seconds is not None and st["elapsed"] >= pc.max_seconds:
            st["stopped"] = f"time budget of {pc.max_seconds}s reached"
        st["stopped"] = d.broadcast(st["stopped"])  # rank 0's clock decides for all
        if st["step"] % pc.checkpoint_every == 0 or st["step"] == pc.max_steps or st["stopped"]:
            if d.main:
                save_trainer_checkpoint(ckpt_root, st, model, tokenizer, opt, identity, cfg, pc.keep_checkpoints)
    if not d.main:
        return None
    final_dir = save_model(model, tokenizer, out_dir / "model")
    return write_manifest(out_dir, {"stage": "pretrain", "model": str(final_dir), "corpus": str(corpus_dir),
                                    "pages": len(pages), "steps": st["step"], "epochs": st["epoch"],
                                    "tokens": st["tokens"], "last_loss": loss.item(),
                                    "stopped": st["stopped"] or "max_steps reached", "wall_s": round(st["elapsed"], 1)})


@record  # under torchrun, a failing rank's traceback goes into the launcher's summary
def main(argv: list[str] | None = None) -> None:
    setup_environment()
    p = argparse.ArgumentParser(description="continued pretraining on a corpus folder (part-*.jsonl.gz)")
    p.add_argument("--config", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--set", action="append", default=[], dest="overrides")
    a = p.parse_args(argv)
    manifest = run_pretrain(load_config(a.config, a.overrides), Path(a.corpus), Path(a.out), logger_from_env())
    distributed.finish()
    if manifest is not None:  # rank 0
        print(manifest)


if __name__ == "__main__":
    main()

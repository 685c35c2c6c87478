"""Continued pretraining: causal LM on the corpus stage's pages, with DeepSeekMath's optimiser
settings (AdamW(0.9, 0.95), weight decay 0.1) and DeepSeek LLM's multi-step schedule.

Setup, then the shared training loop (``trainer.py``) with this stage's step; the last model is
saved to ``model/``. Pages are ``<bos> text <eos>`` packed into rows of the context length,
reshuffled every epoch. Resumes from the last complete checkpoint of the same recipe, start model
and corpus.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
from pathlib import Path

import torch

from grpo_core.config import PipelineConfig
from grpo_core.digests import digest_dir
from grpo_core.lm.modeling import init_model, load_model
from grpo_core.lm.packing import pack
from grpo_core.lm.runtime import autocast, model_device, place, set_compute
from grpo_core.manifests import write_manifest
from grpo_core.stages.identity import run_identity
from grpo_core.stages.lm_step import packed_lm_step
from grpo_core.tracking import MetricLogger, NullLogger
from grpo_core.training import distributed
from grpo_core.training.trainer import Plan, TrainState, Trainer


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
    # Setup: the model (a checkpoint to resume, the recipe's pretrained folder, or a fresh one), the pages.
    d = distributed.init(cfg.launch)
    logger = (logger or NullLogger()) if d.main else NullLogger()
    pc = cfg.pretrain
    set_compute(cfg.threads)
    torch.manual_seed(cfg.seed)
    trainer = Trainer(
        cfg, "pretrain", out_dir, run_identity(cfg, "pretrain", corpus=digest_dir(Path(corpus_dir))), d, logger
    )
    if trainer.resume is not None or cfg.model.init == "pretrained":
        model, tokenizer = load_model(trainer.resume or cfg.model.path)
    else:
        model, tokenizer = init_model(cfg.model, cfg.seed)
    place(model, cfg.launch, train="pretrain")
    amp = functools.partial(autocast, cfg.launch, model_device(model))
    pages = encode_pages(corpus_texts(corpus_dir), tokenizer)
    model.train()
    trained = trainer.wrap(model)
    trainer.start(model, tokenizer, Plan(max_steps=pc.max_steps, log_every=pc.log_every))

    @functools.lru_cache(maxsize=1)
    def rows_of(epoch: int) -> tuple[torch.Tensor, torch.Tensor]:  # a fresh random concatenation per epoch
        ids = pack(pages, pc.context_length, tokenizer.pad_token_id, random.Random(cfg.seed * 1000 + epoch))[0]
        return ids, ids.masked_fill(ids == tokenizer.pad_token_id, -100)

    lm_step = packed_lm_step(trainer, rows_of, pc.batch_size, trained, d, amp)

    def step(st: TrainState) -> dict | None:
        metrics = lm_step(st)
        if metrics is not None:
            st.extra["last_loss"] = metrics["train/loss"]
        return metrics

    # The loop: update -> log -> checkpoint; the last model is published.
    st = trainer.fit(step)
    final_dir = trainer.publish()
    if not d.main:
        return None
    return write_manifest(
        out_dir,
        {
            "stage": "pretrain",
            "model": str(final_dir),
            "corpus": str(corpus_dir),
            "pages": len(pages),
            "steps": st.step,
            "epochs": st.epoch,
            "tokens": st.tokens,
            "last_loss": st.extra.get("last_loss", float("nan")),
            "stopped": trainer.stop_reason(),
            "wall_s": round(st.elapsed, 1),
        },
    )

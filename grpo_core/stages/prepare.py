"""Data stage: write the splits (SFT worked solutions, RL answer-only questions, validation, test)
and the further held-out test sets (``held_out/<name>.jsonl``) as GSM8K-form JSONL, checking that no
question is shared between splits and that no test question is trained on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from grpo_core.benchmarks import benchmark_splits, split_record
from grpo_core.config import PipelineConfig
from grpo_core.data import DataError, SPLITS, held_out_examples, load_splits, splits_digest, write_jsonl
from grpo_core.manifests import write_manifest


def prepared_splits(cfg: PipelineConfig) -> tuple[dict[str, list], dict[str, list]]:
    """The splits and held-out sets the data stage writes (everything but the writing; what
    ``grpo-pipeline check`` runs too): questions shared between splits refused (generated data) or
    dropped from the training splits (real data), and an error when a training split is left empty."""
    dc = cfg.data
    if dc.source == "benchmark":  # whole clusters of near-duplicates, none near an evaluated question
        held_out = held_out_examples(dc)
        splits = benchmark_splits(dc.benchmark, held_out)
    else:
        splits = load_splits(dc, cfg.seed)
        held_out = held_out_examples(dc)
    seen: dict[str, str] = {}
    for split in SPLITS:
        for e in splits[split]:
            if e.question in seen and seen[e.question] != split:
                if cfg.data.source == "arithmetic":  # generated splits are disjoint by construction
                    raise DataError(f"question shared by {seen[e.question]} and {split}: {e.question!r}")
            seen.setdefault(e.question, split)
    # Real datasets may repeat a question across files; drop such repeats from training splits.
    tested = {e.question for s in ("val", "test") for e in splits[s]} | {
        e.question for v in held_out.values() for e in v
    }
    for split in ("sft", "rl"):
        splits[split] = [e for e in splits[split] if e.question not in tested]
        if not splits[split]:
            raise DataError(f"split {split!r} is empty after removing questions shared with val/test/held-out sets")
    return splits, held_out


def run_prepare(cfg: PipelineConfig, out_dir: Path) -> dict:
    splits, held_out = prepared_splits(cfg)
    for split in SPLITS:
        write_jsonl(splits[split], out_dir / f"{split}.jsonl")
    shutil.rmtree(out_dir / "held_out", ignore_errors=True)  # a set an earlier recipe named is not evaluated
    for name, examples in held_out.items():
        write_jsonl(examples, out_dir / "held_out" / f"{name}.jsonl")
    if cfg.data.source == "benchmark":  # which of the benchmark's own idx each stage saw
        (out_dir / "split.json").write_text(json.dumps(split_record(cfg.data.benchmark, splits, held_out)))
    counts = {f"n_{s}": len(splits[s]) for s in SPLITS} | {"held_out": {k: len(v) for k, v in held_out.items()}}
    # The splits' digest is what the training stages' keys hold; the held-out sets have their own, in
    # the keys of the stages that read them (evaluation, the corpus's decontamination) only.
    return write_manifest(out_dir, {"stage": "data", "dir": str(out_dir), "digest": splits_digest(out_dir), **counts})

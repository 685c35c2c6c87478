"""What a run needs, checked in seconds before anything starts (no Prefect server, no MLflow run, no
run folder): the data files a recipe names (they exist, are UTF-8 JSONL, every row has its fields
and its ``#### <answer>``, none is empty), the model folders (a causal LM's config and a
tokenizer), and that the output folder can be written. ``grpo-pipeline check`` prints every
problem; ``run`` and ``rounds`` refuse to start with any (docs/reliability.md, "Bad input").
"""
from __future__ import annotations

import os
from pathlib import Path

from grpo_core.config import PipelineConfig
from grpo_core.data import DataError, load_held_out, load_jsonl


def recipe_problems(cfg: PipelineConfig) -> list[str]:
    """Every problem found, one line each, naming the file (and line) and the recipe key."""
    return _data_problems(cfg) + _model_problems(cfg) + _output_problems(cfg)


def _found(check, key: str, errors: type[Exception] | tuple[type[Exception], ...]) -> list[str]:
    """``check()``'s error as one problem naming the recipe ``key`` (none when it passes)."""
    try:
        check()
    except errors as e:
        return [f"{e} ({key})"]
    return []


def _data_problems(cfg: PipelineConfig) -> list[str]:
    from grpo_core.stages.prepare import prepared_splits

    dc, problems = cfg.data, []
    files = {f"data.{k}": getattr(dc, k) for k in ("sft_file", "rl_file", "val_file", "test_file")
             if dc.source == "jsonl" and getattr(dc, k)}
    first_key: dict[str, str] = {}  # each file once, under the first key that names it
    for key, name in files.items():
        first_key.setdefault(name, key)
    for name, key in first_key.items():
        problems += _found(lambda: load_jsonl(name, dc.max_examples, dc.max_chars), key, DataError)
    for name, h in dc.held_out.items():
        problems += _found(lambda: load_held_out(h.file, h.format, dc.max_examples, dc.max_chars),
                           f"data.held_out.{name}", DataError)
    # The splits as the data stage makes them (worked solutions, shared questions, sizes).
    return problems or _found(lambda: prepared_splits(cfg), "data", DataError)


def _model_problems(cfg: PipelineConfig) -> list[str]:
    from grpo_core.lm.modeling import ModelError, check_model_folder

    folders = {"model.path": cfg.model.path} if cfg.model.init == "pretrained" else {}
    folders |= {f"{kind}.init": getattr(cfg, kind).init for kind in ("orm", "prm")
                if getattr(cfg, kind).train and getattr(cfg, kind).init not in ("sft", "tiny")}
    return [p for key, path in folders.items() for p in _found(lambda: check_model_folder(path), key, ModelError)]


def _output_problems(cfg: PipelineConfig) -> list[str]:
    """The run folder's nearest existing ancestor must be a writable folder (nothing is created here)."""
    place = Path(cfg.output_dir).resolve() / cfg.run_name
    existing = next(p for p in (place, *place.parents) if p.exists())
    if not existing.is_dir():
        return [f"{existing}: not a folder, so {place} cannot be made (output_dir, run_name)"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"{existing}: not writable, so {place} cannot be made (output_dir)"]
    return []

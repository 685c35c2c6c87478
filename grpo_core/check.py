"""What a run needs, checked in seconds before anything starts (no Prefect server, no MLflow run, no run
folder): the data files a recipe names (they exist, are UTF-8 JSONL, every row has its fields and its
``#### <number>``, none is empty: every bad row listed, up to ``ROWS_SHOWN`` a file), the model folders
(a causal LM's config and a tokenizer), that the output folder can be written and that the disk has room
for the run's checkpoints (an estimate: ``disk_needed``), and that this machine can do what ``launch``
asks (a CUDA device, enough of them, the launcher, a free rendezvous port). ``grpo-pipeline check``
prints every problem; ``run`` and ``rounds`` refuse to start with any (docs/reliability.md, "Bad
input").
"""

from __future__ import annotations

import os
from pathlib import Path

from grpo_core.algorithms import ALGORITHMS
from grpo_core.config import PipelineConfig
from grpo_core.data import DataError, load_held_out, load_jsonl
from grpo_core.lm.shapes import looks_loadable, parameter_count
from grpo_core.stages.prepare import prepared_splits


def recipe_problems(cfg: PipelineConfig) -> tuple[list[str], dict[str, float] | None]:
    """Every problem found, one line each, naming the file (and line) and the recipe key; and the
    run's ``disk_report`` (None where a model or the output folder has a problem: the estimate reads
    the model's config)."""
    models, output = _model_problems(cfg), _output_problems(cfg)
    disk = None if models or output else disk_report(cfg)
    return _data_problems(cfg) + models + output + _disk_problems(cfg, disk) + machine_problems(cfg), disk


def machine_problems(cfg: PipelineConfig) -> list[str]:
    """What ``launch`` asks of this machine that it cannot do: ``device=cuda`` where torch sees no
    CUDA device, more processes than GPUs on ``cuda``, an ``accelerate`` launcher that is not
    installed, a rendezvous port on this machine that something else holds."""
    import importlib.util
    import socket

    lc, out = cfg.launch, []
    if lc.device == "cuda":  # (torch is imported only to answer this)
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not gpus:
            build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            out.append(
                f"launch.device: cuda, but torch {torch.__version__} ({build}) sees no CUDA device on this "
                f"machine; set launch.device=cpu (or auto), or run it where a GPU is"
            )
        elif lc.nproc > gpus:
            out.append(f"launch.nproc: {lc.nproc} processes on cuda, one per GPU, but this machine has {gpus} GPU(s)")
    if lc.distributed and lc.launcher == "accelerate" and importlib.util.find_spec("accelerate") is None:
        out.append("launch.launcher: accelerate is not installed in this environment; install it or use torchrun")
    if lc.nnodes > 1:
        host, port = lc.rdzv_endpoint.rsplit(":", 1)
        try:
            local = socket.gethostbyname(host) in {"127.0.0.1", socket.gethostbyname(socket.gethostname())}
        except OSError:
            local = False  # a name this machine cannot resolve: the other machines may
        if local:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("", int(port)))
                except OSError:
                    out.append(
                        f"launch.rdzv_endpoint: port {port} on this machine is in use; the rendezvous "
                        f"needs it free (another run, or pick another port)"
                    )
    return out


def disk_needed(cfg: PipelineConfig) -> int:
    """Bytes the run's training stages write, an estimate from the model's parameter count: each keeps
    ``keep_checkpoints`` checkpoints (fp32 weights and AdamW's two moments: 3x the weights) beside its
    best and its published model (1x each); SFT (and continued pretraining), then per round GRPO (PPO:
    its value model's checkpoints too), the ORM and the PRM; and one checkpoint more at the peak (a new
    one is written before the oldest is removed). Rollouts, datasets and logs are small beside them."""
    count = parameter_count(cfg.model)
    if count is None:  # a folder without safetensors headers: the model built on the meta device
        # deferred: torch and transformers, so that grpo-pipeline check answers in under a second
        from grpo_core.lm.modeling import meta_parameter_count

        count = meta_parameter_count(cfg.model)
    weights = 4 * count
    value = len(ALGORITHMS[cfg.grpo.algorithm].trains)

    def stage(section, companions: int = 0) -> int:
        return (3 * section.keep_checkpoints * (1 + companions) + 2) * weights

    per_round = stage(cfg.grpo, value) + sum(stage(getattr(cfg, k)) for k in ("orm", "prm") if getattr(cfg, k).train)
    peak = 3 * (1 + value) * weights
    return stage(cfg.sft) + (stage(cfg.pretrain) if cfg.pretrain.train else 0) + cfg.rounds.count * per_round + peak


def _run_place(cfg: PipelineConfig) -> tuple[Path, Path]:
    """The run folder, and its nearest ancestor that exists (nothing is created here)."""
    place = Path(cfg.output_dir).resolve() / cfg.run_name
    return place, next(p for p in (place, *place.parents) if p.exists())


def disk_report(cfg: PipelineConfig) -> dict[str, float]:
    """The run's estimated writes, what its folder holds already and the free space there (MiB)."""
    import shutil

    place, existing = _run_place(cfg)
    held = sum(f.stat().st_size for f in place.rglob("*") if f.is_file()) if place.is_dir() else 0
    mib = 2**20
    return {
        "estimate_mib": round(disk_needed(cfg) / mib, 1),
        "in_run_folder_mib": round(held / mib, 1),
        "free_mib": round(shutil.disk_usage(existing).free / mib, 1),
    }


def _disk_problems(cfg: PipelineConfig, disk: dict[str, float] | None) -> list[str]:
    needed = disk["estimate_mib"] - disk["in_run_folder_mib"] if disk else 0.0
    if disk is None or disk["free_mib"] >= needed:
        return []
    return [
        f"{Path(cfg.output_dir).resolve()}: {disk['free_mib']:,.0f} MiB free, and the run's checkpoints and "
        f"models need about {needed:,.0f} MiB more; free some space, or keep fewer checkpoints "
        f"(sft/grpo/orm/prm.keep_checkpoints) (output_dir)"
    ]


def _found(check, key: str, errors: type[Exception] | tuple[type[Exception], ...]) -> list[str]:
    """``check()``'s error as one problem naming the recipe ``key`` (none when it passes)."""
    try:
        check()
    except errors as e:
        return [f"{e} ({key})"]
    return []


def _data_problems(cfg: PipelineConfig) -> list[str]:
    dc, problems = cfg.data, []
    files = {
        f"data.{k}": getattr(dc, k)
        for k in ("sft_file", "rl_file", "val_file", "test_file")
        if dc.source == "jsonl" and getattr(dc, k)
    }
    first_key: dict[str, str] = {}  # each file once, under the first key that names it
    for key, name in files.items():
        first_key.setdefault(name, key)
    for name, key in first_key.items():
        problems += _every_row(lambda found: load_jsonl(name, dc.max_examples, dc.max_chars, found, numeric=True), key)
    for name, h in dc.held_out.items():
        problems += _every_row(
            lambda found: load_held_out(h.file, h.format, dc.max_examples, dc.max_chars, found, numeric=True),
            f"data.held_out.{name}",
        )
    # The splits as the data stage makes them (worked solutions, shared questions, sizes).
    return problems or _found(lambda: prepared_splits(cfg), "data", DataError)


ROWS_SHOWN = 20  # a file's bad rows listed one by one; the rest counted


def _every_row(read, key: str) -> list[str]:
    """Every bad row of one file (``read(found)`` appends them to ``found``), up to ``ROWS_SHOWN``
    and then their count, each naming the recipe ``key``; or the file's own problem (not found)."""
    found: list[str] = []
    try:
        read(found)
    except DataError as e:
        found.append(str(e))
    more = [f"... and {len(found) - ROWS_SHOWN} more bad rows in that file"] if len(found) > ROWS_SHOWN else []
    return [f"{p} ({key})" for p in found[:ROWS_SHOWN] + more]


def _model_problems(cfg: PipelineConfig) -> list[str]:
    folders = {"model.path": cfg.model.path} if cfg.model.init == "pretrained" else {}
    folders |= {
        f"{kind}.init": getattr(cfg, kind).init
        for kind in ("orm", "prm")
        if getattr(cfg, kind).train and getattr(cfg, kind).init not in ("sft", "tiny")
    }
    folders = {key: path for key, path in folders.items() if not looks_loadable(path)}  # told in ~0.2 s, no torch
    if not folders:
        return []
    from grpo_core.lm.modeling import ModelError, check_model_folder  # deferred: torch and transformers

    return [p for key, path in folders.items() for p in _found(lambda: check_model_folder(path), key, ModelError)]


def _output_problems(cfg: PipelineConfig) -> list[str]:
    """The run folder's nearest existing ancestor must be a writable folder (nothing is created here)."""
    place, existing = _run_place(cfg)
    if not existing.is_dir():
        return [f"{existing}: not a folder, so {place} cannot be made (output_dir, run_name)"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"{existing}: not writable, so {place} cannot be made (output_dir)"]
    return []

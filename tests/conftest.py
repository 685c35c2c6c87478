"""Shared fixtures: a temporary environment for the whole session, Prefect's test harness for the flow
tests, and tiny recipes that run every stage in seconds on CPU.

Prefect reads PREFECT_HOME and friends from the environment, so the session fixture points them at a
temporary folder before any test imports Prefect: test modules import ``flows``/``tasks``/``prefect``
lazily, inside the tests that need them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

import grpo_core  # noqa: F401  (first: the numerics settings, env.NUMERICS, before any test module's torch)

# Variables that must point into the session's temporary root, whatever the calling shell has set.
_FORCED = ("PREFECT_HOME", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")


@pytest.fixture(scope="session", autouse=True)
def session_environment(tmp_path_factory) -> Path:
    # Prefect freezes its settings (PREFECT_HOME included) when first imported.
    assert "prefect" not in sys.modules, (
        "prefect was imported before the test environment was set up: import flows/tasks/prefect "
        "inside tests, not at module level"
    )
    root = tmp_path_factory.mktemp("env")
    saved = {k: os.environ.get(k) for k in _FORCED}
    for k in _FORCED:
        # setup_environment only sets defaults: clear what would win over the temporary root.
        os.environ.pop(k, None)
    from grpo_core.env import setup_environment

    setup_environment(root)
    # One thread: on 2 shared cores torch's default of 2 threads runs tiny models ~100x slower.
    import torch

    torch.set_num_threads(1)
    assert os.environ["PREFECT_HOME"] == str(root.resolve() / ".prefect")
    yield root
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def prefect_harness(session_environment):
    """A temporary Prefect server and database for the session (only for the tests that ask)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


# Tiny sizes: a 1-layer Llama with hidden size 32 and a few steps of everything.
TINY = {
    "threads": 1,
    "seed": 0,
    "run_name": "tiny",
    "data.arithmetic.n_sft": 40,
    "data.arithmetic.n_rl": 60,
    "data.arithmetic.n_val": 10,
    "data.arithmetic.n_test": 10,
    "model.hidden_size": 32,
    "model.intermediate_size": 64,
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.max_length": 256,
    "sft.log_every": 1,  # tests inspect every step
    "sft.lr": 1e-3,
    "sft.batch_size": 4,
    "sft.context_length": 128,
    "sft.max_steps": 4,
    "sft.eval_every": 2,
    "sft.checkpoint_every": 2,
    "grpo.max_steps": 2,
    "grpo.questions_per_step": 2,
    "grpo.group_size": 3,
    "grpo.lr": 1e-3,
    "grpo.max_new_tokens": 16,
    "grpo.eval_every": 2,
    "grpo.checkpoint_every": 1,
    "eval.max_new_tokens": 16,
    "eval.batch_size": 16,
    "eval.log_examples": 3,
}


def _yaml_value(value: Any) -> str:
    # load_config parses override values as YAML; JSON is valid YAML for numbers, bools, lists, null.
    return value if isinstance(value, str) else json.dumps(value)


def make_tiny_cfg(tmp_path: Path, *extra: str, **overrides: Any):
    """A tiny PipelineConfig writing under ``tmp_path``.

    ``overrides`` use ``__`` for dots (``sft__max_steps=6``); ``extra`` are raw ``section.key=value``.
    """
    from grpo_core.recipe import load_config

    values = dict(TINY)
    values["output_dir"] = str(tmp_path / "runs")
    values["tracking.tracking_uri"] = f"sqlite:///{tmp_path}/mlflow.db"
    values.update({k.replace("__", "."): v for k, v in overrides.items()})
    items = [f"{k}={_yaml_value(v)}" for k, v in values.items()] + list(extra)
    return load_config(None, items)


@pytest.fixture
def tiny_cfg() -> Callable[..., Any]:
    """Factory: ``tiny_cfg(tmp_path, sft__max_steps=6, ...)`` -> PipelineConfig."""
    return make_tiny_cfg


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A freshly initialised tiny model saved in HF format (read-only for tests: copy to modify)."""
    from grpo_core.lm.modeling import init_model, save_model

    cfg = make_tiny_cfg(tmp_path_factory.mktemp("cfg"))
    model, tokenizer = init_model(cfg.model, seed=0)
    return save_model(model, tokenizer, tmp_path_factory.mktemp("tiny_model") / "model")


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """The data stage's splits for the tiny recipe (sft/rl/val/test.jsonl)."""
    from grpo_core.stages.prepare import run_prepare

    root = tmp_path_factory.mktemp("data")
    cfg = make_tiny_cfg(root)
    run_prepare(cfg, root / "data")
    return root / "data"

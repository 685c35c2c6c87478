"""Every environment variable the project sets, in one place, applied before Prefect/MLflow import.

Values already set by the user win (``setdefault``), so a real server or another home is honoured.
The math libraries' settings (``NUMERICS``) are applied earlier still, when ``grpo_core`` is first
imported (``grpo_core/__init__.py``), so that they are in place before torch computes anything.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path.cwd()


def default_tracking_uri(root: Path | None = None) -> str:
    # MLflow's ./mlruns file store raises without MLFLOW_ALLOW_FILE_STORE; SQLite is the local default.
    return f"sqlite:///{(root or PROJECT_ROOT).resolve() / 'mlflow.db'}"


# What the math libraries need for bit-for-bit results wherever the project runs (docs/reliability.md).
NUMERICS = {
    # MKL's conditional numerical reproducibility. Off (MKL's default), MKL picks its GEMM kernels by
    # the memory alignment of the operands: on AMD EPYC some small linear layers and attention calls
    # changed in their last bits when their inputs moved by a few floats (``runtime.alignment_mismatches``;
    # docs/reliability.md), so a resumed run (other addresses) drifted from the straight run. AUTO: the
    # fastest code path for this CPU, chosen once, whatever the alignment. An empty value turns it off.
    "MKL_CBWR": "AUTO",
    # cuBLAS's fixed workspace: what torch's deterministic algorithms (``lm.runtime.set_compute``)
    # need of cuBLAS on a GPU to give the same bits twice (unused on a CPU).
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}
# The NUMERICS names the project set (not the user); child processes inherit it with the values.
DEFAULTED = "GRPO_PIPELINE_DEFAULTED"


def apply_numerics() -> None:
    """Set ``NUMERICS`` where the user has not: before the first MKL call of the process, which
    fixes MKL's mode for the process's lifetime."""
    ours = set(filter(None, os.environ.get(DEFAULTED, "").split(",")))
    for key, value in NUMERICS.items():
        if key not in os.environ:
            os.environ[key] = value
            ours.add(key)
    os.environ[DEFAULTED] = ",".join(sorted(ours))


def numerics_settings() -> dict[str, dict[str, str]]:
    """Each ``NUMERICS`` variable of this process: its value and who set it (``project`` or ``user``)."""
    ours = set(os.environ.get(DEFAULTED, "").split(","))
    return {
        key: {
            "value": os.environ[key],
            "set_by": "project" if key in ours and os.environ[key] == NUMERICS[key] else "user",
        }
        for key in NUMERICS
        if key in os.environ
    }


def setup_environment(root: Path | None = None) -> None:
    apply_numerics()
    root = (root or PROJECT_ROOT).resolve()
    defaults = {
        # Prefect: a project-local home; the temporary server needs longer than its default to start
        # when two processes start at once on 2 cores.
        "PREFECT_HOME": str(root / ".prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
        "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
        # The project's own warnings (tracking kept for later, a run folder taken over) in Prefect's log too.
        "PREFECT_LOGGING_EXTRA_LOGGERS": "grpo_pipeline",
        "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",  # (those loggers are used outside flows too)
        # MLflow: no telemetry; tracking defaults to sqlite in the project (TrackingConfig may override).
        "MLFLOW_DISABLE_TELEMETRY": "true",
        # MLflow's client retries a request 7 times over ~4 minutes by default, and a training step
        # would wait that long for a dead server; the loggers keep what fails and try again later.
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
        # Hugging Face: nothing is downloaded at run time.
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)

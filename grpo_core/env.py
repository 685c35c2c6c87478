"""Every environment variable the project sets, in one place, applied before Prefect/MLflow import.

Values already set by the user win (``setdefault``), so a real server or another home is honoured.
"""
from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path.cwd()


def default_tracking_uri(root: Path | None = None) -> str:
    # MLflow's ./mlruns file store raises without MLFLOW_ALLOW_FILE_STORE; SQLite is the local default.
    return f"sqlite:///{(root or PROJECT_ROOT).resolve() / 'mlflow.db'}"


def setup_environment(root: Path | None = None) -> None:
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
        # MLflow: no telemetry; tracking defaults to sqlite in the project (TrackingConfig may override).
        "MLFLOW_DISABLE_TELEMETRY": "true",
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
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass

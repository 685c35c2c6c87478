"""Metric logging behind a small protocol, so training code never imports mlflow.

``MlflowLogger`` writes to one run by id through ``MlflowClient`` (MLflow's active run is per thread;
explicit ids work from any thread or subprocess). ``NullLogger`` is for tests and non-zero ranks.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Protocol


def metric_name(key: str) -> str:
    """MLflow allows only [A-Za-z0-9_ ./:-] in names: ``maj@8`` is logged as ``maj_at_8``, any other
    character as ``_`` (``rule+prm`` as ``rule_prm``)."""
    return re.sub(r"[^A-Za-z0-9_ ./:-]", "_", key.replace("@", "_at_"))


class MetricLogger(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_params(self, params: dict[str, Any]) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None: ...
    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None: ...
    def log_input(self, name: str, digest: str, source: str, rows: dict[str, int]) -> None: ...


class NullLogger:
    """Records nothing (but keeps the last metrics, which tests can inspect)."""

    def __init__(self) -> None:
        self.history: list[tuple[int | None, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.history.append((step, dict(metrics)))

    def log_params(self, params: dict[str, Any]) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None: ...
    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None: ...
    def log_input(self, name: str, digest: str, source: str, rows: dict[str, int]) -> None: ...


class MlflowLogger:
    def __init__(self, tracking_uri: str, run_id: str) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        self.run_id = run_id

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric
        import time

        now = int(time.time() * 1000)
        batch = [Metric(metric_name(k), float(v), now, step or 0)
                 for k, v in metrics.items() if math.isfinite(float(v))]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch, synchronous=True)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # log_batch accepts at most 100 params per call
            self.client.log_batch(self.run_id, params=items[i : i + 100], synchronous=True)

    def set_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, v)

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        if rows:
            columns = {k: [r.get(k) for r in rows] for k in rows[0]}
            self.client.log_table(self.run_id, data=columns, artifact_file=artifact_file)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def log_input(self, name: str, digest: str, source: str, rows: dict[str, int]) -> None:
        """Record a dataset the stage read or wrote as an MLflow run input (name, digest, rows)."""
        import json

        from mlflow.entities import Dataset, DatasetInput

        dataset = Dataset(name=name, digest=digest[:36], source_type="local", source=json.dumps({"uri": source}),
                          profile=json.dumps({"rows": rows}))
        self.client.log_inputs(self.run_id, datasets=[DatasetInput(dataset)])


def logger_from_env() -> MetricLogger:
    """The MLflow run a launcher handed to this process (``MLFLOW_RUN_ID`` and
    ``MLFLOW_TRACKING_URI``, set by ``tasks.launch``), or no tracking. The stages log on rank 0 only."""
    import os

    run_id = os.environ.get("MLFLOW_RUN_ID")
    # Other ranks never open the store: N clients creating one sqlite database at once collide.
    if not run_id or int(os.environ.get("RANK", "0")) != 0:
        return NullLogger()
    return MlflowLogger(os.environ.get("MLFLOW_TRACKING_URI", ""), run_id)

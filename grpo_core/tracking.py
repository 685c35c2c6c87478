"""Everything MLflow, in one module: metric logging behind a small protocol (training code never
imports mlflow), and the runs of a pipeline (one parent per pipeline run, a child per stage and
round, ids passed explicitly; ``finishing`` ends them).

``MlflowLogger`` writes to one run by id through ``MlflowClient`` (MLflow's active run is per thread;
explicit ids work from any thread or subprocess). ``NullLogger`` is for tests and non-zero ranks.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Protocol

from grpo_core.config import PipelineConfig
from grpo_core.env import default_tracking_uri


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


def stage_prefix(stage: str | None) -> str:
    """What a stage's MLflow metric names start with, so that the experiment's charts never mix
    stages (``orm/heldout/auc``, ``sft/train/loss``): the stage, except for GRPO, whose metrics keep
    the names the field expects (``train/reward_mean``, ``train/kl``, ...: the only unprefixed ones)."""
    return "" if stage in (None, "grpo") else f"{stage}/"


class MlflowLogger:
    def __init__(self, tracking_uri: str, run_id: str, stage: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        self.run_id = run_id
        self.stage, self.prefix = stage, stage_prefix(stage)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        named = {k if k.startswith(self.prefix) else self.prefix + k: v for k, v in metrics.items()}
        batch = [Metric(metric_name(k), float(v), now, step or 0)
                 for k, v in named.items() if math.isfinite(float(v))]
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
            keys = list(dict.fromkeys(k for r in rows for k in r))  # every row's, first seen first
            columns = {k: [r.get(k) for r in rows] for k in keys}
            self.client.log_table(self.run_id, data=columns, artifact_file=artifact_file)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def log_input(self, name: str, digest: str, source: str, rows: dict[str, int]) -> None:
        """Record a dataset the stage read or wrote as an MLflow run input (name, digest, rows)."""
        from mlflow.entities import Dataset, DatasetInput

        dataset = Dataset(name=name, digest=digest[:36], source_type="local", source=json.dumps({"uri": source}),
                          profile=json.dumps({"rows": rows}))
        self.client.log_inputs(self.run_id, datasets=[DatasetInput(dataset)])


def logger_from_env(stage: str | None = None) -> MetricLogger:
    """The MLflow run a launcher handed to this process (``MLFLOW_RUN_ID`` and
    ``MLFLOW_TRACKING_URI``, set by ``tasks.launch``) for ``stage``'s metrics, or no tracking. The
    stages log on rank 0 only."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    # Other ranks never open the store: N clients creating one sqlite database at once collide.
    if not run_id or int(os.environ.get("RANK", "0")) != 0:
        return NullLogger()
    return MlflowLogger(os.environ.get("MLFLOW_TRACKING_URI", ""), run_id, stage)


# ------------------------------------------------------------------ the pipeline's runs

class TrackingError(RuntimeError):
    pass


def redact(uri: str) -> str:
    """The URI without credentials (``https://user:pw@host`` -> ``https://***@host``), for logs."""
    return re.sub(r"//[^/@]*@", "//***@", uri)


def tracking_uri(cfg: PipelineConfig) -> str:
    return cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def check_tracking(uri: str, timeout_s: float = 5.0) -> None:
    """Fail at start, within ``timeout_s``, when the tracking store cannot be used: a server that
    does not answer, or a sqlite database whose folder cannot be created. MLflow's own client
    retries an unreachable server for minutes, and would do so at the first stage's first metric."""
    import urllib.error
    import urllib.request

    if uri.startswith(("http://", "https://")):
        import base64
        import urllib.parse

        # urllib does not read user:password@ from a URL (MLflow's client does): send it as a header.
        parts = urllib.parse.urlsplit(uri)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
        request = urllib.request.Request(urllib.parse.urlunsplit(parts._replace(netloc=netloc)).rstrip("/") + "/health")
        if parts.username is not None:
            token = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            request.add_header("Authorization", "Basic " + base64.b64encode(token.encode()).decode())
        try:
            urllib.request.urlopen(request, timeout=timeout_s).close()
        except urllib.error.HTTPError:
            pass  # it answered (an auth proxy may refuse /health): reachable
        except (OSError, ValueError) as e:
            raise TrackingError(
                f"MLflow tracking server {redact(uri)} is unreachable ({getattr(e, 'reason', e)}): start it, or "
                f"point tracking.tracking_uri / MLFLOW_TRACKING_URI at a running server or a sqlite:/// file") from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TrackingError(f"MLflow tracking database {uri}: cannot create its folder {folder}: {e}") from None


def run_params(config: PipelineConfig) -> dict[str, str]:
    """The parent run's params: the recipe, flattened, with credentials removed from the tracking
    URI. Only recipe values: nothing from the environment (tokens, passwords) is ever logged."""
    from grpo_core.config import flatten

    params = flatten(config)
    params["tracking.tracking_uri"] = redact(params["tracking.tracking_uri"])
    return params


# MLflow opens an experiment of this kind in its model-training view (runs, charts, the model
# registry in the sidebar) rather than the GenAI view (traces, judges, prompts).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# MLflow 3's UI also remembers the last view per browser; an address with this query opens the
# model-training view whatever was chosen before (the links the project prints carry it).
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def experiment_id(uri: str, name: str) -> str:
    """Get or create the experiment (of the model-training kind); fails at start (not mid-run) when
    the server is unreachable."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    try:
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if not set(EXPERIMENT_KIND) & set(exp.tags):  # made before the kind was set; a user's choice stays
                for key, value in EXPERIMENT_KIND.items():
                    client.set_experiment_tag(exp.experiment_id, key, value)
            return exp.experiment_id
        artifacts = None
        if uri.startswith("sqlite:///"):  # keep artifacts beside the database, not in the cwd
            artifacts = (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
        return client.create_experiment(name, artifact_location=artifacts, tags=EXPERIMENT_KIND)
    except MlflowException as e:
        raise TrackingError(f"MLflow tracking at {redact(uri)} is not usable: {e}") from None


def start_run(uri: str, exp_id: str, name: str, parent_id: str | None = None, tags: dict | None = None) -> str:
    from mlflow.tracking import MlflowClient

    all_tags = {"mlflow.runName": name, **(tags or {})}
    if parent_id:
        all_tags["mlflow.parentRunId"] = parent_id
    return MlflowClient(uri).create_run(exp_id, tags=all_tags, run_name=name).info.run_id


def end_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).set_terminated(run_id, status)


@contextmanager
def finishing(uri: str, run_ids: list[str]) -> Iterator[None]:
    """Marks the MLflow runs FINISHED when the block completes, FAILED when it raises: the one place
    where a flow's runs end. ``run_ids`` is read on exit, so runs the block starts can join it."""
    try:
        yield
    except BaseException:
        for run_id in run_ids:
            end_run(uri, run_id, "FAILED")
        raise
    for run_id in run_ids:
        end_run(uri, run_id, "FINISHED")

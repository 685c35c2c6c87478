"""MLflow runs for the pipeline: one parent per pipeline run, one child per stage, ids passed explicitly."""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from grpo_core.config import PipelineConfig
from grpo_core.env import default_tracking_uri
from grpo_core.tracking import MlflowLogger


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


def experiment_id(uri: str, name: str) -> str:
    """Get or create the experiment; fails at start (not mid-run) when the server is unreachable."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    try:
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        artifacts = None
        if uri.startswith("sqlite:///"):  # keep artifacts beside the database, not in the cwd
            artifacts = (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
        return client.create_experiment(name, artifact_location=artifacts)
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


class ConsoleEchoLogger(MlflowLogger):
    """Also reports validation metrics to the Prefect run log, so a terminal running the flow (and
    the Prefect UI) shows progress.

    Through Prefect's logger, not ``log_prints``: that patch also catches what libraries print into
    a captured stdout (dill's bytecode listing while datasets fingerprints a table)."""

    def __init__(self, uri: str, run_id: str, stage: str) -> None:
        super().__init__(uri, run_id)
        self.stage = stage

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        from prefect.exceptions import MissingContextError
        from prefect.logging import get_run_logger

        super().log_metrics(metrics, step)
        shown = {k: round(v, 4) for k, v in metrics.items() if k.startswith("val/")}
        if shown:
            try:
                get_run_logger().info("[%s] step %s: %s", self.stage, step, shown)
            except MissingContextError:
                print(f"[{self.stage}] step {step}: {shown}", flush=True)


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


@contextmanager
def child_run(uri: str, parent_id: str, name: str, params: dict | None = None) -> Iterator[MlflowLogger]:
    """A nested run for one stage, marked FAILED if the stage raises."""
    from mlflow.tracking import MlflowClient

    exp_id = MlflowClient(uri).get_run(parent_id).info.experiment_id
    run_id = start_run(uri, exp_id, name, parent_id)
    logger = ConsoleEchoLogger(uri, run_id, name)
    with finishing(uri, [run_id]):
        if params:
            logger.log_params(params)
        yield logger

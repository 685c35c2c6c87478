"""``tracking``: the MLflow store, experiment and registered model."""

from __future__ import annotations

from pydantic import Field

from grpo_core.config.base import Section


class TrackingConfig(Section):
    # None: $MLFLOW_TRACKING_URI if set, else sqlite:///<project>/mlflow.db
    tracking_uri: str | None = Field(
        None, description="None: $MLFLOW_TRACKING_URI, else sqlite mlflow.db in the project"
    )
    experiment: str = Field("grpo-pipeline", description="MLflow experiment")
    # A store that stops answering mid-run: metrics wait in runs/<run>/mlflow-unsent and training goes
    # on; only what needs an answer (a stage's new run, a model version) waits this long, then stops.
    wait_s: float = Field(
        600.0,
        ge=0,
        description="how long to wait for a tracking store that stopped answering before a stage's run can start",
    )
    # Every round's policy becomes a version; alias `champion` marks the best by validation accuracy.
    registered_model: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="MLflow registered model of the policies; None = <run_name>-policy",
    )

"""The MLflow model registry of a run's policies: one version per RL round, alias ``champion`` on the
best by validation accuracy.

A version points at the ``policy/`` artifacts of its round's MLflow run (a Hugging Face folder):
``mlflow.artifacts.download_artifacts("models:/<name>@champion")`` fetches the champion, which
``AutoModelForCausalLM.from_pretrained`` then loads.
"""

from __future__ import annotations

from pathlib import Path

from grpo_core.tracking import MlflowLogger

CHAMPION = "champion"


def registered_name(cfg) -> str:
    return cfg.tracking.registered_model or f"{cfg.run_name}-policy"


def register_policy(
    uri: str, name: str, run_id: str, model_dir: str | Path, round_: int, val_accuracy: float, digest: str
) -> str:
    """Register round ``round_``'s policy; returns its version. Idempotent: a re-run whose round came
    from the cache finds the version with the same round and weights digest instead of adding one."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    try:
        client.create_registered_model(
            name,
            description="GRPO policies, one version per RL round "
            "(Hugging Face folders); alias champion = best validation accuracy",
        )
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    for version in client.search_model_versions(f"name='{name}'"):
        if version.tags.get("digest") == digest and version.tags.get("round") == str(round_):
            return str(version.version)
    MlflowLogger(uri, run_id).log_artifacts(model_dir, "policy")
    version = client.create_model_version(
        name,
        source=f"runs:/{run_id}/policy",
        run_id=run_id,
        tags={"round": str(round_), "val_accuracy": f"{val_accuracy:.6f}", "digest": digest},
        description=f"policy after RL round {round_} (validation accuracy {val_accuracy:.4f})",
    )
    return str(version.version)


def promote_champion(uri: str, name: str, versions: list[str]) -> dict:
    """Move alias ``champion`` to the best of ``versions`` (this run's rounds) by validation accuracy,
    the earliest on a tie (a round whose best checkpoint was its start registers the same weights
    again). Versions of other recipes registered under the same name never compete: their
    validation sets and starting points may differ."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    candidates = [client.get_model_version(name, v) for v in versions]
    best = max(candidates, key=lambda v: (float(v.tags.get("val_accuracy", "-1")), -int(v.version)))
    client.set_registered_model_alias(name, CHAMPION, best.version)
    return {
        "name": name,
        "version": str(best.version),
        "round": int(best.tags["round"]),
        "val_accuracy": float(best.tags["val_accuracy"]),
    }

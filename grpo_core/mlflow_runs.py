"""A pipeline's MLflow runs: the store (its URI, a moved project's artifact locations; whether it
answers is ``tracking.check_tracking``), one experiment per pipeline, a parent run per pipeline run
and a child per stage and round (ids passed explicitly), and ``finishing``, where they end. Metric logging itself is
``tracking.py``'s."""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from grpo_core.config import PipelineConfig
from grpo_core.env import default_tracking_uri
from grpo_core.recipe import flatten
from grpo_core.tracking import MlflowLogger, TrackingError, UNSENT, is_outage, log, redact

T = TypeVar("T")


def tracking_uri(cfg: PipelineConfig) -> str:
    return cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def run_params(config: PipelineConfig) -> dict[str, str]:
    """The parent run's params: the recipe, flattened, with credentials removed from the tracking
    URI. Only recipe values: nothing from the environment (tokens, passwords) is ever logged."""
    params = flatten(config)
    params["tracking.tracking_uri"] = redact(params["tracking.tracking_uri"])
    return params


# The sections that decide what a round does: a round's run carries them, so that MLflow's compare
# view shows which settings differ between two rounds or two recipes.
ROUND_SECTIONS = ("grpo.", "reward_data.", "orm.", "prm.", "rounds.")


def round_params(config: PipelineConfig, k: int) -> dict[str, str]:
    """Round ``k``'s run's params: its number and the recipe's round sections as its GRPO ran them
    (after the reward models' quality gate); not ``rounds.count``, which decides how many rounds
    follow, not what this one does."""
    return {"round": str(k)} | {
        key: v for key, v in run_params(config).items() if key.startswith(ROUND_SECTIONS) and key != "rounds.count"
    }


# MLflow opens an experiment of this kind in its model-training view (runs, charts, the model
# registry in the sidebar) rather than the GenAI view (traces, judges, prompts).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# MLflow 3's UI also remembers the last view per browser; an address with this query opens the
# model-training view whatever was chosen before (the links the project prints carry it).
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def experiment_id(uri: str, name: str, wait_s: float = 0.0) -> str:
    """Get or create the experiment (of the model-training kind), waiting up to ``wait_s`` for a
    store that does not answer (``patiently``)."""
    from mlflow.exceptions import MlflowException

    try:
        return patiently(lambda: _experiment_id(uri, name), uri, wait_s, f"find its MLflow experiment {name!r}")
    except MlflowException as e:
        raise TrackingError(f"MLflow tracking at {redact(uri)} is not usable: {e}") from None


_PLACED: set[Path] = set()  # SQLite stores whose artifact locations this process has checked (relocate)


def _experiment_id(uri: str, name: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    artifacts = place_artifacts(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if not set(EXPERIMENT_KIND) & set(exp.tags):  # made before the kind was set; a user's choice stays
            for key, value in EXPERIMENT_KIND.items():
                client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id
    return client.create_experiment(name, artifact_location=artifacts, tags=EXPERIMENT_KIND)


def place_artifacts(uri: str) -> str | None:
    """A local SQLite store keeps its artifacts beside the database (``mlartifacts/``, not the cwd):
    that folder's URI, after re-pointing the experiments of a moved or copied project at it
    (``relocate``; once per store and process). None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri.removeprefix("sqlite:///")).resolve()
    artifacts = (db.parent / "mlartifacts").as_uri()
    if db not in _PLACED and db.exists():
        from mlflow.entities import ViewType
        from mlflow.tracking import MlflowClient

        for exp in MlflowClient(uri).search_experiments(view_type=ViewType.ALL):
            if _ours(exp.artifact_location) and exp.artifact_location != artifacts:
                relocate(db, exp.artifact_location, artifacts)
        _PLACED.add(db)
    return artifacts


def _ours(location: str) -> bool:
    """An artifact folder the project made beside its SQLite database (``_experiment_id``)."""
    return location.startswith("file:") and location.rstrip("/").endswith("/mlartifacts")


def relocate(db: Path, old: str, new: str) -> None:
    """A project moved or copied with its ``mlflow.db``: every artifact URI the database holds under
    ``old`` (the ``mlartifacts`` folder beside it where it was made) now points to ``new`` (the one
    beside it now), and what ``new`` lacks of ``old``'s folders, where ``old`` still exists (a copy),
    is copied over first, so that a copy's runs, old and new, keep their figures when the original
    is deleted. MLflow stores an experiment's artifact location and each run's as absolute URIs for
    good and has no call to move them (mlflow/mlflow#3144 and #8226, open): this is our own, a
    prefix replaced in the text columns that begin with it, in one transaction."""
    import sqlite3
    from urllib.parse import unquote, urlparse

    source, target = Path(unquote(urlparse(old).path)), Path(unquote(urlparse(new).path))
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        for folder in source.iterdir():
            if not (target / folder.name).exists():
                (shutil.copytree if folder.is_dir() else shutil.copy2)(folder, target / folder.name)
    with sqlite3.connect(db, timeout=60) as conn:
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            for column in [
                row[1]
                for row in conn.execute(f'PRAGMA table_info("{table}")')
                if any(t in row[2].upper() for t in ("CHAR", "TEXT", "CLOB"))
            ]:
                conn.execute(
                    f'UPDATE "{table}" SET "{column}" = ? || substr("{column}", ?) '
                    f'WHERE "{column}" = ? OR substr("{column}", 1, ?) = ?',
                    (new, len(old) + 1, old, len(old) + 1, old + "/"),
                )
    log.warning(
        "the project moved or was copied: its MLflow store %s now keeps artifacts at %s (they were at %s)",
        db,
        target,
        source,
    )


def patiently(call: Callable[[], T], uri: str, wait_s: float, what: str) -> T:
    """``call()``; while the tracking store does not answer, try again every 5 s for up to ``wait_s``
    (what cannot be deferred, such as starting a run whose id a stage needs), then stop saying what
    is kept and how to go on."""
    deadline, warned = time.monotonic() + wait_s, False
    while True:
        try:
            return call()
        except Exception as e:
            if not is_outage(e):
                raise
            if time.monotonic() >= deadline:
                raise TrackingError(
                    f"MLflow tracking at {redact(uri)} does not answer ({str(e)[:160]}), so the run could not {what}"
                    f"{f' within tracking.wait_s ({wait_s:g} s)' if wait_s else ''}. Nothing finished is lost: the "
                    f"stages' folders and checkpoints are kept, and what tracking missed waits in the run folder's "
                    f"{UNSENT}/. Run the same command once the server answers: finished stages come from the cache "
                    f"and the kept records are sent"
                ) from None
            if not warned:
                log.warning(
                    "MLflow tracking at %s does not answer: waiting up to %g s to %s", redact(uri), wait_s, what
                )
                warned = True
            time.sleep(max(0.0, min(5.0, deadline - time.monotonic())))


def start_run(
    uri: str, exp_id: str, name: str, parent_id: str | None = None, tags: dict | None = None, wait_s: float = 0.0
) -> str:
    from mlflow.tracking import MlflowClient

    all_tags = {"mlflow.runName": name, **(tags or {})}
    if parent_id:
        all_tags["mlflow.parentRunId"] = parent_id
    return patiently(
        lambda: MlflowClient(uri).create_run(exp_id, tags=all_tags, run_name=name).info.run_id,
        uri,
        wait_s,
        f"start its MLflow run {name!r}",
    )


def logged_round(uri: str, grpo_run_id: str) -> str | None:
    """The finished round run that logged the round whose GRPO stage ran as ``grpo_run_id`` (its
    ``stage_run.grpo`` tag), with the round's metrics: a round served whole from the cache is that
    run, not a copy of it. None where there is none (the round's logging never finished)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    try:
        exp = client.get_run(grpo_run_id).info.experiment_id
        runs = client.search_runs(
            [exp],
            f"tags.`stage_run.grpo` = '{grpo_run_id}' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time ASC"],
        )
    except MlflowException:  # the stage's run deleted since, or in another store
        return None
    return next((r.info.run_id for r in runs if "round/test_accuracy" in r.data.metrics), None)


def delete_run(uri: str, run_id: str) -> None:
    """Move a run to MLflow's trash (``mlflow gc`` removes it for good); a store that does not answer
    leaves it where it is, with a warning (an empty run does no harm)."""
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(uri).delete_run(run_id)
    except Exception as e:  # noqa: BLE001 (MLflow raises several kinds for a store that is away)
        log.warning("could not move the empty MLflow run %s to the trash: %s", run_id, e)


@contextmanager
def finishing(uri: str, run_ids: list[str], unsent: Path | None = None) -> Iterator[None]:
    """Marks the MLflow runs FINISHED when the block completes, FAILED when it raises: the one place
    where a flow's runs end (kept in ``unsent`` when the store does not answer). ``run_ids`` is read on
    exit, so runs the block starts can join it."""
    try:
        yield
    except BaseException as error:
        for run_id in run_ids:
            try:  # the block's error is the one to see, not a failure to record it
                logger = MlflowLogger(uri, run_id, unsent=unsent)
                logger.set_tags({"error": f"{type(error).__name__}: {error}"[:5000]})
                logger.terminate("FAILED")
            except Exception as e:
                log.warning("could not mark MLflow run %s FAILED: %s", run_id, e)
        raise
    for run_id in run_ids:
        MlflowLogger(uri, run_id, unsent=unsent).terminate("FINISHED")

"""The ``corpus`` flow: the recall loop of ``grpo_core.corpus.stage`` with each pass over the pool a
``score-pool`` task (one scoring process that loads the classifier once and forks a worker per core:
``grpo_core.corpus.score``) or, with ``corpus.runner: dask | ray``, tasks of a few shards each on that
cluster (``tasks.corpus``), URL prefixes approved by a person in the Prefect UI
(``corpus.interactive``) or read from ``corpus.annotations``, and an MLflow run
``corpus-<run_name>`` with a child run per iteration.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput

from flows import artifact_key
from grpo_core.config import PipelineConfig
from grpo_core.corpus.stage import run_corpus
from grpo_core.mlflow_runs import experiment_id, finishing, start_run, tracking_uri
from grpo_core.tracking import MlflowLogger, check_tracking, unsent_dir
from tasks.corpus import passes


class PrefixApproval(RunInput):
    """What the person approving URL prefixes answers in the Prefect UI."""

    approved: list[str] = []


def approve_in_ui(iteration: int, candidates: dict[str, dict[str, int]]) -> list[str]:
    """Pause the flow until a person approves math URL prefixes among the candidates (Prefect UI:
    the flow run's "Resume" form)."""
    lines = [
        f"Iteration {iteration}: approve the URL prefixes that hold math pages.",
        "",
        "| prefix | pages | collected | would join the seed |",
        "|---|---|---|---|",
    ]
    lines += [f"| {p} | {s['pages']} | {s['collected']} | {s['uncollected']} |" for p, s in candidates.items()]
    answer = pause_flow_run(
        wait_for_input=PrefixApproval.with_initial_data(description="\n".join(lines), approved=[]),
        timeout=7 * 24 * 3600,
        poll_interval=2,
    )
    return [p for p in answer.approved if p in candidates]


approve_in_ui.source = "a person in the Prefect UI"


def loso_rows(report: dict) -> list[dict]:
    """One row per classifier: macro metrics over held-out sources and the calibration error."""
    return [
        {
            "classifier": name,
            **r["macro"],
            "ece": r["ece"],
            "threshold": r["threshold"],
            **({"threshold_for_target": r["threshold_for_target"]} if "threshold_for_target" in r else {}),
        }
        for name, r in report.items()
    ]


@flow(name="corpus", flow_run_name="{config.run_name}/corpus")
def corpus(
    config: PipelineConfig, own_benchmarks: dict[str, str] | None = None, parent_run_id: str | None = None
) -> dict:
    """The recall loop and decontamination. ``own_benchmarks``: the project's evaluation splits,
    removed like the configured benchmarks; ``parent_run_id``: nest the MLflow run (the pipeline)."""
    log = get_run_logger()
    out_dir = (config.run_dir / "corpus").resolve()
    uri = tracking_uri(config)
    unsent, wait_s = unsent_dir(config.run_dir.resolve()), config.tracking.wait_s
    if parent_run_id is None:  # on its own: an unreachable server fails here (in a pipeline: it waits)
        check_tracking(uri)
    exp = experiment_id(uri, config.tracking.experiment, wait_s)
    parent = start_run(
        uri,
        exp,
        "corpus" if parent_run_id else f"corpus-{config.run_name}",
        parent_id=parent_run_id,
        tags={"pipeline": "deepseekmath-corpus"},
        wait_s=wait_s,
    )
    runs = [parent]  # and a run per iteration, as the loop starts them

    def iteration_logger(k: int) -> MlflowLogger:
        runs.append(start_run(uri, exp, f"iteration-{k}", parent_id=parent, wait_s=wait_s))
        return MlflowLogger(uri, runs[-1], unsent=unsent)

    approve = approve_in_ui if config.corpus.interactive else None  # None: the annotations file
    with finishing(uri, runs, unsent), passes(config.corpus) as where:
        manifest = run_corpus(
            config,
            out_dir,
            MlflowLogger(uri, parent, unsent=unsent),
            approve=approve,
            iteration_logger=iteration_logger,
            own_benchmarks={k: Path(v) for k, v in (own_benchmarks or {}).items()},
            **where,
        )
    manifest["mlflow_run_id"] = parent
    check = manifest.get("seed_check") or {}
    if check.get("leave_one_source_out"):
        rows = loso_rows(check["leave_one_source_out"])
        create_table_artifact(
            key=artifact_key(f"corpus-loso-{config.run_name}"),
            table=rows,
            description="the classifier on seed sources it never saw (leave-one-source-out)",
        )
        for r in rows:
            log.info("corpus: leave-one-source-out %s", r)
    elif check:
        log.warning("corpus: no leave-one-source-out check: %s", check["reason"])
    log.info(
        "corpus: %d pages after %d iterations; removed by decontamination: %s",
        manifest["pages"],
        len(manifest["iterations"]),
        manifest["removed"] or "none",
    )
    return manifest

"""The corpus flow's tasks and where they run. ``corpus.runner: local``: each pass over the pool is
one ``score-pool`` task (one scoring process that loads the classifier once and forks a worker per
core, the core's ``score_pool``) and decontamination runs in the flow's process. ``dask`` / ``ray``:
both passes are tasks of ``corpus.shards_per_task`` shards each, submitted through Prefect's
``DaskTaskRunner`` / ``RayTaskRunner`` (prefect-dask, prefect-ray) to the cluster at
``corpus.address``, or to one started for the flow on 127.0.0.1 with ``corpus.workers`` processes."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from grpo_core.config import CorpusConfig
from grpo_core.corpus.score import score_in_groups, score_pool


@task(name="score-pool")
def score_pool_task(model_path: Path, pool: list[Path], out_dir: Path, workers: int | None = None) -> list[Path]:
    return score_pool(model_path, pool, out_dir, workers)


def _local_dask(cc: CorpusConfig) -> dict:
    # One single-threaded worker process per core, every socket on loopback, no dashboard server.
    return {
        "cluster_kwargs": {
            "n_workers": cc.workers or len(os.sched_getaffinity(0)),
            "threads_per_worker": 1,
            "processes": True,
            "host": "127.0.0.1",
            "dashboard_address": None,
        }
    }


def _local_ray(cc: CorpusConfig) -> dict:
    # Some of Ray's ports still bind every interface with this address (docs/scaling.md).
    return {
        "init_kwargs": {
            "num_cpus": cc.workers or len(os.sched_getaffinity(0)),
            "include_dashboard": False,
            "_node_ip_address": "127.0.0.1",
        }
    }


# corpus.runner -> (module, its Prefect task runner, the runner's settings for a cluster the flow
# starts, what to install)
TASK_RUNNERS = {
    "dask": (
        "prefect_dask",
        "DaskTaskRunner",
        _local_dask,
        'prefect-dask (in requirements.txt: make, or pip install -e ".[cluster]")',
    ),
    "ray": (
        "prefect_ray",
        "RayTaskRunner",
        _local_ray,
        'prefect-ray and ray (pip install -e ".[ray]"; not in the pinned set)',
    ),
}


def task_runner(cc: CorpusConfig):
    """The Prefect task runner for ``corpus.runner``: on the cluster at ``corpus.address``, or on one
    it starts on this machine."""
    module, name, local, install = TASK_RUNNERS[cc.runner]
    try:
        runner = getattr(importlib.import_module(module), name)
    except ImportError:
        raise RuntimeError(f"corpus.runner={cc.runner} needs {install}") from None
    return runner(address=cc.address) if cc.address else runner(**local(cc))


def submit_all(runner, fn: Callable[..., Any], calls: list[tuple]) -> list[Any]:
    """``MapTasks`` on a started Prefect task runner: each call a task named after the core function
    (``score-jobs``, ``decontaminate-shards``), all submitted before any result is awaited; the
    first failure raises its own error (a bad page: its file and line)."""
    # No result cache: a task's inputs (a group's collected URLs) are large and its outputs are files.
    as_task = task(fn, name=fn.__name__.replace("_", "-"), cache_policy=NO_CACHE)
    signature = inspect.signature(fn)
    futures = [runner.submit(as_task, parameters=signature.bind(*call).arguments) for call in calls]
    return [f.result() for f in futures]


@contextlib.contextmanager
def passes(cc: CorpusConfig) -> Iterator[dict[str, Callable]]:
    """``run_corpus``'s ``score_shards`` and ``map_tasks`` for ``corpus.runner``; for a cluster its task
    runner is started for the whole loop (a local cluster once, not once per pass) and closed after."""
    if cc.runner == "local":
        yield {"score_shards": partial(score_pool_task, workers=cc.workers)}
        return
    with task_runner(cc) as runner:
        map_tasks = partial(submit_all, runner)
        yield {
            "score_shards": partial(score_in_groups, map_tasks=map_tasks, per_task=cc.shards_per_task),
            "map_tasks": map_tasks,
        }

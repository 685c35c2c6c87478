"""The corpus flow's scoring task: one pass over the pool with one classifier. The scoring itself
(one process that loads the classifier once and forks a worker per core) is the core's
``score_pool``; as a task it shows in the Prefect UI, once per iteration of the recall loop."""
from __future__ import annotations

from pathlib import Path

from prefect import task

from grpo_core.corpus.score import score_pool


@task(name="score-pool")
def score_pool_task(model_path: Path, pool: list[Path], out_dir: Path) -> list[Path]:
    return score_pool(model_path, pool, out_dir)

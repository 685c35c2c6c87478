"""Scoring the pool: ``url<TAB>P(math)`` for every page of every shard, in parallel.

``score_pool`` starts one scoring process per pass (``python -m grpo_core.corpus.score``). It loads
the classifier once, then forks its workers, which share that copy of it: the start-up of a pass is
one load (about 2.5 s for the paper's 2 GB classifier) and the memory one classifier, however many
workers score. The scoring process imports fastText and the corpus helpers only (no torch, no
Prefect) and allocates the classifier on transparent huge pages. Prediction looks up a row of the
2 GB embedding matrix for every word and n-gram; with 4 KB pages nearly each lookup misses the TLB,
and huge pages made ``predict`` about 25% faster (``bench/corpus_scoring.py``). glibc reads that
setting at process start, which is one reason the scorer is a process of its own.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from grpo_core.corpus import classifier
from grpo_core.corpus.docs import CorpusError, Doc, read_shard

HUGE_PAGES = "glibc.malloc.hugetlb=1"
STAMP = "classifier.stamp"


def huge_pages_env() -> dict[str, str]:
    """This process's environment with glibc asked to back large allocations with huge pages (other
    C libraries ignore the setting)."""
    env = dict(os.environ)
    current = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in current:
        env["GLIBC_TUNABLES"] = f"{current}:{HUGE_PAGES}" if current else HUGE_PAGES
    return env


def scored(model, docs: Iterable[Doc], batch: int = 4096) -> Iterator[tuple[Doc, float]]:
    """(page, P(math)) for a stream of pages, predicted ``batch`` at a time: at most one batch of
    texts is in memory."""
    pages = iter(docs)
    while chunk := list(itertools.islice(pages, batch)):
        yield from zip(chunk, classifier.math_scores(model, [d.text for d in chunk]))


def score_shard(model, shard: Path, out_file: Path) -> int:
    """Write ``url<TAB>P(math)`` for every page of one shard through a temporary file (a file that
    exists is complete); returns the number of pages."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(out_file.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for d, s in scored(model, read_shard(shard)):
            f.write(f"{d.url}\t{s:.6f}\n")
            n += 1
    tmp.replace(out_file)
    return n


def score_pool(model_path: Path, pool: list[Path], out_dir: Path, workers: int | None = None) -> list[Path]:
    """Score every shard of ``pool`` into ``out_dir/00000.tsv``, ... with ``workers`` processes (default:
    every core this process may use). Shards this classifier already scored, in a pass that was
    stopped part way, are kept; a different classifier starts the directory over."""
    return run_scorer(model_path, pool, out_dir, workers)["outputs"]


def _stamp(model_path: Path) -> str:
    st = Path(model_path).stat()
    return f"{Path(model_path).resolve()}|{st.st_size}|{st.st_mtime_ns}"


def pending(model_path: Path, pool: list[Path], out_dir: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """The score file of every shard of ``pool``, and the (shard, score file) jobs not yet done by
    this classifier: a pass stopped part way keeps what it finished; another classifier starts over."""
    outputs = [out_dir / f"{i:05d}.tsv" for i in range(len(pool))]
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (out_dir / STAMP).exists() or (out_dir / STAMP).read_text() != _stamp(model_path):
        for old in out_dir.glob("*.tsv"):
            old.unlink()
        (out_dir / STAMP).write_text(_stamp(model_path))
    return outputs, [(str(s), str(o)) for s, o in zip(pool, outputs) if not o.exists()]


def run_scorer(model_path: Path, pool: list[Path], out_dir: Path, workers: int | None = None) -> dict:
    """``score_pool`` with the scoring process's report: ``outputs``, ``pages``, ``load_s`` (the
    classifier's load), ``score_s`` and ``wall_s`` (the whole call, process start included)."""
    t0 = time.perf_counter()
    outputs, jobs = pending(model_path, pool, out_dir)
    report = {"pages": 0, "load_s": 0.0, "score_s": 0.0}
    if jobs:
        (out_dir / "jobs.json").write_text(json.dumps(jobs))
        workers = workers or len(os.sched_getaffinity(0))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpo_core.corpus.score",
                "--model",
                str(model_path),
                "--jobs",
                str(out_dir / "jobs.json"),
                "--workers",
                str(workers),
            ],
            env=huge_pages_env(),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line.strip()] or [f"exit status {proc.returncode}"]
            reason = re.sub(r"^[\w.]*(Error|Exception): ", "", lines[-1])  # the message: it names the file and line
            raise CorpusError(f"scoring {len(jobs)} shard(s) with {model_path} failed: {reason}")
        report = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**report, "outputs": outputs, "wall_s": time.perf_counter() - t0}


# ---------------------------------------------------------------------------- on a cluster

MapTasks = Callable[[Callable[..., Any], list[tuple]], list[Any]]


def run_here(fn: Callable[..., Any], calls: list[tuple]) -> list[Any]:
    """``MapTasks`` in this process, one call after another (the local runner)."""
    return [fn(*c) for c in calls]


_LOADED: dict[str, Any] = {}  # this process's classifier, by stamp: a cluster worker loads it once a pass


def loaded(model_path: str | Path):
    key = _stamp(Path(model_path))
    if key not in _LOADED:
        _LOADED.clear()  # the previous iteration's classifier
        _LOADED[key] = classifier.load(Path(model_path))
    return _LOADED[key]


def score_jobs(model_path: str, jobs: list[tuple[str, str]]) -> int:
    """One cluster task: score a group of shards in this process with the classifier it keeps loaded
    (a worker loads it at its first task of a pass, not once per task); a shard scored already is
    skipped; a bad page raises ``CorpusError`` naming its file and line. Returns the pages scored."""
    model = loaded(model_path)
    return sum(score_shard(model, Path(shard), Path(out)) for shard, out in jobs if not Path(out).exists())


def score_in_groups(
    model_path: Path, pool: list[Path], out_dir: Path, map_tasks: MapTasks, per_task: int
) -> list[Path]:
    """``score_pool`` as tasks of ``per_task`` shards each, run by ``map_tasks`` (Prefect's Dask or Ray
    task runner in the corpus flow); finished shards are kept as in ``score_pool``."""
    outputs, jobs = pending(model_path, pool, out_dir)
    map_tasks(score_jobs, [(str(model_path), jobs[i : i + per_task]) for i in range(0, len(jobs), per_task)])
    return outputs


_MODEL = None  # the scoring process's classifier, loaded before the workers fork and shared by them


def _score_job(job: tuple[str, str]) -> tuple[int, str | None]:
    """(pages, None), or (0, the error) for a shard with a bad page: the other shards still finish."""
    try:
        return score_shard(_MODEL, Path(job[0]), Path(job[1])), None
    except CorpusError as e:
        return 0, str(e)


def _main() -> None:
    global _MODEL
    p = argparse.ArgumentParser(description="Score pool shards with one classifier (run by score_pool).")
    p.add_argument("--model", required=True)
    p.add_argument("--jobs", required=True, help="JSON list of [shard, output file] pairs")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()
    jobs = json.loads(Path(args.jobs).read_text())
    jobs.sort(key=lambda j: -Path(j[0]).stat().st_size)  # the largest first: the workers finish together
    t0 = time.perf_counter()
    _MODEL = loaded(args.model)
    t1 = time.perf_counter()
    workers = min(args.workers, len(jobs))
    if workers <= 1:
        done = list(map(_score_job, jobs))
    else:  # fork: the workers share the loaded classifier's memory copy-on-write (it is only read)
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            done = list(pool.imap_unordered(_score_job, jobs))
    errors = [e for _, e in done if e]
    if errors:
        raise CorpusError(
            errors[0] + (f" (and {len(errors) - 1} more shard(s) with errors)" if len(errors) > 1 else "")
        )
    print(json.dumps({"pages": sum(n for n, _ in done), "load_s": t1 - t0, "score_s": time.perf_counter() - t1}))


if __name__ == "__main__":
    _main()

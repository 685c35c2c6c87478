"""Scoring throughput on ../shared/data/corpus/docs.jsonl.gz (46,663 pages in 8 JSONL shards), in
one run: bare fastText ``predict`` on the texts in memory (one process: the baseline) and the corpus
flow's scoring pass, ``score_pool`` (read, normalise, score, write), end to end: from the call to
the last score written, the scoring process's start and the classifier's load included. The paper's
classifier settings. Prints one JSON object with pages/s and the ratios to the bare rate.

    .venv/bin/python bench/corpus_scoring.py [--repeat 8] [--pages N] [--bucket B]

``--dask N`` (default 2; 0: skip) also scores the pool as the corpus flow does with
``corpus.runner: dask``: tasks of ``--shards-per-task`` shards on a local Dask cluster of N worker
processes started by Prefect's ``DaskTaskRunner`` (``dask_*``: from the first submission, the
workers' start and the classifier's loads included; ``dask_warm_*``: the same pass again on the
warm cluster), and times ``--noop-tasks`` empty tasks through the same runner: what scheduling
costs per task.

``--repeat`` copies the pages (new URLs) to make a bigger pool. The scoring process allocates the
classifier on transparent huge pages; so that the reader can tell that gain from the parallelism,
bare ``predict`` is also timed in a process started with the same setting (``bare_huge_pages_*``),
and ``score_pool`` with one worker (``score_pool_1_worker_*``). The target ratio is against plain
bare ``predict``.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path

from grpo_core.env import setup_environment

SHARDS = 16
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus" / "docs.jsonl.gz"


def _bare_rate(model_path: Path, shards: list[Path]) -> float:
    """Bare ``predict`` pages/s in this process (texts read before the clock starts)."""
    from grpo_core.corpus import classifier

    texts = [json.loads(line)["text"].replace("\n", " ") for s in shards for line in s.open(encoding="utf-8")]
    model = classifier.load(model_path)
    t0 = time.perf_counter()
    model.predict(texts, k=1)
    return len(texts) / (time.perf_counter() - t0)


def noop(i: int) -> int:
    return i


def _on_dask(model_path: Path, shards: list[Path], out_dir: Path, workers: int, per_task: int, noops: int) -> dict:
    """Start a local Dask cluster through Prefect, score the pool on it, then time empty tasks."""
    from prefect.testing.utilities import prefect_test_harness

    from grpo_core.config import CorpusConfig
    from grpo_core.corpus.score import score_in_groups
    from tasks.corpus import passes, submit_all

    cc = CorpusConfig(runner="dask", workers=workers, shards_per_task=per_task)
    with prefect_test_harness():  # a throw-away Prefect API for the task runs
        t0 = time.perf_counter()
        with passes(cc) as where:
            runner = where["map_tasks"].args[0]
            t1 = time.perf_counter()
            score_in_groups(model_path, shards, out_dir, where["map_tasks"], per_task)
            t2 = time.perf_counter()
            # The same pass again on the warm cluster: the workers started and the classifier loaded.
            score_in_groups(
                model_path, shards, out_dir.with_name(out_dir.name + "-again"), where["map_tasks"], per_task
            )
            t3 = time.perf_counter()
            submit_all(runner, noop, [(i,) for i in range(noops)])
            t4 = time.perf_counter()
    return {
        "start_s": t1 - t0,
        "score_s": t2 - t1,
        "warm_score_s": t3 - t2,
        "per_task_ms": 1000 * (t4 - t3) / max(noops, 1),
    }


def main() -> None:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=8)
    p.add_argument("--pages", type=int, help="only the corpus's first N pages (a quick check)")
    p.add_argument("--bucket", type=int, default=2_000_000, help="n-gram buckets (the paper's classifier: 2M, 2 GB)")
    p.add_argument("--dask", type=int, default=2, help="workers of the local Dask cluster (0: no Dask run)")
    p.add_argument("--shards-per-task", type=int, default=2)
    p.add_argument("--noop-tasks", type=int, default=64)
    a = p.parse_args()
    repeat = a.repeat
    setup_environment()
    from grpo_core.corpus import classifier
    from grpo_core.corpus.score import huge_pages_env, run_scorer

    work = Path(tempfile.mkdtemp(prefix="score-bench-"))
    base = [json.loads(line) for line in gzip.open(CORPUS, "rt", encoding="utf-8")][: a.pages]
    docs = [{**d, "url": f"{d['url']}?copy={r}"} for r in range(repeat) for d in base]
    (work / "pool").mkdir()
    shards = []
    for i in range(SHARDS):
        path = work / "pool" / f"{i}.jsonl"
        path.write_text("".join(json.dumps({"url": d["url"], "text": d["text"]}) + "\n" for d in docs[i::SHARDS]))
        shards.append(path)
    classifier.write_training_file(
        work / "train.txt",
        [d["text"] for d in base[::4] if d["label"] == "math"],
        [d["text"] for d in base[::4] if d["label"] != "math"],
        seed=0,
    )
    model_path = work / "classifier.bin"
    classifier.train(
        work / "train.txt", dim=256, lr=0.1, word_ngrams=3, min_count=3, epochs=3, seed=0, bucket=a.bucket
    ).save_model(str(model_path))
    n = len(docs)
    del base, docs

    bare = _bare_rate(model_path, shards)
    plain = dict(os.environ)
    os.environ.update(huge_pages_env())  # read by the spawned process at its start
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        bare_huge = pool.apply(_bare_rate, (model_path, shards))
    os.environ.clear()
    os.environ.update(plain)
    one = run_scorer(model_path, shards, work / "one", workers=1)
    cores = len(os.sched_getaffinity(0))
    full = run_scorer(model_path, shards, work / "all", workers=cores)
    dask = _on_dask(model_path, shards, work / "dask", a.dask, a.shards_per_task, a.noop_tasks) if a.dask else None
    same = dask is None or all((work / "dask" / o.name).read_text() == o.read_text() for o in full["outputs"])
    shutil.rmtree(work)  # the classifier alone is 2 GB
    rate = {
        "bare_predict": bare,
        "bare_huge_pages": bare_huge,
        "score_pool_1_worker": n / one["wall_s"],
        "score_pool": n / full["wall_s"],
    } | ({"dask": n / dask["score_s"], "dask_warm": n / dask["warm_score_s"]} if dask else {})
    print(
        json.dumps(
            {
                "pages": n,
                "repeat": repeat,
                "bucket": a.bucket,
                "cores": cores,
                **{f"{k}_pages_per_s": round(v) for k, v in rate.items()},
                **{f"{k}_vs_bare": round(v / bare, 3) for k, v in rate.items() if k != "bare_predict"},
                "score_pool_s": round(full["wall_s"], 2),
                "score_pool_load_s": round(full["load_s"], 2),
                "score_pool_startup_s": round(full["wall_s"] - full["score_s"], 2),
                **(
                    {
                        "dask_workers": a.dask,
                        "dask_shards_per_task": a.shards_per_task,
                        "dask_cluster_start_s": round(dask["start_s"], 2),
                        "dask_score_s": round(dask["score_s"], 2),
                        "dask_per_task_ms": round(dask["per_task_ms"], 1),
                        "dask_same_scores": same,
                    }
                    if dask
                    else {}
                ),
            }
        )
    )


if __name__ == "__main__":
    main()

"""Scoring throughput on ../shared/data/corpus/docs.jsonl.gz (46,663 pages in 8 JSONL shards), in
one run: bare fastText ``predict`` on the texts in memory (one process: the baseline), our
``score_shard`` in one process (read, normalise, score, write), and the ``corpus`` flow's mapped
shard tasks on a process pool of every core, end to end. The paper's classifier settings. Prints one
JSON object with docs/s and the ratios to the bare rate.

The flow's workers allocate the classifier on transparent huge pages (``prefer_huge_pages``). So
that the reader can tell that gain from the parallelism, bare ``predict`` is also timed in a process
started with the same setting (``bare_huge_pages_*``); the target ratio is against plain bare.

    .venv/bin/python bench/corpus_scoring.py [--repeat 8]

``--repeat`` copies the pages (new URLs) to make a bigger pool. Starting the flow's worker processes
(Prefect and our modules imported in each) and loading the 2 GB classifier in each is a fixed cost
of about 15 s that a real pool of millions of pages amortises and this one does not, so the flow is
reported twice: end to end (``flow_mapped_*``, startup included), and at steady state
(``flow_steady_*``: the pages of the shards that finished after every worker had finished its
first, over the time from then to the last; a shard's finish time is its output file's mtime).
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
    """Bare ``predict`` docs/s in this process (texts read before the clock starts)."""
    from grpo_core.corpus import classifier

    texts = [json.loads(line)["text"].replace("\n", " ") for s in shards for line in s.open(encoding="utf-8")]
    model = classifier.load(model_path)
    t0 = time.perf_counter()
    model.predict(texts, k=-1)
    return len(texts) / (time.perf_counter() - t0)


def _steady_rate(outputs_by_finish: list[Path], workers: int) -> float:
    """Pages per second once every worker is warm: the shards finished after the ``workers``-th
    finish, over the time from that finish to the last."""
    finish = [f.stat().st_mtime for f in outputs_by_finish]
    pages = sum(sum(1 for _ in f.open(encoding="utf-8")) for f in outputs_by_finish[workers:])
    return pages / (finish[-1] - finish[workers - 1])


def main() -> None:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=8)
    repeat = p.parse_args().repeat
    setup_environment()
    from prefect import flow
    from prefect.task_runners import ProcessPoolTaskRunner

    from tasks.corpus import score_mapped
    from grpo_core.corpus import classifier
    from grpo_core.corpus.score import score_shard

    work = Path(tempfile.mkdtemp(prefix="score-bench-"))
    base = [json.loads(line) for line in gzip.open(CORPUS, "rt", encoding="utf-8")]
    docs = [{**d, "url": f"{d['url']}?copy={r}"} for r in range(repeat) for d in base]
    (work / "pool").mkdir()
    shards = []
    for i in range(SHARDS):
        path = work / "pool" / f"{i}.jsonl"
        path.write_text("".join(json.dumps({"url": d["url"], "text": d["text"]}) + "\n" for d in docs[i::SHARDS]))
        shards.append(path)
    classifier.write_training_file(work / "train.txt", [d["text"] for d in base[::4] if d["label"] == "math"],
                                   [d["text"] for d in base[::4] if d["label"] != "math"], seed=0)
    model_path = work / "classifier.bin"
    classifier.train(work / "train.txt", dim=256, lr=0.1, word_ngrams=3, min_count=3, epochs=3, seed=0).save_model(str(model_path))
    n = len(docs)

    del base, docs
    bare = _bare_rate(model_path, shards)

    t0 = time.perf_counter()
    for i, shard in enumerate(shards):
        score_shard(model_path, shard, work / "single" / f"{i}.tsv")
    single = n / (time.perf_counter() - t0)

    from grpo_core.corpus.score import prefer_huge_pages

    prefer_huge_pages()  # what score_mapped does; from here on new processes use huge pages
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        bare_huge = pool.apply(_bare_rate, (model_path, shards))

    workers = os.cpu_count() or 1

    @flow(task_runner=ProcessPoolTaskRunner(max_workers=workers))
    def score_pool() -> int:
        return len(score_mapped(model_path, shards, work / "flow"))

    t0 = time.perf_counter()
    score_pool()
    flow_s = time.perf_counter() - t0
    mapped = n / flow_s
    steady = _steady_rate(sorted(work.glob("flow/*.tsv"), key=lambda f: f.stat().st_mtime), workers)
    shutil.rmtree(work)  # the classifier alone is 2 GB
    print(json.dumps({"docs": n, "repeat": repeat, "cores": workers, "bare_predict_docs_per_s": round(bare),
                      "bare_huge_pages_docs_per_s": round(bare_huge), "bare_huge_pages_vs_bare": round(bare_huge / bare, 3),
                      "score_shard_1_process_docs_per_s": round(single),
                      "flow_mapped_docs_per_s": round(mapped), "flow_s": round(flow_s, 1),
                      "flow_steady_docs_per_s": round(steady), "flow_startup_s": round(flow_s - n / steady, 1),
                      "single_vs_bare": round(single / bare, 3), "flow_vs_bare": round(mapped / bare, 3),
                      "flow_steady_vs_bare": round(steady / bare, 3)}))


if __name__ == "__main__":
    main()

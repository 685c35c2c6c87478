"""Scoring throughput on ../shared/data/corpus/docs.jsonl.gz (46,663 pages in 8 JSONL shards), in
one run: bare fastText ``predict`` on the texts in memory (one process: the baseline), our
``score_shard`` in one process (read, normalise, score, write), and the ``corpus`` flow's mapped
shard tasks on a process pool of every core, end to end. The paper's classifier settings. Prints one
JSON object with docs/s and the ratios to the bare rate.

    .venv/bin/python bench/corpus_scoring.py [--repeat 4]

``--repeat`` copies the pages (new URLs) to make a pool big enough that starting the worker
processes and loading the classifier in each are amortised as they are on a real pool.
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
import time
from pathlib import Path

from grpo_core.env import setup_environment

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus" / "docs.jsonl.gz"


def main() -> None:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=4)
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
    for i in range(8):
        path = work / "pool" / f"{i}.jsonl"
        path.write_text("".join(json.dumps({"url": d["url"], "text": d["text"]}) + "\n" for d in docs[i::8]))
        shards.append(path)
    classifier.write_training_file(work / "train.txt", [d["text"] for d in base[::4] if d["label"] == "math"],
                                   [d["text"] for d in base[::4] if d["label"] != "math"], seed=0)
    model_path = work / "classifier.bin"
    classifier.train(work / "train.txt", dim=256, lr=0.1, word_ngrams=3, min_count=3, epochs=3, seed=0).save_model(str(model_path))
    n = len(docs)

    model = classifier.load(model_path)
    texts = [d["text"].replace("\n", " ") for d in docs]  # fastText's predict refuses newlines
    t0 = time.perf_counter()
    model.predict(texts, k=-1)
    bare = n / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    for i, shard in enumerate(shards):
        score_shard(model_path, shard, work / "single" / f"{i}.tsv")
    single = n / (time.perf_counter() - t0)

    workers = os.cpu_count() or 1

    @flow(task_runner=ProcessPoolTaskRunner(max_workers=workers))
    def score_pool() -> int:
        return len(score_mapped(model_path, shards, work / "flow"))

    t0 = time.perf_counter()
    score_pool()
    mapped = n / (time.perf_counter() - t0)
    print(json.dumps({"docs": n, "repeat": repeat, "cores": workers, "bare_predict_docs_per_s": round(bare),
                      "score_shard_1_process_docs_per_s": round(single),
                      "flow_mapped_docs_per_s": round(mapped),
                      "flow_vs_bare": round(mapped / bare, 3), "single_vs_bare": round(single / bare, 3)}))


if __name__ == "__main__":
    main()

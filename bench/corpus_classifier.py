"""Classifier quality across sources on ../shared/data/corpus/docs.jsonl.gz: train on some sources,
test on sources the classifier never saw (math: GSM8K + MATH -> MathQA + a derivations textbook;
other: SQuAD-shifts + Debian fortunes -> Quoref Wikipedia + CosmosQA blogs + Wikipedia excerpts).
The paper's fastText settings. Prints one JSON object.

    .venv/bin/python bench/corpus_classifier.py
"""
from __future__ import annotations

import gzip
import json
import tempfile
import time
from pathlib import Path

from grpo_core.corpus import classifier

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus" / "docs.jsonl.gz"
TRAIN = ("GSM8K-train", "MATH-train", "SQuAD-shifts", "fortunes/")
TEST = ("MathQA", "derivations-book", "quoref", "CosmosQA", "Wikipedia-excerpts")


def main() -> None:
    docs = [json.loads(line) for line in gzip.open(CORPUS, "rt", encoding="utf-8")]
    train = [d for d in docs if d["source"].startswith(TRAIN)]
    test = [d for d in docs if d["source"].startswith(TEST)]
    work = Path(tempfile.mkdtemp(prefix="clf-bench-"))
    counts = classifier.write_training_file(work / "train.txt", [d["text"] for d in train if d["label"] == "math"],
                                            [d["text"] for d in train if d["label"] != "math"], seed=0)
    t0 = time.perf_counter()
    model = classifier.train(work / "train.txt", dim=256, lr=0.1, word_ngrams=3, min_count=3, epochs=3, seed=0)
    train_s = time.perf_counter() - t0
    scores = classifier.math_scores(model, [d["text"] for d in test])
    per_source = {}
    for src in TEST:
        idx = [i for i, d in enumerate(test) if d["source"].startswith(src)]
        hits = sum(scores[i] >= 0.5 for i in idx)
        per_source[src] = {"docs": len(idx), "label": test[idx[0]]["label"], "scored_math": hits}
    print(json.dumps({"train": counts, "train_s": round(train_s, 1), "test_docs": len(test),
                      **classifier.precision_recall_f1(scores, [d["label"] == "math" for d in test], 0.5),
                      "per_source": per_source}))


if __name__ == "__main__":
    main()

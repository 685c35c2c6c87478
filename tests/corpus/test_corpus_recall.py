"""The recall loop's bookkeeping, and the fastText classifier on real labelled pages."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from grpo_core.corpus.recall import (
    candidate_domains,
    domain_stats,
    path_prefix,
    prefix_stats,
    recalled_again,
    select,
    under,
)

URLS = [
    "https://Math.example/algebra/1",
    "https://math.example/algebra/2",
    "https://math.example/news/3",
    "https://blog.example/post/4",
    "https://blog.example/post/5",
    "https://blog.example/math/6",
    "https://blog.example/post/7",
    "https://blog.example/post/8",
    "https://blog.example/post/9",
    "https://blog.example/post/10",
    "https://blog.example/post/11",
    "https://blog.example/post/12",
]


def test_prefixes_and_whole_segment_matching():
    assert path_prefix(URLS[0], 1) == "math.example/algebra"
    assert path_prefix(URLS[0], 0) == "math.example"
    assert under("https://math.example/algebra/9", {"math.example/algebra"})
    assert not under("https://math.example/algebra2/9", {"math.example/algebra"})
    assert under("https://math.example/x", ["math.example"])


def test_select_threshold_and_top_n():
    scored = [("a", 0.9), ("b", 0.5), ("c", 0.7), ("d", 0.2), ("e", 0.7)]
    assert select(scored, 0.5, None) == {"a", "b", "c", "e"}
    assert select(scored, 0.5, 2) == {"a", "e"}  # 0.7 tie broken by URL, descending
    assert select(scored, 0.95, None) == set()


def test_domains_above_the_share_are_candidates_and_prefixes_count_uncollected_pages():
    collected = {URLS[0], URLS[1], URLS[5]}
    stats = domain_stats(URLS, collected)
    assert stats["math.example"] == {"pages": 3, "collected": 2, "share": 2 / 3}
    assert stats["blog.example"]["share"] == pytest.approx(1 / 9)
    # blog.example: 1 of 9 = 11.1% > 10%: a candidate, as the paper's rule says.
    assert candidate_domains(stats, 0.10) == ["blog.example", "math.example"]
    assert candidate_domains(stats, 0.5) == ["math.example"]
    prefixes = prefix_stats(URLS, collected, ["math.example"], depth=1)
    assert prefixes == {
        "math.example/algebra": {"pages": 2, "collected": 2, "uncollected": 0},
        "math.example/news": {"pages": 1, "collected": 0, "uncollected": 1},
    }


def test_recalled_again_is_the_stopping_statistic():
    assert recalled_again({"a", "b", "c"}, {"a", "b", "d", "e"}) == 0.5
    assert recalled_again(set(), set()) == 1.0


CORPUS = Path(__file__).resolve().parents[3] / "shared" / "data" / "corpus" / "docs.jsonl.gz"


@pytest.mark.skipif(not CORPUS.exists(), reason="../shared/data/corpus/docs.jsonl.gz is absent (development data)")
def test_fasttext_classifier_separates_real_math_pages(tmp_path):
    from grpo_core.corpus.classifier import math_scores, precision_recall_f1, train, write_training_file

    with gzip.open(CORPUS, "rt") as f:
        docs = [json.loads(line) for _, line in zip(range(6000), f)]
    random.Random(0).shuffle(docs)
    fit, held = docs[:5400], docs[5400:]
    counts = write_training_file(
        tmp_path / "train.txt",
        [d["text"] for d in fit if d["label"] == "math"],
        [d["text"] for d in fit if d["label"] != "math"],
        seed=0,
    )
    assert counts["positives"] > 1500 and counts["negatives"] > 3000
    # 5,400 pages: more epochs than the paper's 3 (for a million pages), or bare fastText stays near its prior.
    model = train(
        tmp_path / "train.txt", dim=256, lr=0.1, word_ngrams=3, min_count=3, epochs=10, seed=0, bucket=200_000
    )
    scores = math_scores(model, [d["text"] for d in held])
    metrics = precision_recall_f1(scores, [d["label"] == "math" for d in held], 0.5)
    assert metrics["f1"] > 0.9, metrics
    # Deterministic with one thread and a seed (a small model, to keep the test short).
    small = [
        train(tmp_path / "train.txt", dim=16, lr=0.1, word_ngrams=1, min_count=3, epochs=1, seed=0) for _ in range(2)
    ]
    assert math_scores(small[0], [d["text"] for d in held]) == math_scores(small[1], [d["text"] for d in held])


def test_training_needs_both_classes(tmp_path):
    from grpo_core.corpus.classifier import precision_recall_f1, write_training_file

    with pytest.raises(ValueError, match="needs math and other pages; got 2 math and 0 other"):
        write_training_file(tmp_path / "t.txt", ["a", "b"], [], seed=0)
    m = precision_recall_f1([0.9, 0.8, 0.1, 0.6], [True, False, True, False], 0.5)
    # tp 1, fp 2, fn 1 -> precision 1/3, recall 1/2, F1 0.4, accuracy 1/4
    assert m == pytest.approx({"precision": 1 / 3, "recall": 0.5, "f1": 0.4, "accuracy": 0.25})

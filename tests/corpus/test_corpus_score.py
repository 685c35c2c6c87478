"""``score_pool``: the pass over the pool in a scoring process of its own that loads the classifier
once and forks its workers. Scores equal the classifier's own, a pass stopped part way keeps the
shards it finished, another classifier starts over, and a bad page names its file and line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from grpo_core.corpus import classifier
from grpo_core.corpus.docs import CorpusError, read_shard
from grpo_core.corpus.score import score_pool
from grpo_core.corpus.stage import read_scores

MATH = [
    "solve x + 3 = 7 for x",
    "the derivative of x squared is 2 x",
    "prove that the sum of two even numbers is even",
    "compute the integral of sin x",
    "find the roots of x squared minus 4",
]
OTHER = [
    "the weather today is sunny and warm",
    "our team won the football match",
    "a recipe for tomato soup",
    "the museum opens at nine",
    "she bought a new bicycle in town",
]


def _classifier(path: Path, epochs: int = 20) -> Path:
    classifier.write_training_file(path.with_suffix(".txt"), MATH * 4, OTHER * 4, seed=0)
    classifier.train(
        path.with_suffix(".txt"), dim=8, lr=0.5, word_ngrams=1, min_count=1, epochs=epochs, seed=0, bucket=1000
    ).save_model(str(path))
    return path


def _pool(root: Path, shards: int = 5) -> list[Path]:
    root.mkdir()
    texts = MATH + OTHER
    out = []
    for j in range(shards):
        rows = [{"url": f"https://s{j}.example/{i}", "text": t} for i, t in enumerate(texts[j:] + texts[:j])]
        out.append(root / f"{j}.jsonl")
        out[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_scores_match_the_classifier_and_a_stopped_pass_resumes(tmp_path):
    model_path, pool = _classifier(tmp_path / "c.bin"), _pool(tmp_path / "pool")
    outputs = score_pool(model_path, pool, tmp_path / "scores", workers=2)
    assert outputs == [tmp_path / "scores" / f"{i:05d}.tsv" for i in range(5)]
    model = classifier.load(model_path)
    docs = [d for shard in pool for d in read_shard(shard)]
    expected = dict(zip([d.url for d in docs], classifier.math_scores(model, [d.text for d in docs])))
    got = read_scores(outputs)
    assert len(got) == len(expected) == 50
    assert all(abs(s - expected[u]) < 1e-5 for u, s in got)

    # A pass stopped after three shards: only the other two are scored again.
    outputs[3].unlink()
    outputs[4].unlink()
    kept = {o: o.stat().st_mtime_ns for o in outputs[:3]}
    assert score_pool(model_path, pool, tmp_path / "scores", workers=2) == outputs
    assert all(o.stat().st_mtime_ns == t for o, t in kept.items()) and outputs[4].exists()

    # Another classifier in the same place: every shard again.
    _classifier(model_path, epochs=5)
    os.utime(model_path, ns=(1, 1))
    score_pool(model_path, pool, tmp_path / "scores", workers=1)
    assert all(o.stat().st_mtime_ns != t for o, t in kept.items())


def test_a_bad_page_names_its_file_and_line_and_keeps_finished_shards(tmp_path):
    model_path, pool = _classifier(tmp_path / "c.bin"), _pool(tmp_path / "pool", shards=3)
    with open(pool[2], "a") as f:
        f.write('{"url": "https://x.example/1", "text": \n')
    with pytest.raises(CorpusError, match=rf"{pool[2]}:11: invalid JSON"):
        score_pool(model_path, pool, tmp_path / "scores", workers=2)
    assert [o.name for o in sorted((tmp_path / "scores").glob("*.tsv"))] == ["00000.tsv", "00001.tsv"]
    pool[2].write_text(pool[2].read_text().splitlines(keepends=True)[0])  # fixed: only that shard is scored
    assert len(read_scores(score_pool(model_path, pool, tmp_path / "scores", workers=2))) == 21

"""The math-page classifier: fastText supervised (``fasttext-community``), trained on seed
math pages against other pages with the paper's settings (dim 256, lr 0.1, word n-grams 3, min
count 3, 3 epochs) on normalised text. ``thread=1`` with a fixed seed makes training deterministic.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Iterable

from grpo_core.corpus.text import normalize

POSITIVE = "__label__math"
NEGATIVE = "__label__other"


def write_training_file(
    path: Path,
    positives: Iterable[str],
    negatives: Iterable[str],
    seed: int,
    normalizer: Callable[[str], str] = normalize,
) -> dict[str, int]:
    """fastText's input: one ``__label__<class> <normalised text>`` line per page, shuffled (SGD over
    all positives then all negatives would end on one class)."""
    lines = [f"{POSITIVE} {normalizer(t)}" for t in positives] + [f"{NEGATIVE} {normalizer(t)}" for t in negatives]
    n_pos = sum(1 for line in lines if line.startswith(POSITIVE))
    if n_pos == 0 or n_pos == len(lines):
        raise ValueError(
            f"classifier training needs math and other pages; got {n_pos} math and {len(lines) - n_pos} other"
        )
    random.Random(seed).shuffle(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"positives": n_pos, "negatives": len(lines) - n_pos}


def train(
    train_file: Path,
    *,
    dim: int,
    lr: float,
    word_ngrams: int,
    min_count: int,
    epochs: int,
    seed: int,
    threads: int = 1,
    bucket: int = 2_000_000,
    char_ngrams: tuple[int, int] = (0, 0),
):
    """``char_ngrams``: (min, max) length of the character n-grams fastText adds to each word; (0, 0),
    supervised fastText's default and the paper's, adds none."""
    import fasttext

    return fasttext.train_supervised(
        input=str(train_file),
        dim=dim,
        lr=lr,
        wordNgrams=word_ngrams,
        minCount=min_count,
        epoch=epochs,
        thread=threads,
        seed=seed,
        bucket=bucket,
        minn=char_ngrams[0],
        maxn=char_ngrams[1],
        verbose=0,
    )


def load(path: Path):
    import fasttext

    return fasttext.load_model(str(path))


def math_scores(model, texts: list[str], normalizer: Callable[[str], str] = normalize) -> list[float]:
    """P(math) of every text. Only the top label is asked for (5% faster than both): the classifier
    has two labels and softmax loss (``train``), so P(math) = 1 - P(other)."""
    if not texts:
        return []
    labels, probs = model.predict([normalizer(t) for t in texts], k=1)
    return [float(p[0]) if ls[0] == POSITIVE else 1.0 - float(p[0]) for ls, p in zip(labels, probs)]


def precision_recall_f1(scores: list[float], is_math: list[bool], threshold: float) -> dict[str, float]:
    """Of the pages scored >= ``threshold``: precision, recall, F1 and accuracy against the labels."""
    tp = sum(s >= threshold and y for s, y in zip(scores, is_math))
    fp = sum(s >= threshold and not y for s, y in zip(scores, is_math))
    fn = sum(s < threshold and y for s, y in zip(scores, is_math))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    accuracy = sum((s >= threshold) == y for s, y in zip(scores, is_math)) / max(1, len(scores))
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": accuracy}

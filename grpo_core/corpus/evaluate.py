"""Leave-one-source-out evaluation of the math classifier, beside bare fastText trained in the same run.

A page's source is its URL's host (the unit domain discovery groups by). Each source is held out in
turn, the classifier trained on the others with the recipe's settings, and the held-out pages
scored: the out-of-fold scores are what the classifier does on text of a kind it never saw, which a
held-out slice of the same sources (the seed's ``val_fraction``) does not show.

Reported per classifier (``project``: the recipe's classifier, its normalisation and settings;
``fasttext-baseline``: bare fastText, the paper's settings on the text with whitespace collapsed and
nothing else; when the two are the same classifier it is trained once and the baseline says so):

- per source: pages, share scored >= the threshold (recall of a math source, false-positive rate
  of another), median score;
- macro precision / recall / F1 / false-positive rate, every source weighing the same (a source's
  flagged share counts once, whatever its size): recall = mean recall of the math sources, FPR =
  mean FPR of the others, precision = sum of math recalls / (that + sum of other FPRs);
- calibration of P(math): expected calibration error over 10 equal-width bins of the pooled
  out-of-fold scores;
- ``threshold_for_precision``: the lowest cut-off whose macro precision reaches a stated target.
"""

from __future__ import annotations

import bisect
import multiprocessing
import os
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

from grpo_core.corpus import classifier
from grpo_core.corpus.docs import CorpusError, Doc
from grpo_core.corpus.recall import domain
from grpo_core.corpus.text import collapse_whitespace, normalize


MAX_WORKERS = 4
Normalizer = Callable[[str], str]
Classifiers = dict[str, tuple[Normalizer, dict]]  # name -> (normalisation, fastText settings)


def project_and_baseline(settings: dict, paper: dict) -> Classifiers:
    """The recipe's classifier (``settings``) and bare fastText with the paper's settings."""
    return {"project": (normalize, settings), "fasttext-baseline": (collapse_whitespace, paper)}


def _each(classifiers: Classifiers, evaluate: Callable[[Normalizer, dict], dict]) -> dict:
    """``evaluate`` every classifier once: one that is the same as an earlier one is not retrained."""
    report: dict[str, dict] = {}
    for name, (normalizer, settings) in classifiers.items():
        same = next((n for n, (f, s) in classifiers.items() if n in report and f is normalizer and s == settings), None)
        report[name] = {**report[same], "same_as": same} if same else evaluate(normalizer, settings)
    return report


def source_of(url: str) -> str:
    """The URL's host, as domain discovery groups pages (``recall.domain``); a URL without a scheme
    (``site.org/math/1``) is its first path segment."""
    return domain(url) or url.split("/", 1)[0].lower()


def _train_and_score(train_file: str, held_out: list[str], settings: dict, seed: int) -> list[float]:
    """One fold, in a worker process: the texts are already normalised."""
    model = classifier.train(Path(train_file), seed=seed, **settings)
    os.unlink(train_file)
    return classifier.math_scores(model, held_out, normalizer=str)


def out_of_fold_scores(
    docs: list[Doc],
    is_math: list[bool],
    normalizer: Callable[[str], str],
    settings: dict,
    seed: int,
    workers: int | None = None,
) -> tuple[list[float | None], list[str]]:
    """Every page's score from the classifier trained without its source (``None`` for pages of a
    source that cannot be held out: the only source of its class). Folds run in parallel, one
    fastText thread each (deterministic)."""
    texts = [normalizer(d.text) for d in docs]
    sources = [source_of(d.url) for d in docs]
    scores: list[float | None] = [None] * len(docs)
    skipped, jobs = [], {}
    # At most 4 folds at a time: each holds its own classifier (2 GB with the paper's 2M buckets x 256).
    workers = workers or min(os.cpu_count() or 1, MAX_WORKERS)
    with (
        tempfile.TemporaryDirectory() as tmp,
        ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool,
    ):
        for src in sorted(set(sources)):
            train = [i for i, s in enumerate(sources) if s != src]
            if len({is_math[i] for i in train}) < 2:
                skipped.append(src)
                continue
            path = Path(tmp) / f"{len(jobs)}.txt"
            classifier.write_training_file(
                path,
                [texts[i] for i in train if is_math[i]],
                [texts[i] for i in train if not is_math[i]],
                seed,
                normalizer=str,
            )
            held = [i for i, s in enumerate(sources) if s == src]
            jobs[pool.submit(_train_and_score, str(path), [texts[i] for i in held], settings, seed)] = held
        for job, held in jobs.items():
            for i, score in zip(held, job.result()):
                scores[i] = score
    return scores, skipped


def per_source(scores: list[float], is_math: list[bool], sources: list[str], threshold: float) -> dict[str, dict]:
    out = {}
    for src in sorted(set(sources)):
        s = [x for x, y in zip(scores, sources) if y == src]
        label = "math" if is_math[sources.index(src)] else "other"
        out[src] = {
            "label": label,
            "pages": len(s),
            "flagged": round(sum(x >= threshold for x in s) / len(s), 4),
            "median_score": round(statistics.median(s), 4),
        }
    return out


def macro(rows: dict[str, dict]) -> dict[str, float]:
    """Macro precision / recall / F1 / FPR from the per-source flagged shares (module docstring)."""
    recalls = [r["flagged"] for r in rows.values() if r["label"] == "math"]
    fprs = [r["flagged"] for r in rows.values() if r["label"] == "other"]
    recall = sum(recalls) / len(recalls) if recalls else 0.0
    fpr = sum(fprs) / len(fprs) if fprs else 0.0
    precision = sum(recalls) / (sum(recalls) + sum(fprs)) if sum(recalls) + sum(fprs) else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4), "fpr": round(fpr, 4)}


def expected_calibration_error(scores: list[float], is_math: list[bool], bins: int = 10) -> float:
    """Mean |P(math) - share of math| over equal-width score bins, weighted by the bins' pages."""
    total = 0.0
    for b in range(bins):
        idx = [i for i, s in enumerate(scores) if b / bins <= s < (b + 1) / bins or (b == bins - 1 and s == 1.0)]
        if idx:
            total += abs(sum(scores[i] for i in idx) / len(idx) - sum(is_math[i] for i in idx) / len(idx)) * len(idx)
    return round(total / max(1, len(scores)), 4)


def threshold_for_precision(
    scores: list[float], is_math: list[bool], sources: list[str], target: float
) -> float | None:
    """The lowest cut-off (among the scores) whose macro precision is >= ``target``: the most recall
    at that precision. ``None`` when no cut-off reaches it."""
    by_source: dict[str, list[float]] = {}
    label: dict[str, bool] = {}
    for s, y, src in zip(scores, is_math, sources):
        by_source.setdefault(src, []).append(s)
        label[src] = y
    for v in by_source.values():
        v.sort()
    for t in sorted(set(scores)):
        shares = {src: 1 - bisect.bisect_left(v, t) / len(v) for src, v in by_source.items()}
        tp = sum(x for src, x in shares.items() if label[src])
        fp = sum(x for src, x in shares.items() if not label[src])
        if tp + fp and tp / (tp + fp) >= target - 1e-9:  # a float hair below an exact hit is a hit
            return t
    return None


def leave_one_source_out(
    docs: list[Doc],
    positive_label: str,
    classifiers: Classifiers,
    seed: int,
    threshold: float,
    target_precision: float | None = None,
    workers: int | None = None,
) -> dict:
    """The report of the module docstring, one entry per classifier."""
    is_math = [d.label == positive_label for d in docs]
    if len({source_of(d.url) for d in docs}) < 2:
        raise CorpusError("leave-one-source-out needs pages from at least two sources (URL hosts)")

    def evaluate(normalizer: Normalizer, settings: dict) -> dict:
        scores, skipped = out_of_fold_scores(docs, is_math, normalizer, settings, seed, workers)
        kept = [i for i, s in enumerate(scores) if s is not None]
        s, y, src = [scores[i] for i in kept], [is_math[i] for i in kept], [source_of(docs[i].url) for i in kept]
        rows = per_source(s, y, src, threshold)
        entry = {
            "settings": settings,
            "threshold": threshold,
            "macro": macro(rows),
            "ece": expected_calibration_error(s, y),
            "sources": rows,
            "not_held_out": skipped,
        }
        if target_precision is not None:
            cut = threshold_for_precision(s, y, src, target_precision)
            entry |= {
                "target_precision": target_precision,
                "threshold_for_target": cut,
                "macro_at_target": macro(per_source(s, y, src, cut)) if cut is not None else None,
            }
        return entry

    return _each(classifiers, evaluate)


def on_test_set(
    train_docs: list[Doc],
    test_docs: list[Doc],
    positive_label: str,
    classifiers: Classifiers,
    seed: int,
    threshold: float,
) -> dict:
    """Each classifier trained on every training page, scored on another labelled set, per source."""
    y_train = [d.label == positive_label for d in train_docs]
    y_test = [d.label == positive_label for d in test_docs]
    sources = [source_of(d.url) for d in test_docs]

    def evaluate(normalizer: Normalizer, settings: dict) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "train.txt"
            classifier.write_training_file(
                path,
                [d.text for d, y in zip(train_docs, y_train) if y],
                [d.text for d, y in zip(train_docs, y_train) if not y],
                seed,
                normalizer=normalizer,
            )
            model = classifier.train(path, seed=seed, **settings)
        scores = classifier.math_scores(model, [d.text for d in test_docs], normalizer=normalizer)
        rows = per_source(scores, y_test, sources, threshold)
        return {
            "settings": settings,
            "threshold": threshold,
            "macro": macro(rows),
            "ece": expected_calibration_error(scores, y_test),
            "pooled": {k: round(v, 4) for k, v in classifier.precision_recall_f1(scores, y_test, threshold).items()},
            "sources": rows,
        }

    return _each(classifiers, evaluate)


def sources_per_class(docs: list[Doc], positive_label: str) -> dict[str, int]:
    return {
        c: len({source_of(d.url) for d in docs if (d.label == positive_label) == (c == "math")})
        for c in ("math", "other")
    }


def seed_report(
    docs: list[Doc],
    positive_label: str,
    classifiers: Classifiers,
    seed: int,
    threshold: float,
    target_precision: float | None,
) -> dict:
    """The corpus stage's check before its loop: leave-one-source-out over the seed when it has two
    sources of each class (else ``None`` with the reason)."""
    counts = sources_per_class(docs, positive_label)
    if min(counts.values()) < 2:
        return {
            "leave_one_source_out": None,
            "reason": f"the seed has {counts['math']} math and {counts['other']} other source(s) (URL hosts); "
            "leave-one-source-out needs two of each",
        }
    return {
        "leave_one_source_out": leave_one_source_out(
            docs, positive_label, classifiers, seed, threshold, target_precision
        )
    }

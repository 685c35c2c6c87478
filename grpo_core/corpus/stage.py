"""Corpus stage: the fastText recall loop with domain discovery and URL annotation, then 10-gram
decontamination (DeepSeekMath §2.1).

iteration k: train the classifier on the seed (+ pages added by annotation) -> measure it on the
held-out seed -> score every pool shard (``score_shards``: ``score.score_pool``, one process that loads
the classifier once and forks a worker per core; a Prefect task of it in the flow) -> keep pages above
the threshold -> domain shares -> candidate domains -> approved URL prefixes (``approve``: an
annotations file, or a person in the Prefect UI) -> uncollected pages under them join the seed -> stop
after ``iterations`` or when most pages were recalled before.
Finally the collected pages minus benchmark matches are written to ``corpus/``; the removed ones go
to ``decontaminated.jsonl.gz`` for audit. Memory holds URLs and scores, never the pool's text.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import yaml

from grpo_core.config import CorpusConfig, PipelineConfig
from grpo_core.corpus import classifier, evaluate
from grpo_core.corpus.demo_pool import build_demo_pool
from grpo_core.corpus.decontam import BenchmarkIndex, benchmark_index, process_index
from grpo_core.corpus.docs import CorpusError, Doc, read_docs, shards, write_jsonl
from grpo_core.corpus.score import MapTasks, run_here, score_pool, scored
from grpo_core.recipe import load_config
from grpo_core.corpus.recall import candidate_domains, domain_stats, prefix_stats, recalled_again, select, under
from grpo_core.env import setup_environment
from grpo_core.manifests import write_manifest
from grpo_core.tracking import MetricLogger, NullLogger
from grpo_core.training.trainer import Stopwatch

ScoreShards = Callable[[Path, list[Path], Path], list[Path]]
Approve = Callable[[int, dict[str, dict[str, int]]], list[str]]


def run_corpus(
    cfg: PipelineConfig,
    out_dir: Path,
    logger: MetricLogger | None = None,
    score_shards: ScoreShards | None = None,
    approve: Approve | None = None,
    iteration_logger: Callable[[int], MetricLogger] | None = None,
    own_benchmarks: dict[str, Path] | None = None,
    map_tasks: MapTasks = run_here,
) -> dict:
    """The loop and decontamination (see the module docstring). ``own_benchmarks``: the project's
    own evaluation splits (name -> GSM8K-form file), removed like the configured benchmarks.
    ``map_tasks`` runs the decontamination's tasks (a group of ``corpus.shards_per_task`` shards
    each): here one after another, or on a cluster (the corpus flow's Dask or Ray task runner);
    ``score_shards`` scores a pass (default: ``score_pool`` on this machine)."""
    cc = cfg.corpus
    logger = logger or NullLogger()
    score_shards = score_shards or (lambda model, pool, out: score_pool(model, pool, out, cc.workers))
    src = inputs(cc, out_dir, cfg.seed)
    approve = approve or from_annotations_file(src["annotations"])
    clock = Stopwatch()
    pool = shards(src["pool"])
    seed_pages = seed_docs(cc, src["seed"])
    check = seed_check(cc, src["seed"], cfg.seed, logger)
    recall = Recall(*starting_threshold(cc, check))
    for k in range(1, cc.iterations + 1):
        log = iteration_logger(k) if iteration_logger else NullLogger()
        recall_iteration(
            k, recall, cfg, out_dir / f"iteration-{k}", pool, seed_pages, check, score_shards, approve, log
        )
        if recall.converged:
            break
    n_kept, removed = decontaminate(cc, out_dir, pool, recall, own_benchmarks, map_tasks)
    per_benchmark = removed_per_benchmark(removed)
    logger.log_metrics(
        {
            "corpus/pages": n_kept,
            "decontam/removed": len(removed),
            **{f"decontam/{b}": n for b, n in per_benchmark.items()},
        }
    )
    return write_manifest(
        out_dir,
        {
            "stage": "corpus",
            "corpus_dir": str(out_dir / "corpus"),
            "pages": n_kept,
            "removed": per_benchmark,
            "iterations": recall.history,
            "seed_check": check,
            "stopped": "recalled_again >= stop_recalled" if recall.converged else "iterations reached",
            "wall_s": round(clock.elapsed, 1),
        },
    )


@dataclass
class Recall:
    """The recall loop's state: the classifier's cut-off and what chose it, the pages that joined the
    seed through annotation (url -> text), the last iteration's collected URLs and its scores per pool
    shard, every iteration's summary, and whether the loop stopped on ``corpus.stop_recalled``."""

    threshold: float
    chosen_on: str
    added: dict[str, str] = field(default_factory=dict)
    collected: set[str] = field(default_factory=set)
    per_shard: list[list[tuple[str, float]]] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    converged: bool = False


def starting_threshold(cc: CorpusConfig, check: dict) -> tuple[float, str]:
    """The classifier's cut-off and what chose it: with a target precision, the one that
    leave-one-source-out over the seed found; else ``corpus.threshold``."""
    if not (cc.target_precision and check.get("leave_one_source_out")):
        return cc.threshold, "corpus.threshold"
    cut = check["leave_one_source_out"]["project"]["threshold_for_target"]
    if cut is None:
        return cc.threshold, "corpus.threshold (leave-one-source-out never reached the target)"
    return cut, "leave-one-source-out over the seed"


def recall_iteration(
    k: int,
    recall: Recall,
    cfg: PipelineConfig,
    it_dir: Path,
    pool: list[Path],
    seed_pages: tuple[list[str], list[str], list[Doc]],
    check: dict,
    score_shards: ScoreShards,
    approve: Approve,
    log: MetricLogger,
) -> None:
    """Iteration ``k`` into ``recall`` and ``it_dir``: the classifier, the pool scored and the pages
    above the cut-off collected, the candidate domains and their approved URL prefixes, whose
    uncollected pages join the seed; its summary to ``it_dir``'s manifest and to ``log``."""
    cc = cfg.corpus
    counts, quality = iteration_classifier(k, recall, cfg, it_dir, seed_pages, check)
    recall.per_shard = [read_scores([f]) for f in score_shards(it_dir / "classifier.bin", pool, it_dir / "scores")]
    scored = [s for shard in recall.per_shard for s in shard]
    collected = select(scored, recall.threshold, cc.top_n)
    urls = [u for u, _ in scored]
    stats = domain_stats(urls, collected)
    domains = candidate_domains(stats, cc.domain_share)
    prefixes = prefix_stats(urls, collected, domains, cc.path_depth)
    approved = approve(k, prefixes)
    joined = {
        d.url: d.text
        for d in (read_docs([str(p) for p in pool]) if approved else ())
        if d.url not in collected and d.url not in recall.added and under(d.url, approved)
    }
    recall.added.update(joined)
    again = recalled_again(recall.collected, collected) if k > 1 else 0.0
    summary = {
        "iteration": k,
        "seed_positives": counts["positives"],
        "seed_negatives": counts["negatives"],
        "pool_pages": len(urls),
        "collected": len(collected),
        "candidate_domains": domains,
        "approved_prefixes": approved,
        "approved_by": getattr(approve, "source", "a callback"),
        "joined_seed": len(joined),
        "recalled_again": again,
        "classifier": quality,
        "threshold": recall.threshold,
        "threshold_chosen_on": recall.chosen_on,
    }
    (it_dir / "domains.json").write_text(json.dumps({"domains": stats, "prefixes": prefixes}, indent=1))
    write_manifest(it_dir, summary)
    log_iteration(log, cc, summary, stats)
    recall.history.append(summary)
    recall.collected = collected
    recall.converged = k > 1 and again >= cc.stop_recalled


def iteration_classifier(
    k: int, recall: Recall, cfg: PipelineConfig, it_dir: Path, seed_pages: tuple, check: dict
) -> tuple[dict, dict]:
    """Iteration ``k``'s classifier, trained on the seed and the pages annotation added, saved to
    ``it_dir``: its training counts and its quality on the held-out seed pages at the cut-off. In
    the first iteration a target precision without leave-one-source-out (one source of a class)
    chooses the cut-off on those pages, class-balanced."""
    cc, (pos, neg, val) = cfg.corpus, seed_pages
    counts = classifier.write_training_file(it_dir / "train.txt", pos + list(recall.added.values()), neg, cfg.seed)
    model = classifier.train(it_dir / "train.txt", seed=cfg.seed, **classifier_settings(cc))
    model.save_model(str(it_dir / "classifier.bin"))
    val_scores, val_math = (
        classifier.math_scores(model, [d.text for d in val]),
        [d.label == cc.positive_label for d in val],
    )
    if k == 1 and cc.target_precision and not check.get("leave_one_source_out"):
        cut = evaluate.threshold_for_precision(
            val_scores, val_math, ["math" if y else "other" for y in val_math], cc.target_precision
        )
        if cut is not None:
            recall.threshold, recall.chosen_on = cut, "held-out seed pages (the seed's own sources)"
    return counts, classifier.precision_recall_f1(val_scores, val_math, recall.threshold)


def log_iteration(log: MetricLogger, cc: CorpusConfig, summary: dict, stats: dict[str, dict[str, float]]) -> None:
    """An iteration's settings, measures and domain shares on its own tracking run."""
    log.log_params(
        {
            "threshold": summary["threshold"],
            "threshold_chosen_on": summary["threshold_chosen_on"],
            "top_n": cc.top_n,
            "domain_share": cc.domain_share,
            "approved_prefixes": ",".join(summary["approved_prefixes"]) or "none",
            "approved_by": summary["approved_by"],
        }
    )
    log.log_metrics(
        {
            **{f"classifier/{m}": v for m, v in summary["classifier"].items()},
            "pool/pages": summary["pool_pages"],
            "pool/collected": summary["collected"],
            "domains/candidates": len(summary["candidate_domains"]),
            "seed/joined": summary["joined_seed"],
            "recall/recalled_again": summary["recalled_again"],
        }
    )
    log.log_table([{"domain": d, **s} for d, s in stats.items()], "domains.json")


def decontaminate(
    cc: CorpusConfig,
    out_dir: Path,
    pool: list[Path],
    recall: Recall,
    own_benchmarks: dict[str, Path] | None,
    map_tasks: MapTasks,
) -> tuple[int, list[dict]]:
    """A task per group of shards: the group's collected pages minus benchmark matches to
    ``corpus/part-<group>.jsonl.gz`` (the same parts on any runner); the removed pages to
    ``decontaminated.jsonl.gz``. Returns the pages kept and the pages removed."""
    extra = {name: str(path) for name, path in (own_benchmarks or {}).items()}
    process_index(cc.benchmarks, cc.ngram, extra)  # a missing or malformed benchmark file stops the stage here
    per = cc.shards_per_task
    calls = [
        (
            [str(p) for p in pool[i : i + per]],
            [u for shard in recall.per_shard[i : i + per] for u, _ in shard if u in recall.collected],
            cc.benchmarks,
            cc.ngram,
            extra,
            str(out_dir / "corpus" / f"part-{i // per:05d}.jsonl.gz"),
        )
        for i in range(0, len(pool), per)
    ]
    shutil.rmtree(out_dir / "corpus", ignore_errors=True)  # parts of an earlier grouping
    done = map_tasks(decontaminate_shards, calls)
    n_kept, removed = sum(n for n, _ in done), [page for _, pages in done for page in pages]
    write_jsonl(out_dir / "decontaminated.jsonl.gz", removed)
    return n_kept, removed


def held_out(url: str, fraction: float) -> bool:
    """A seed page is held out to measure the classifier by a hash of its URL (stable across runs)."""
    return int(hashlib.sha256(url.encode()).hexdigest()[:8], 16) / 16**8 < fraction


def read_scores(files: list[Path]) -> list[tuple[str, float]]:
    out = []
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            url, score = line.rsplit("\t", 1)
            out.append((url, float(score)))
    return out


def read_approvals(path: str | Path) -> list[str]:
    """Approved URL prefixes from YAML (``approved: [site.org/math, ...]``) or CSV (``prefix`` and an
    optional ``approved`` column of yes/no)."""
    p = Path(path)
    if not p.exists():
        raise CorpusError(f"{p}: annotations file not found (corpus.annotations)")
    if p.suffix == ".csv":
        with open(p, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        if rows and "prefix" not in rows[0]:
            raise CorpusError(f"{p}: CSV needs a 'prefix' column")
        return [
            r["prefix"].strip()
            for r in rows
            if r["prefix"].strip() and str(r.get("approved", "yes")).strip().lower() in ("yes", "y", "true", "1")
        ]
    data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    approved = data.get("approved") if isinstance(data, dict) else None
    if not isinstance(approved, list) or not all(isinstance(x, str) for x in approved):
        raise CorpusError(f"{p}: expected a YAML mapping with 'approved:' a list of URL prefixes")
    return approved


def from_annotations_file(path: str | Path | None) -> Approve:
    """Non-interactive approval: the prefixes of the annotations file that are among the candidates."""

    def approve(iteration: int, candidates: dict[str, dict[str, int]]) -> list[str]:
        if path is None:
            return []
        return [p for p in read_approvals(path) if p in candidates]

    approve.source = f"annotations file {path}" if path else "nobody (no annotations file)"
    return approve


def inputs(cc: CorpusConfig, out_dir: Path, seed: int) -> dict:
    """Pool, seed and annotations: the recipe's files, or the demo's, built under ``out_dir/sources``."""
    if cc.source == "demo":
        built = build_demo_pool(out_dir / "sources", seed)
        return {"pool": [built["pool"]], "seed": [built["seed"]], "annotations": built["annotations"]}
    if not cc.pool or not cc.seed:
        raise CorpusError("corpus.pool and corpus.seed must name document files (or corpus.source: demo)")
    return {"pool": list(cc.pool), "seed": list(cc.seed), "annotations": cc.annotations}


def seed_docs(cc: CorpusConfig, seed_spec: list[str]) -> tuple[list[str], list[str], list[Doc]]:
    """Training positives and negatives (texts) and the held-out seed pages."""
    pos, neg, val = [], [], []
    for doc in read_docs(seed_spec, label_field=cc.label_field):
        if held_out(doc.url, cc.val_fraction):
            val.append(doc)
        else:
            (pos if doc.label == cc.positive_label else neg).append(doc.text)
    return pos, neg, val


def train_classifier(data: str | list[str], out_dir: Path, seed: int = 0, **settings) -> dict:
    """Train the classifier on labelled pages (``settings``: ``CorpusConfig`` fields, the paper's
    unless given), measure it on the pages held out by URL hash, save ``classifier.bin`` and
    ``metrics.json`` in ``out_dir``."""
    cc = CorpusConfig(**settings)
    pos, neg, val = seed_docs(cc, [data] if isinstance(data, str) else data)
    counts = classifier.write_training_file(out_dir / "train.txt", pos, neg, seed)
    model = classifier.train(out_dir / "train.txt", seed=seed, **classifier_settings(cc))
    model.save_model(str(out_dir / "classifier.bin"))
    (out_dir / "train.txt").unlink()
    metrics = {
        **counts,
        "heldout": len(val),
        **classifier.precision_recall_f1(
            classifier.math_scores(model, [d.text for d in val]),
            [d.label == cc.positive_label for d in val],
            cc.threshold,
        ),
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return {"model": str(out_dir / "classifier.bin"), **metrics}


def classifier_settings(cc: CorpusConfig) -> dict:
    return {
        "dim": cc.dim,
        "lr": cc.lr,
        "word_ngrams": cc.word_ngrams,
        "min_count": cc.min_count,
        "epochs": cc.epochs,
        "bucket": cc.bucket,
    }


def recipe_and_baseline(cc: CorpusConfig) -> dict:
    """The recipe's classifier, and bare fastText with the paper's settings (the config's defaults)
    and the recipe's hash-table size."""
    return evaluate.project_and_baseline(classifier_settings(cc), classifier_settings(CorpusConfig(bucket=cc.bucket)))


def evaluate_classifier(
    data: str | list[str], test: str | list[str] | None = None, seed: int = 0, out: Path | None = None, **settings
) -> dict:
    """Leave-one-source-out over ``data``'s sources for the project's classifier and bare fastText
    (``grpo_core.corpus.evaluate``); with ``test``, both also trained on all of ``data`` and scored on
    it per source. ``settings``: ``CorpusConfig`` fields. Written to ``out`` (JSON) when given."""
    cc = CorpusConfig(**settings)
    docs = list(read_docs(data, label_field=cc.label_field))
    classifiers = recipe_and_baseline(cc)
    report = {
        "data": data,
        "pages": len(docs),
        "leave_one_source_out": evaluate.leave_one_source_out(
            docs, cc.positive_label, classifiers, seed, cc.threshold, cc.target_precision
        ),
    }
    if test:
        report["test"] = evaluate.on_test_set(
            docs, list(read_docs(test, label_field=cc.label_field)), cc.positive_label, classifiers, seed, cc.threshold
        )
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
    return report


def score_to_file(model: Path, data: str | list[str], out: Path) -> dict:
    """Every page of ``data`` with ``score`` = P(math) added, written to ``out`` (JSONL or JSONL.gz)."""
    path = model / "classifier.bin" if model.is_dir() else model
    if not path.exists():
        raise CorpusError(f"{path}: no classifier here (grpo-pipeline corpus train --out DIR writes one)")
    rows = (
        {"url": d.url, "text": d.text, "score": round(s, 6)} for d, s in scored(classifier.load(path), read_docs(data))
    )
    n = write_jsonl(out, rows)
    return {"scored": n, "out": str(out)}


def without_benchmarks(docs: Iterable[Doc], index: BenchmarkIndex, removed: list[dict]) -> Iterator[dict]:
    """The pages that match no benchmark, streamed; the others go to ``removed`` with the benchmark
    that matched (for the audit file)."""
    for doc in docs:
        hit = index.match(doc.text)
        if hit:
            removed.append({"url": doc.url, "text": doc.text, "benchmark": hit})
        else:
            yield {"url": doc.url, "text": doc.text}


def decontaminate_shards(
    shards: list[str], keep: list[str], benchmarks: tuple[str, ...], ngram: int, extra: dict[str, str], out: str
) -> tuple[int, list[dict]]:
    """One decontamination task: the pages of ``shards`` whose URL is in ``keep`` (the collected ones)
    and that match no benchmark, to ``out``; returns their count and the removed pages with the
    benchmark each matched. The benchmark index is built once per process (a cluster worker keeps it
    for its later tasks): it holds ``hash()``es of n-grams, which differ between Python processes, so
    it is built where it is used rather than sent."""
    index, wanted, removed = process_index(benchmarks, ngram, extra), set(keep), []
    n = write_jsonl(Path(out), without_benchmarks((d for d in read_docs(shards) if d.url in wanted), index, removed))
    return n, removed


def removed_per_benchmark(removed: list[dict]) -> dict[str, int]:
    return dict(sorted(Counter(r["benchmark"] for r in removed).items()))


def decontaminate_file(data: str | list[str], benchmarks: list[str], out: Path, ngram: int = 10) -> dict:
    """Pages of ``data`` without benchmark matches to ``out``; the removed ones, with the benchmark
    that matched, to ``<out>.removed.jsonl.gz``. Returns counts per benchmark."""
    index = benchmark_index(CorpusConfig(benchmarks=tuple(benchmarks), ngram=ngram))
    removed: list[dict] = []
    n = write_jsonl(out, without_benchmarks(read_docs(data), index, removed))
    base = out.name.removesuffix(".gz").removesuffix(".jsonl")
    write_jsonl(out.with_name(base + ".removed.jsonl.gz"), removed)
    return {"kept": n, "removed": removed_per_benchmark(removed), "out": str(out)}


def seed_check(cc: CorpusConfig, seed_spec: list[str], seed: int, logger: MetricLogger) -> dict:
    """Before the loop (``corpus.evaluate`` or ``corpus.target_precision``): leave-one-source-out over
    the seed, the project's classifier beside bare fastText, logged as ``loso/<classifier>/<metric>``;
    with a target precision, the cut-off that reaches it (``threshold_for_target`` of ``project``)."""
    if not (cc.evaluate or cc.target_precision):
        return {}
    report = evaluate.seed_report(
        list(read_docs(seed_spec, label_field=cc.label_field)),
        cc.positive_label,
        recipe_and_baseline(cc),
        seed,
        cc.threshold,
        cc.target_precision,
    )
    loso = report["leave_one_source_out"] or {}
    logger.log_metrics(
        {f"loso/{name}/{m}": v for name, r in loso.items() for m, v in {**r["macro"], "ece": r["ece"]}.items()}
    )
    return report


def main(argv: list[str] | None = None) -> None:
    setup_environment()
    p = argparse.ArgumentParser(description="corpus stage: fastText recall loop and decontamination")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--set", action="append", default=[], dest="overrides")
    a = p.parse_args(argv)
    print(json.dumps(run_corpus(load_config(a.config, a.overrides), Path(a.out)), indent=1))


if __name__ == "__main__":
    main()

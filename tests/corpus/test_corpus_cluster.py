"""The corpus passes on a real Dask cluster through Prefect (``corpus.runner: dask``): a
``distributed.LocalCluster`` of 2 worker processes on 127.0.0.1, started by Prefect's
``DaskTaskRunner``. The same pool gives the same scores, kept pages and removed pages as the local
runner; each worker loads the classifier once a pass; a bad page is named by file and line and the
shards finished before it are kept. Ray: skipped where prefect-ray is not installed (it is not in the
pinned set: docs/scaling.md says why)."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from grpo_core.corpus import score
from grpo_core.corpus.docs import CorpusError

from tests.corpus.test_corpus_score import MATH, OTHER, _classifier

needs_dask = pytest.mark.skipif(
    importlib.util.find_spec("prefect_dask") is None,
    reason="prefect-dask is not installed (pip install -r requirements.txt)",
)


def _pool(root: Path, shards: int = 6) -> Path:
    """``shards`` files of math and other pages; shard 4 holds a copy of a benchmark question."""
    root.mkdir()
    for j in range(shards):
        rows = [
            {"url": f"https://s{j}.example/{k}/{i}", "text": t}
            for k, texts in (("math", MATH), ("other", OTHER))
            for i, t in enumerate(texts[j % 5 :] + texts[: j % 5])
        ]
        if j == 4:
            rows.append(
                {
                    "url": "https://copy.example/bench",
                    "text": "compute the integral of sin x from zero to pi "
                    "and then divide the result by two to get the answer",
                }
            )
        (root / f"{j}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _seed(path: Path) -> str:
    rows = [{"url": f"https://seed.example/math/{i}", "text": t, "label": "math"} for i, t in enumerate(MATH * 3)] + [
        {"url": f"https://seed.example/other/{i}", "text": t, "label": "other"} for i, t in enumerate(OTHER * 3)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _corpus_cfg(tmp_path, tiny_cfg, runner: str, *extra: str):
    bench = tmp_path / "bench.jsonl"
    bench.write_text(
        json.dumps(
            {
                "question": "compute the integral of sin x from zero to pi and then divide the result by two",
                "answer": "#### 1",
            }
        )
        + "\n"
    )
    (tmp_path / "annotations.yaml").write_text("approved: []\n")
    return tiny_cfg(
        tmp_path,
        f"corpus.pool=[{tmp_path / 'pool'}]",
        f"corpus.seed=[{_seed(tmp_path / 'seed.jsonl')}]",
        f"corpus.annotations={tmp_path / 'annotations.yaml'}",
        f"corpus.benchmarks=[{bench}]",
        f"corpus.runner={runner}",
        "corpus.shards_per_task=2",
        "corpus.iterations=1",
        "corpus.evaluate=false",
        *extra,
        run_name=f"corpus-{runner}",
        corpus__dim=8,
        corpus__epochs=20,
        corpus__min_count=1,
        corpus__word_ngrams=1,
        corpus__bucket=1000,
        corpus__val_fraction=0.2,
    )


def _outputs(run_dir: Path) -> dict[str, object]:
    def lines(path: Path) -> list[str]:
        with gzip.open(path, "rt") as f:
            return f.read().splitlines()

    return {
        "parts": {p.name: lines(p) for p in sorted((run_dir / "corpus").glob("*.jsonl.gz"))},
        "removed": lines(run_dir / "decontaminated.jsonl.gz"),
        "scores": {p.name: p.read_text() for p in sorted((run_dir / "iteration-1" / "scores").glob("*.tsv"))},
    }


def test_one_process_loads_the_classifier_once_a_pass(tmp_path, monkeypatch):
    loads = []
    real = score.classifier.load
    monkeypatch.setattr(score.classifier, "load", lambda path: loads.append(path) or real(path))
    monkeypatch.setattr(score, "_LOADED", {})
    model = _classifier(tmp_path / "c.bin")
    pool = _pool(tmp_path / "pool")
    shards = sorted(pool.glob("*.jsonl"))
    assert score.score_jobs(str(model), [(str(shards[0]), str(tmp_path / "0.tsv"))]) == 10
    assert score.score_jobs(str(model), [(str(shards[1]), str(tmp_path / "1.tsv"))]) == 10
    assert score.score_jobs(str(model), [(str(shards[1]), str(tmp_path / "1.tsv"))]) == 0  # done already: skipped
    assert len(loads) == 1
    _classifier(model, epochs=5)  # the next iteration's classifier in the same place: loaded again
    score.score_jobs(str(model), [(str(shards[2]), str(tmp_path / "2.tsv"))])
    assert len(loads) == 2


@pytest.mark.slow  # ~20 s; the fast suite keeps the Dask pass of the test below
@needs_dask
def test_dask_runner_gives_the_local_runners_corpus(prefect_harness, tmp_path, tiny_cfg):
    from flows.corpus import corpus

    _pool(tmp_path / "pool")
    local = corpus(_corpus_cfg(tmp_path, tiny_cfg, "local"))
    on_dask = corpus(_corpus_cfg(tmp_path, tiny_cfg, "dask", "corpus.workers=2"))
    assert local["pages"] == on_dask["pages"] > 0 and local["removed"] == on_dask["removed"] == {"bench.jsonl": 1}
    a, b = _outputs(Path(local["corpus_dir"]).parent), _outputs(Path(on_dask["corpus_dir"]).parent)
    assert a == b and sorted(a["parts"]) == ["part-00000.jsonl.gz", "part-00001.jsonl.gz", "part-00002.jsonl.gz"]
    assert [it["collected"] for it in local["iterations"]] == [it["collected"] for it in on_dask["iterations"]]


@needs_dask
def test_dask_workers_bind_to_loopback_and_a_bad_page_is_named(prefect_harness, tmp_path, tiny_cfg):
    from tasks.corpus import passes

    cfg = _corpus_cfg(tmp_path, tiny_cfg, "dask", "corpus.workers=2")
    model = _classifier(tmp_path / "c.bin")
    shards = sorted(_pool(tmp_path / "pool").glob("*.jsonl"))
    with open(shards[5], "a") as f:
        f.write('{"url": "https://s5.example/broken", "text": \n')
    with passes(cfg.corpus) as where:
        client = where["map_tasks"].args[0].client
        addresses = [client.scheduler.address, *client.scheduler_info()["workers"]]
        assert len(addresses) == 3 and all(a.startswith("tcp://127.0.0.1:") for a in addresses), addresses
        with pytest.raises(CorpusError, match=f"{shards[5]}:11: invalid JSON"):
            where["score_shards"](model, shards, tmp_path / "scores")
        finished = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "scores").glob("*.tsv")}
        assert set(finished) == {f"{i:05d}.tsv" for i in range(5)}  # every shard but the bad one
        shards[5].write_text(shards[5].read_text().rsplit("\n", 2)[0] + "\n")  # the page removed: the pass resumes
        where["score_shards"](model, shards, tmp_path / "scores")
        # The tasks ran in the workers, each of which keeps one classifier (this process loaded none).
        kept = client.run(lambda: len(__import__("grpo_core.corpus.score", fromlist=["_LOADED"])._LOADED))
        assert sorted(kept.values()) == [1, 1] and score._LOADED == {}
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "scores").glob("*.tsv") if p.name in finished} == finished
    assert len(list((tmp_path / "scores").glob("*.tsv"))) == 6


@pytest.mark.skipif(
    importlib.util.find_spec("prefect_ray") is None,
    reason='prefect-ray is not installed: Ray is optional (pip install -e ".[ray]")',
)
def test_ray_runner_gives_the_local_runners_corpus(prefect_harness, tmp_path, tiny_cfg):
    from flows.corpus import corpus

    _pool(tmp_path / "pool")
    local = corpus(_corpus_cfg(tmp_path, tiny_cfg, "local"))
    on_ray = corpus(_corpus_cfg(tmp_path, tiny_cfg, "ray", "corpus.workers=2"))
    assert _outputs(Path(local["corpus_dir"]).parent) == _outputs(Path(on_ray["corpus_dir"]).parent)


def test_where_the_passes_run_is_not_part_of_the_corpus_cache_key(tmp_path, tiny_cfg):
    """``corpus.runner`` / ``address`` / ``workers`` choose where the passes run, not what they give:
    a finished corpus stays cached when they change; the grouping into part files does not."""
    from grpo_core.manifests import Ref
    from grpo_core.stages.inputs import CorpusInputs
    from tasks.stage_tasks import stage_key

    (tmp_path / "data" / "held_out").mkdir(parents=True)
    (tmp_path / "data" / "held_out" / "svamp.jsonl").write_text("")
    inputs = CorpusInputs(data=Ref(path=str(tmp_path / "data"), digest="d"))
    key = lambda *extra: stage_key("corpus", tiny_cfg(tmp_path, *extra), inputs, tmp_path / "corpus")  # noqa: E731
    assert (
        key()
        == key("corpus.runner=dask", "corpus.workers=2")
        == key("corpus.runner=ray", "corpus.address=ray://h:10001")
    )
    assert key() != key("corpus.shards_per_task=3")
    # The project's own test sets, held-out sets included, are benchmarks the corpus is cleaned of.
    assert set(inputs.benchmarks()) == {"own-test", "own-val", "own-held_out-svamp"}


@pytest.mark.parametrize(
    "settings, message",
    [
        (["corpus.address=tcp://h:8786"], "corpus.address names a cluster: set corpus.runner to dask or ray"),
        (
            ["corpus.runner=dask", "corpus.address=tcp://h:8786", "corpus.workers=4"],
            "corpus.workers sizes a cluster the flow starts",
        ),
    ],
)
def test_runner_settings_that_would_be_ignored_are_refused(tmp_path, tiny_cfg, settings, message):
    from grpo_core.recipe import ConfigError

    with pytest.raises(ConfigError, match=message):
        tiny_cfg(tmp_path, *settings)

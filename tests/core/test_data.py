"""Questions with gold answers: the seeded arithmetic task and GSM8K-form JSONL I/O.

Small split sizes keep the generator fast; load_jsonl errors must name the file and line so a bad
data file is fixed in one look.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpo_core.config import ArithmeticTask
from grpo_core.data import DataError, Example, generate_arithmetic, load_jsonl, write_jsonl

TASK = ArithmeticTask(min_operand=1, max_operand=9, operand_counts=(2, 3, 4), n_sft=150, n_rl=300, n_val=40, n_test=40)
STEP = re.compile(r"(-?\d+) ([+-]) (\d+) = (-?\d+)")
QUESTION = re.compile(r"What is (\d+(?: [+-] \d+)+)\?")


@pytest.fixture(scope="module")
def splits():
    return generate_arithmetic(TASK, seed=0)


def test_split_sizes_and_determinism(splits):
    assert {k: len(v) for k, v in splits.items()} == {"sft": 150, "rl": 300, "val": 40, "test": 40}
    assert generate_arithmetic(TASK, seed=0) == splits
    assert generate_arithmetic(TASK, seed=1) != splits


def test_splits_are_disjoint(splits):
    seen: set[str] = set()
    for name, examples in splits.items():
        questions = {e.question for e in examples}
        if name != "rl":  # the RL pool may repeat its own questions (see generate_arithmetic)
            assert len(questions) == len(examples), f"duplicate question inside {name}"
        assert not (questions & seen), f"{name} shares questions with another split"
        seen |= questions


def test_rl_pool_keeps_the_nominal_chain_lengths():
    """Without repeats the RL pool would be ~90% four-operand chains once short ones run out."""
    task = ArithmeticTask(n_sft=500, n_rl=20000, n_val=300, n_test=500)
    splits = generate_arithmetic(task, seed=0)

    def four_share(examples):
        return sum(e.question.count(" ") // 2 == 4 for e in examples) / len(examples)

    # Measured: rl 0.39 vs val 0.31 (two-operand questions run out, so both lean long).
    assert abs(four_share(splits["rl"]) - four_share(splits["val"])) < 0.1


def test_rl_split_has_no_solutions(splits):
    assert all(e.solution is None for e in splits["rl"])
    assert all(e.solution for k in ("sft", "val", "test") for e in splits[k])


def _check_solution(e: Example, task: ArithmeticTask) -> None:
    tokens = QUESTION.fullmatch(e.question).group(1).split()
    operands, ops = [int(x) for x in tokens[::2]], tokens[1::2]
    assert len(operands) in task.operand_counts
    assert all(task.min_operand <= x <= task.max_operand for x in operands)
    lines = e.solution.split("\n")
    assert len(lines) == len(ops) + 1  # one line per step, then the final answer
    value = operands[0]
    for line, op, x in zip(lines, ops, operands[1:]):
        a, got_op, b, c = STEP.fullmatch(line).groups()
        new = value + x if op == "+" else value - x  # left to right
        assert (int(a), got_op, int(b), int(c)) == (value, op, x, new)
        value = new
    assert lines[-1] == f"#### {value}" and e.gold == str(value)


def test_solutions_are_left_to_right_steps(splits):
    for name in ("sft", "val", "test"):
        for e in splits[name]:
            _check_solution(e, TASK)
    # Negative intermediates are written plainly (e.g. "3 - 8 = -5", then "-5 + 2 = -3").
    assert any(re.search(r"= -\d+\n-\d+ [+-]", e.solution) for e in splits["sft"])


def test_rl_questions_are_in_range_and_golds_right(splits):
    for e in splits["rl"]:
        tokens = QUESTION.fullmatch(e.question).group(1).split()
        value = int(tokens[0])
        for op, x in zip(tokens[1::2], tokens[2::2]):
            assert TASK.min_operand <= int(x) <= TASK.max_operand
            value = value + int(x) if op == "+" else value - int(x)
        assert e.gold == str(value) and (len(tokens) + 1) // 2 in TASK.operand_counts


def test_operand_range_and_count_respected():
    task = ArithmeticTask(min_operand=10, max_operand=12, operand_counts=(3,), n_sft=20, n_rl=20, n_val=5, n_test=5)
    for examples in generate_arithmetic(task, seed=3).values():
        for e in examples:
            operands = [int(x) for x in QUESTION.fullmatch(e.question).group(1).split()[::2]]
            assert len(operands) == 3 and all(10 <= x <= 12 for x in operands)


def test_too_few_distinct_questions_fails_clearly():
    # 1 +/- 1 allows only two distinct questions.
    task = ArithmeticTask(min_operand=1, max_operand=1, operand_counts=(2,), n_sft=5, n_rl=5, n_val=1, n_test=1)
    with pytest.raises(DataError, match="distinct"):
        generate_arithmetic(task, seed=0)


# ---------------------------------------------------------------------------- JSONL


def _write_bytes(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_bytes(data)
    return path


GOOD = json.dumps({"question": "Q?", "answer": "work\n#### 3"}).encode() + b"\n"


@pytest.mark.parametrize(
    "line2, reason",
    [
        (b'{"question": "Q", "answer": \n', "malformed JSON"),
        (b'{"question": "caf\xe9", "answer": "#### 1"}\n', "UTF-8"),
        (b'{"question": "Q"}\n', "answer"),
        (b'{"question": "Q", "answer": "it is 4"}\n', "####"),
        (b'["question", "answer"]\n', "object"),
    ],
    ids=["json", "utf8", "missing-answer", "no-marker", "not-object"],
)
def test_load_jsonl_errors_name_file_and_line(tmp_path, line2, reason):
    path = _write_bytes(tmp_path, GOOD + line2)
    with pytest.raises(DataError) as e:
        load_jsonl(str(path))
    msg = str(e.value)
    assert f"{path}:2" in msg and reason in msg


@pytest.mark.parametrize("content", [b"", b"\n  \n"])
def test_load_jsonl_empty_file(tmp_path, content):
    path = _write_bytes(tmp_path, content)
    with pytest.raises(DataError, match="no examples") as e:
        load_jsonl(str(path))
    assert str(path) in str(e.value)


def test_load_jsonl_missing_file(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_jsonl(str(tmp_path / "absent.jsonl"))


def test_load_jsonl_parses_gold_and_solution(tmp_path):
    lines = [
        {"question": " A? ", "answer": "2 * 500 = 1000\n#### 1,000"},  # GSM8K writes 1,000
        {"question": "B?", "answer": "#### 7"},  # answer only: no worked solution
    ]
    path = _write_bytes(tmp_path, "".join(json.dumps(x) + "\n" for x in lines).encode())
    a, b = load_jsonl(str(path))
    assert a == Example("A?", "1000", "2 * 500 = 1000\n#### 1,000")
    assert b == Example("B?", "7", None)
    assert len(load_jsonl(str(path), limit=1)) == 1


def test_write_then_load_round_trip(tmp_path, splits):
    for name in ("sft", "rl"):
        path = tmp_path / "out" / f"{name}.jsonl"
        write_jsonl(splits[name], path)
        assert load_jsonl(str(path)) == splits[name]


# ---------------------------------------------------------------------------- further held-out sets


def _svamp_file(tmp_path: Path, rows: list[dict]) -> Path:
    return _write_bytes(tmp_path, "".join(json.dumps(r) + "\n" for r in rows).encode())


def test_held_out_formats_give_question_and_numeric_gold(tmp_path):
    """SVAMP's Body and Question join as the evaluation harnesses join them (a full stop added where
    the Body lacks one); a float answer is compared as the number it is (145.0 -> 145, 11.5 stays)."""
    from grpo_core.data import HELD_OUT_FORMATS, load_held_out

    svamp = _svamp_file(
        tmp_path,
        [
            {
                "Body": "There are 290 bananas. If they are organized into 2 groups",
                "Question": "How big is each group?",
                "Answer": 145.0,
            },
            {"Body": "Marco picked 11 pounds.", "Question": " How much did he pick? ", "Answer": 11.5},
        ],
    )
    a, b = load_held_out(str(svamp), "svamp")
    assert a == Example("There are 290 bananas. If they are organized into 2 groups. How big is each group?", "145")
    assert b == Example("Marco picked 11 pounds. How much did he pick?", "11.5")
    mawps = tmp_path / "mawps.jsonl"
    mawps.write_text(json.dumps({"input": " Joan had 70 shells. ", "target": 43.0}) + "\n")
    assert load_held_out(str(mawps), "mawps") == [Example("Joan had 70 shells.", "43")]
    # The recipe's choices are exactly the readers there are (GSM8K form through load_jsonl).
    from typing import get_args

    from grpo_core.config import HeldOutSet

    assert set(get_args(HeldOutSet.model_fields["format"].annotation)) == {"gsm8k", *HELD_OUT_FORMATS}


@pytest.mark.parametrize(
    "row, reason",
    [
        ({"Question": "Q?", "Answer": 1.0}, r":2: field 'Body' is missing or empty \(format svamp\)"),
        (
            {"Body": "B.", "Question": "Q?", "Answer": "one"},
            r":2: field 'Answer' must be a finite number \(format svamp\), got 'one'",
        ),
        ({"Body": "B.", "Question": "Q?", "Answer": float("nan")}, r":2: field 'Answer' must be a finite number"),
        ({"Body": "B.", "Question": "Q?", "Answer": True}, r":2: field 'Answer' must be a finite number"),
    ],
)
def test_held_out_errors_name_file_line_and_field(tmp_path, row, reason):
    from grpo_core.data import load_held_out

    good = {"Body": "B.", "Question": "Q?", "Answer": 2.0}
    path = _write_bytes(tmp_path, (json.dumps(good) + "\n" + json.dumps(row) + "\n").encode())
    with pytest.raises(DataError, match=re.escape(str(path)) + reason):
        load_held_out(str(path), "svamp")


def test_held_out_set_names_are_checked():
    from grpo_core.recipe import ConfigError, load_config

    for bad in ("test", "a/b", "x y"):
        with pytest.raises(ConfigError, match=re.escape(f"held_out: {bad!r} cannot name a set")):
            load_config(None, [f"data.held_out={{{json.dumps(bad)}: {{file: f.jsonl}}}}"])
    with pytest.raises(ConfigError, match=r"data.held_out.svamp.format"):
        load_config(None, ["data.held_out.svamp.file=f.jsonl", "data.held_out.svamp.format=svmap"])


def test_the_data_stage_writes_held_out_sets_and_trains_on_none_of_their_questions(tmp_path, tiny_cfg):
    """``held_out/<name>.jsonl`` in GSM8K form (the eval stage reads it as it reads test.jsonl); an SFT
    or RL question that a held-out set asks is dropped from training; a set the recipe no longer
    names is gone after the next data stage."""
    from grpo_core.stages.prepare import run_prepare

    from grpo_core.manifests import Ref
    from grpo_core.stages.inputs import EvalInputs, SFTInputs
    from tasks.stage_tasks import stage_key

    out = tmp_path / "data"
    plain = run_prepare(tiny_cfg(tmp_path), out)
    rl = load_jsonl(str(out / "rl.jsonl"))
    svamp = _svamp_file(tmp_path, [{"Body": "Sam counts.", "Question": "What is 100 + 1?", "Answer": 101.0}])
    # A held-out set that asks no training question: the splits' digest (what training stages key
    # on) is unchanged, and only the stages that read the held-out sets run again.
    cfg = tiny_cfg(tmp_path, f"data.held_out={{svamp: {{file: {svamp}, format: svamp}}}}")
    keys = lambda manifest: {  # noqa: E731
        i.stage: stage_key(i.stage, cfg, i, tmp_path / i.stage)
        for i in (  # noqa: E731
            SFTInputs(data=Ref(path=str(out), digest=manifest["digest"])),
            EvalInputs(data=Ref(path=str(out), digest=manifest["digest"]), models={}),
        )
    }
    before = keys(plain)
    with_svamp = run_prepare(cfg, out)
    assert with_svamp["digest"] == plain["digest"]
    after = keys(with_svamp)
    assert after["sft"] == before["sft"] and after["eval"] != before["eval"]
    again = tmp_path / "again.jsonl"  # a GSM8K-form held-out set that asks an RL question verbatim
    write_jsonl([Example(rl[0].question, rl[0].gold)], again)
    cfg = tiny_cfg(tmp_path, f"data.held_out={{svamp: {{file: {svamp}, format: svamp}}, again: {{file: {again}}}}}")
    manifest = run_prepare(cfg, out)
    assert manifest["held_out"] == {"svamp": 1, "again": 1}
    assert load_jsonl(str(out / "held_out" / "svamp.jsonl")) == [Example("Sam counts. What is 100 + 1?", "101")]
    assert load_jsonl(str(out / "held_out" / "again.jsonl")) == [Example(rl[0].question, rl[0].gold)]
    assert rl[0].question not in {e.question for e in load_jsonl(str(out / "rl.jsonl"))}
    run_prepare(tiny_cfg(tmp_path), out)
    assert not (out / "held_out").exists()


def test_a_benchmark_number_is_written_as_the_checker_reads_it():
    from grpo_core.data import number_text
    from grpo_core.verify import to_number

    cases = {145.0: "145", 11.5: "11.5", 1e-05: "0.00001", -0.25: "-0.25", 3: "3", True: None, float("nan"): None}
    assert {v: number_text(v) for v in cases} == cases
    assert all(to_number(t) is not None for t in cases.values() if t)


def test_a_text_answer_is_refused_in_a_recipe_and_read_by_eval(tmp_path):
    """A recipe's tasks have numbers for answers; `eval` on another GSM8K-form file compares text."""
    from grpo_core.data import DataError, load_jsonl

    path = tmp_path / "words.jsonl"
    path.write_text(json.dumps({"question": "Spell 2.", "answer": "#### two"}) + "\n")
    assert [e.gold for e in load_jsonl(str(path))] == ["two"]
    with pytest.raises(DataError, match="'two' is not a number"):
        load_jsonl(str(path), numeric=True)

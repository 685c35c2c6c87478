"""GRPO's checked rollouts as the next round's reward data: the log GRPO writes (and trims on
resume), and its conversion into solutions, pairs and exactly labelled steps, by hand."""

from __future__ import annotations

import json

import pytest

from grpo_core.data import prompt_text
from grpo_core.rewards import rollout_log
from grpo_core.rewards.labels import outcome_pairs, step_rows
from grpo_core.stages.reward_data import rollout_samples, solution_rows

Q1, Q2, HELD = "What is 1 + 2?", "What is 5 - 3 + 1?", "What is 9 - 9?"
RIGHT1, WRONG1 = "1 + 2 = 3\n#### 3", "1 + 2 = 4\n#### 4"
RIGHT2, SLIP2 = "5 - 3 = 2\n2 + 1 = 3\n#### 3", "5 - 3 = 3\n3 + 1 = 4\n#### 4"


def _row(q, gold, text, ok):
    return {"question": q, "gold": gold, "completion": text, "correct": ok}


@pytest.fixture
def grpo_dir(tmp_path):
    """Two steps of a GRPO stage: step 1 samples Q1 and HELD twice each, step 2 samples Q2 and Q1."""
    path = rollout_log.log_path(tmp_path)
    rollout_log.append(
        path,
        1,
        [
            _row(Q1, "3", RIGHT1, True),
            _row(Q1, "3", WRONG1, False),
            _row(HELD, "0", "9 - 9 = 0\n#### 0", True),
            _row(HELD, "0", "#### 1", False),
        ],
    )
    rollout_log.append(
        path,
        2,
        [
            _row(Q2, "3", RIGHT2, True),
            _row(Q2, "3", SLIP2, False),
            _row(Q1, "3", RIGHT1, True),
            _row(Q1, "3", RIGHT1, True),
        ],
    )
    return tmp_path


def test_the_log_reads_back_in_step_order_and_trims_after_a_checkpoint(grpo_dir):
    rows = rollout_log.read_logs(grpo_dir)
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4
    rollout_log.truncate_after(rollout_log.log_path(grpo_dir), 1)  # resumed from the step-1 checkpoint
    assert [r["step"] for r in rollout_log.read_logs(grpo_dir)] == [1] * 4


def test_a_broken_log_line_is_named_by_file_and_line(grpo_dir):
    path = rollout_log.log_path(grpo_dir)
    path.write_text(path.read_text() + '{"step": 3, "question": "x"}\n')
    with pytest.raises(ValueError, match=r"rollouts.jsonl:9: not a rollout record"):
        rollout_log.read_logs(grpo_dir)


def test_rollouts_become_groups_of_training_questions_only(grpo_dir):
    groups = rollout_samples(grpo_dir, {Q1, Q2}, None, seed=0)
    # (step 1, Q1), (step 2, Q2), (step 2, Q1): the held-out question's rollouts are dropped.
    assert [(g.example.question, g.correct) for g in groups] == [
        (Q1, [True, False]),
        (Q2, [True, False]),
        (Q1, [True, True]),
    ]
    # 6 solutions, with their verdicts, for the pointwise ORM.
    sols = solution_rows(groups)
    assert [(r["prompt"], r["correct"]) for r in sols] == [
        (prompt_text(Q1), True),
        (prompt_text(Q1), False),
        (prompt_text(Q2), True),
        (prompt_text(Q2), False),
        (prompt_text(Q1), True),
        (prompt_text(Q1), True),
    ]
    # Distinct solutions (the ORM's training rows): the all-right group's two alike samples count once.
    assert len(solution_rows(groups, distinct=True)) == 5
    # Pairs: one per mixed group (1 right x 1 wrong); the all-right group gives none.
    pairs = outcome_pairs(groups, max_pairs=4, seed=0)
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [(RIGHT1, WRONG1), (RIGHT2, SLIP2)]
    # Exact step labels: a group's distinct solutions. SLIP2 is wrong from its first line on.
    steps = step_rows(groups, None, 0, "\n")
    assert [(r["completion"], r["labels"]) for r in steps] == [
        (RIGHT1, [True, True]),
        (WRONG1, [False, False]),
        (RIGHT2, [True, True, True]),
        (SLIP2, [False, False, False]),
        (RIGHT1, [True, True]),
    ]


def test_a_subset_is_drawn_reproducibly(grpo_dir):
    a = rollout_samples(grpo_dir, {Q1, Q2, HELD}, 3, seed=7)
    b = rollout_samples(grpo_dir, {Q1, Q2, HELD}, 3, seed=7)
    assert sum(len(g.completions) for g in a) == 3
    assert [(g.example.question, g.completions) for g in a] == [(g.example.question, g.completions) for g in b]


def test_grpo_logs_every_checked_rollout_and_a_resume_logs_no_step_twice(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir
):
    from grpo_core.stages.grpo import run_grpo

    kw = dict(grpo__checkpoint_every=1, grpo__questions_per_step=2, grpo__group_size=2)
    run_grpo(tiny_cfg(tmp_path, grpo__max_steps=3, **kw), tiny_data_dir, tiny_model_dir, tmp_path / "A")
    run_grpo(tiny_cfg(tmp_path, grpo__max_steps=2, **kw), tiny_data_dir, tiny_model_dir, tmp_path / "B")
    path = rollout_log.log_path(tmp_path / "B")
    path.write_text(path.read_text() + json.dumps({"step": 3, **_row("stale", "0", "x", False)}) + "\n")
    run_grpo(tiny_cfg(tmp_path, grpo__max_steps=3, **kw), tiny_data_dir, tiny_model_dir, tmp_path / "B")
    a, b = rollout_log.read_logs(tmp_path / "A"), rollout_log.read_logs(tmp_path / "B")
    assert len(a) == 3 * 2 * 2 and a == b  # identical samples, none twice, the stale line gone


@pytest.mark.parametrize(
    "question,gold", [("What is 7 + 5 - 9?", "3"), ("What is 1 - 2 + 3 - 4?", "-2"), ("What is 9 + 9?", "18")]
)
def test_a_planted_error_is_one_wrong_step_carried_to_a_wrong_answer(question, gold):
    import random

    from grpo_core.rewards.steps import exact_step_labels, planted_error, reference_steps, step_texts

    chain = reference_steps(question)
    rng = random.Random(0)
    for _ in range(50):
        text = planted_error(question, rng)
        steps = step_texts(text)
        labels = exact_step_labels(question, steps, gold)
        first = labels.index(False)
        # Right up to the planted step, wrong from it on (the final answer included).
        assert labels == [True] * first + [False] * (len(steps) - first) and first < len(chain)
        assert steps[-1] != f"#### {gold}" and len(steps) == len(chain) + 1
        # Operands stay digits 1..9; each line's arithmetic is right except, maybe, the planted one.
        a, op, b, _, c = steps[first].split()
        assert 1 <= int(b) <= 9


def test_planted_samples_are_negatives_of_their_questions(tmp_path):
    from grpo_core.data import Example
    from grpo_core.stages.reward_data import planted_samples

    groups = planted_samples([Example(Q1, "3"), Example(Q2, "3")], 3, seed=0)
    assert [(g.example.question, len(g.completions), g.correct) for g in groups] == [
        (Q1, 3, [False] * 3),
        (Q2, 3, [False] * 3),
    ]
    assert groups[0].completions == planted_samples([Example(Q1, "3")], 3, seed=0)[0].completions  # reproducible
    with pytest.raises(ValueError, match="arithmetic task"):
        planted_samples([Example("Name a prime.", "2")], 1, seed=0)

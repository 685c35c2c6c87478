"""Which questions a GRPO step learns from (stages/questions.py): dynamic sampling drops groups
without reward spread and fills their places within its bound; the curriculum draws by the
policy's pass rates; both reproduce the same batches after a resume and on any number of processes.

The tiny untrained model never answers right, so the reward is replaced by ``gold_parity``: the
parity of a completion's characters where the gold answer is even (a group with spread, nearly
always), 0 where it is odd (a group without spread, always).
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import pytest
import torch

import grpo_core.rewards.scorer as rewards_mod
from grpo_core.data import Example, read_split
from grpo_core.lm.modeling import load_model
from grpo_core.rewards.scorer import RewardScorer, Scored
import grpo_core.stages.rl_step as step_mod
from grpo_core.config import GRPOConfig
from grpo_core.lm.policy import Rollout
from grpo_core.seeds import draw_seed, step_seed
from grpo_core.stages.grpo import run_grpo
from grpo_core.stages.questions import QuestionSampler, read_pass_rates
from grpo_core.stages.rl_step import Learner, rl_step
from grpo_core.stages.rl_types import Models, ScoredGroups
from grpo_core.tracking import NullLogger
from grpo_core.training.distributed import Dist
from tests.stages.test_grpo import _resume_check, _train_metrics


def gold_parity(completions: list[str], golds: list[str]) -> torch.Tensor:
    return torch.tensor([float(sum(map(ord, c)) % 2) if int(g) % 2 == 0 else 0.0 for c, g in zip(completions, golds)])


@pytest.fixture
def sparse(monkeypatch):
    monkeypatch.setattr(rewards_mod, "rule_reward", gold_parity)


# ---------------------------------------------------------------------------- fill: pure, with fake groups


def fake_group(questions: list[Example], g: int = 2) -> ScoredGroups:
    """Groups whose rewards have spread where the question's text starts with "s"."""
    n = len(questions)
    rewards = torch.tensor([float(q.question.startswith("s") and j == 0) for q in questions for j in range(g)])
    width = 1 + n  # rollouts of another width each call: explore joins them
    rollout = Rollout(
        torch.arange(n * g * (1 + width)).view(n * g, 1 + width),
        torch.ones(n * g, 1 + width, dtype=torch.long),
        torch.ones(n * g, width),
        1,
        [q.question for q in questions for _ in range(g)],
        torch.zeros(n * g, dtype=torch.bool),
    )
    return ScoredGroups(questions, rollout, Scored(rewards, rewards, "outcome", stats={"reward/x": 1.0}), 0.0)


def spread_of(ex: ScoredGroups) -> torch.Tensor:
    r = ex.rewards.view(len(ex.questions), -1)
    return r.max(1).values != r.min(1).values


class FakeQuestions:
    """Redraws by (slot, k) from a table (``QuestionSampler.redraw``'s signature)."""

    def __init__(self, table):
        self.table = table

    def redraw(self, step, slot, k, taken=frozenset()):
        return self.table(slot, k)


def fake_explore(monkeypatch, questions: list[Example], redraws: int, table) -> tuple[step_mod.StepSamples, list]:
    """``explore`` on fake groups (``fake_group``) as a second process would run it, its share of the
    step's questions at global slots 10, 11, ...: the step's own bookkeeping, with what it sampled
    recorded."""
    calls = []

    def sample(learner, qs, slots, seed):
        calls.append((slots, seed))
        return fake_group(qs)

    monkeypatch.setattr(step_mod, "sample_groups", sample)
    monkeypatch.setattr(step_mod, "passes_dynamic_sampling", lambda ex, grpo: spread_of(ex))
    cfg = GRPOConfig(questions_per_step=len(questions), group_size=2, redraws=redraws)
    learner = step_mod.Learner(
        Models(None), FakeTokenizer(), None, cfg, None, seed=5, question_sampler=FakeQuestions(table), d=Offset(10)
    )
    others = [Example(f"other-{i}", "0") for i in range(10)]  # the first process's share of the step
    return step_mod.explore(learner, others + questions, step=0), calls


class FakeTokenizer:
    pad_token_id = 0


class Offset(Dist):
    """One process whose share of the step's questions starts at global row ``start`` (a second
    process's, say): its slots are start, start + 1, ..."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start = start

    def shard(self, n: int, what: str) -> slice:
        return slice(self.start, n)


def test_under_process_supervision_a_group_is_judged_by_its_checker_verdicts():
    """The PRM's step rewards differ within every group here; dynamic sampling keeps only the groups
    whose answers are neither all right nor all wrong."""
    from grpo_core.stages.questions import passes_dynamic_sampling

    qs = [Example(f"q{i}", "0") for i in range(3)]
    correct = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])  # all right, mixed, all wrong
    steps = torch.tensor([[0.9, 0.2], [0.3, 0.8], [0.5, 0.1], [0.7, 0.6], [0.2, 0.9], [0.4, 0.3]])
    scored = Scored(
        correct + steps.min(1).values,
        correct,
        "process",
        steps,
        torch.ones(6, 2, dtype=torch.long),
        torch.ones(6, 2, dtype=torch.bool),
    )
    ex = ScoredGroups(qs, fake_group(qs).rollout, scored)
    process = GRPOConfig(group_size=2, supervision="process", reward_weights={"rule": 1.0, "prm": 1.0}, redraws=1)
    assert passes_dynamic_sampling(ex, process).tolist() == [False, True, False]
    outcome = ex._replace(scored=Scored(scored.outcome, correct, "outcome"))  # checker + ORM, say: the same test
    assert passes_dynamic_sampling(
        outcome, GRPOConfig(group_size=2, reward_weights={"rule": 1.0, "orm": 1.0})
    ).tolist() == [
        False,
        True,
        False,
    ]
    # A learned reward alone: the spread of GRPO's advantages (every group's rewards differ here).
    assert (
        passes_dynamic_sampling(outcome, GRPOConfig(group_size=2, reward_weights={"orm": 1.0})).tolist() == [True] * 3
    )


def test_a_group_without_spread_is_dropped_and_replaced(monkeypatch):
    first = [Example("s0", "0"), Example("n1", "1"), Example("s2", "2"), Example("n3", "3")]
    # Slot 1's first redraw has no spread, its second has; slot 3's first has.
    redraw = {(11, 1): Example("n-a", "9"), (11, 2): Example("s-b", "9"), (13, 1): Example("s-c", "9")}
    (_, batch, redraws), calls = fake_explore(monkeypatch, first, 3, lambda slot, k: redraw[slot, k])
    assert [q.question for q in batch.questions] == ["s0", "s-b", "s2", "s-c"]  # slot order, dropped ones replaced
    seed = step_seed(5, 0)
    assert calls == [
        ([10, 11, 12, 13], seed),
        ([11, 13], draw_seed(seed, 1)),
        ([11], draw_seed(seed, 2)),
    ]  # only empty places draw again, with their global slot
    assert redraws.groups_per_slot.tolist() == [1, 3, 1, 2] and redraws.passes.all()
    assert redraws.first_passes.tolist() == [True, False, True, False]
    assert batch.rollout.texts == ["s0", "s0", "s-b", "s-b", "s2", "s2", "s-c", "s-c"]
    assert batch.scored.stats == {"reward/x": 1.0} and spread_of(batch).all()
    # Rows keep their tokens under the wider padding: completion tokens where the mask says so.
    assert batch.rollout.completion_mask.sum(1).tolist() == [5, 5, 2, 2, 5, 5, 3, 3]
    assert batch.rollout.input_ids.shape == (8, 6) and batch.rollout.attention_mask[2].tolist() == [1, 1, 1, 0, 0, 0]


def test_redraws_are_bounded_and_an_unfilled_place_keeps_its_last_group(monkeypatch):
    (_, batch, redraws), calls = fake_explore(
        monkeypatch, [Example("n0", "0"), Example("s1", "1")], 2, lambda slot, k: Example(f"n-{slot}-{k}", "0")
    )
    assert len(calls) == 3  # the first draw, then the bound: redraws more groups per place, never more
    assert redraws.groups_per_slot.tolist() == [3, 1] and redraws.passes.tolist() == [False, True]
    assert [q.question for q in batch.questions] == ["n-10-2", "s1"]  # the shape stays: 2 groups of 2
    assert len(batch.rewards) == 4


# ---------------------------------------------------------------------------- the curriculum's draw


def test_curriculum_draws_its_share_from_questions_solved_sometimes():
    pool = [Example(f"q{i}", str(i)) for i in range(100)]
    rates = {f"q{i}": (i % 3, 2) for i in range(50)}  # q0..q49 measured: right 0, 1 or 2 of 2
    sometimes = {f"q{i}" for i in range(50) if i % 3 == 1}
    assert len(sometimes) == 17
    sampler = QuestionSampler(pool, seed=0, rates=rates, share=0.75)
    for step in range(5):
        qs = sampler.step(step, 8)
        assert len({q.question for q in qs}) == 8
        assert sum(q.question in sometimes for q in qs) >= 6  # round(0.75 * 8), the rest may hit them by chance
    # Redraws follow the same rule: about 3 in 4 from the questions solved sometimes.
    redrawn = [sampler.redraw(s, slot, k).question for s in range(20) for slot in range(8) for k in (1, 2)]
    share = sum(q in sometimes for q in redrawn) / len(redrawn)
    assert 0.68 < share < 0.85  # 0.75 + 0.25 * 17/100 expected
    # Without a curriculum: the paper's uniform draw, the same as before the curriculum existed.
    assert QuestionSampler(pool, 0).step(3, 8) == random.Random(step_seed(0, 3)).sample(pool, 8)


def test_a_curriculum_without_any_question_solved_sometimes_draws_uniformly_and_says_so():
    pool = [Example(f"q{i}", "1") for i in range(5)]
    with pytest.warns(UserWarning, match="none of the 5 RL questions was solved sometimes"):
        sampler = QuestionSampler(pool, 0, {"q0": (0, 8), "q1": (8, 8)}, share=0.5)
    assert sampler.share == 0 and sampler.step(2, 3) == QuestionSampler(pool, 0).step(2, 3)


def test_a_redraw_avoids_the_steps_own_questions():
    pool = [Example(f"q{i}", "1") for i in range(4)]
    taken = frozenset({"q0", "q1", "q2"})
    assert {QuestionSampler(pool, 0).redraw(0, slot, 1, taken).question for slot in range(20)} == {"q3"}


def test_pass_rates_add_up_over_rows(tmp_path):
    (tmp_path / "r.jsonl").write_text(
        '{"question": "a", "right": 1, "samples": 4}\n'
        '{"question": "a", "right": 2, "samples": 4}\n{"question": "b", "right": 0, "samples": 4}\n'
    )
    assert read_pass_rates(tmp_path / "r.jsonl") == {"a": (3, 8), "b": (0, 4)}


# ---------------------------------------------------------------------------- on the real step


def test_dynamic_sampling_fills_the_step_with_groups_that_carry_a_gradient(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, sparse
):
    cfg = tiny_cfg(tmp_path, grpo__questions_per_step=4, grpo__redraws=6, grpo__beta=0.0)  # no reference
    policy, tok = load_model(tiny_model_dir)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    sampler = QuestionSampler(read_split(tiny_data_dir, "rl"), 0)
    questions = sampler.step(0, 4)
    assert any(int(q.gold) % 2 for q in questions), "the test needs a question without spread"
    m = rl_step(
        Learner(Models(policy), tok, opt, cfg.grpo, RewardScorer.for_recipe(cfg.grpo, tok), 0, sampler), questions, 0
    )
    odd = sum(int(q.gold) % 2 for q in questions)
    assert m["train/frac_reward_zero_std"] >= odd / 4  # before the filter
    assert m["train/frac_batch_zero_std"] == 0.0  # after it: every place found a group with spread
    assert m["sampling/groups_kept"] == 4 and m["sampling/groups_drawn"] > 4
    assert m["sampling/groups_dropped"] == m["sampling/groups_drawn"] - 4 <= 4 * cfg.grpo.redraws
    assert m["train/pg_loss"] != 0.0


def test_draws_on_two_processes_equal_one(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, sparse):
    """Each process fills its own places; a place's draws depend on (seed, step, slot, k) only."""
    cfg = tiny_cfg(tmp_path, grpo__questions_per_step=4, grpo__redraws=3)
    policy, tok = load_model(tiny_model_dir)
    scorer = RewardScorer({"rule": 1.0}, "outcome", tok)
    sampler = QuestionSampler(read_split(tiny_data_dir, "rl"), 0)
    questions = sampler.step(5, 4)

    def filled(slots):  # the processes' shares: questions[slots] as their slots of the global batch
        d = type(
            "Share",
            (),
            {
                "shard": lambda self, n, what: slice(slots[0], slots[-1] + 1),
                "gathered": lambda self, m: contextlib.nullcontext(),
                "sum": lambda self, x: x,
            },
        )()
        learner = Learner(Models(policy), tok, None, cfg.grpo, scorer, 0, sampler, d)
        return step_mod.explore(learner, questions, 5).batch

    one = filled([0, 1, 2, 3])
    halves = [filled([0, 1]), filled([2, 3])]
    assert one.rollout.texts == halves[0].rollout.texts + halves[1].rollout.texts
    assert [q.question for q in one.questions] == [q.question for h in halves for q in h.questions]


def _pass_rates(tmp_path: Path, data_dir: Path) -> Path:
    """Pass rates as a reward-data stage writes them: every other RL question solved sometimes."""
    folder = tmp_path / "pass_rates"
    folder.mkdir()
    rows = [
        {"question": e.question, "gold": e.gold, "right": i % 2, "samples": 4}
        for i, e in enumerate(read_split(data_dir, "rl"))
    ]
    (folder / "pass_rates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.mark.parametrize(
    "sampling",
    [dict(grpo__redraws=2), dict(grpo__redraws=2, grpo__curriculum=0.5)],
    ids=["dynamic", "dynamic+curriculum"],
)
def test_resume_reproduces_the_same_batches(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, sparse, sampling):
    """4 steps straight == 2 steps, then the same folder to 4: the same draws, losses and weights."""
    from tests.stages.test_grpo import GRPO_RESUME

    rates = _pass_rates(tmp_path, tiny_data_dir) if "grpo__curriculum" in sampling else None

    def cfg(steps):
        return tiny_cfg(tmp_path, grpo__max_steps=steps, grpo__questions_per_step=4, **GRPO_RESUME, **sampling)

    log_a, log_b1, log_b2 = NullLogger(), NullLogger(), NullLogger()
    run_grpo(cfg(4), tiny_data_dir, tiny_model_dir, tmp_path / "A", log_a, pass_rates=rates)
    assert any(m["sampling/groups_drawn"] > 4 for m in _train_metrics(log_a).values()), "nothing was redrawn"
    run_grpo(cfg(2), tiny_data_dir, tiny_model_dir, tmp_path / "B", log_b1, pass_rates=rates)
    run_grpo(cfg(4), tiny_data_dir, tiny_model_dir, tmp_path / "B", log_b2, pass_rates=rates)
    _resume_check(tmp_path, log_a, log_b1, log_b2, n=4, stop=2)
    a, b = _train_metrics(log_a), {**_train_metrics(log_b1), **_train_metrics(log_b2)}
    assert all(a[s]["sampling/groups_drawn"] == b[s]["sampling/groups_drawn"] for s in a)


def test_curriculum_without_pass_rates_and_redraws_outside_grpo_are_refused(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir
):
    from grpo_core.recipe import ConfigError

    with pytest.raises(ValueError, match="no reward-data pass rates were given"):
        run_grpo(tiny_cfg(tmp_path, grpo__curriculum=0.5), tiny_data_dir, tiny_model_dir, tmp_path / "g")
    with pytest.raises(ConfigError, match="redraws"):
        tiny_cfg(tmp_path, grpo__algorithm="online_rft", grpo__redraws=2)

"""GRPO stage: the metrics the field expects, resume equivalence, and zero-spread groups.

A freshly initialised tiny model never answers correctly, so most tests replace the rule reward with
a deterministic function of the completion text: groups then have a spread and the policy moves.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import pytest
import torch

import grpo_core.rewards.scorer as rewards_mod
import grpo_core.stages.rl_step as step_mod
from grpo_core.data import read_split
from grpo_core.lm.modeling import load_model
from grpo_core.lm.policy import token_logprobs
from grpo_core.losses import aggregate, kl_k3
from grpo_core.rewards.scorer import RewardScorer
from grpo_core.stages.grpo import run_grpo
from grpo_core.stages.questions import QuestionSampler
from grpo_core.stages.rl_step import Learner, rl_step
from grpo_core.stages.rl_types import Models
from grpo_core.tracking import NullLogger
from grpo_core.training.checkpoint import latest_checkpoint, load_state

FIELD_METRICS = [
    "train/reward_mean",
    "train/reward_std",
    "train/frac_reward_zero_std",
    "train/kl",
    "train/clip_ratio",
    "train/entropy",
    "train/completion_len",
    "train/grad_norm",
    "train/lr",
    "perf/tokens_per_s",
]
# Metrics that depend on the weights and rollouts only (not on wall time).
DETERMINISTIC = [m for m in FIELD_METRICS if m != "perf/tokens_per_s"] + [
    "train/loss",
    "train/pg_loss",
    "train/ratio_mean",
    "train/frac_truncated",
]


def parity_reward(completions: list[str], golds: list[str]) -> torch.Tensor:
    """1.0 when the completion's character codes sum to an odd number: deterministic, with spread."""
    return torch.tensor([float(sum(map(ord, c)) % 2) for c in completions])


@pytest.fixture
def parity(monkeypatch):
    monkeypatch.setattr(rewards_mod, "rule_reward", parity_reward)


def _state(path: Path) -> dict[str, torch.Tensor]:
    model, _ = load_model(path)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_weights(a: Path, b: Path) -> None:
    sa, sb = _state(a), _state(b)
    diff = {k: float((sa[k] - sb[k]).abs().max()) for k in sa if not torch.equal(sa[k], sb[k])}
    assert not diff, f"weights differ (max abs diff per tensor): {diff}"


def _train_metrics(logger: NullLogger) -> dict[int, dict[str, float]]:
    return {s: m for s, m in logger.history if "train/loss" in m}


def test_run_grpo_logs_field_metrics(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity):
    cfg = tiny_cfg(
        tmp_path, grpo__max_steps=2, grpo__eval_every=1, grpo__inner_updates=2, grpo__minibatch_size=3, grpo__beta=0.04
    )
    log = NullLogger()
    manifest = run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "grpo", log)
    assert manifest["stage"] == "grpo" and manifest["steps"] == 2
    assert manifest["init"] == str(tiny_model_dir)
    assert (tmp_path / "grpo" / "model" / "config.json").exists()
    load_model(manifest["model"])
    train = _train_metrics(log)
    assert sorted(train) == [1, 2]
    for step, m in train.items():
        missing = [k for k in FIELD_METRICS if k not in m]
        assert not missing, f"step {step} lacks {missing}"
        assert all(math.isfinite(m[k]) for k in FIELD_METRICS)
        assert 0.0 <= m["train/reward_mean"] <= 1.0 and 0.0 <= m["train/frac_reward_zero_std"] <= 1.0
        assert m["train/reward_std"] >= 0 and m["train/kl"] >= 0 and 0 <= m["train/clip_ratio"] <= 1
        assert 0 < m["train/completion_len"] <= cfg.grpo.max_new_tokens
        assert m["train/lr"] == cfg.grpo.lr and m["perf/tokens_per_s"] > 0
        assert m["train/entropy"] > 0 and m["train/grad_norm"] > 0
    # Validation before training (step 0) and at every eval_every.
    assert [s for s, m in log.history if "val/accuracy" in m] == [0, 1, 2]
    # Step 1 starts at the reference (KL 0 before the first update); the policy then moves away.
    assert train[2]["train/kl"] > 0


def test_rollout_questions_depend_on_seed_and_step_only(tiny_data_dir):
    pool = read_split(tiny_data_dir, "rl")
    draws = QuestionSampler(pool, 0)
    assert draws.step(3, 4) == QuestionSampler(pool, 0).step(3, 4)
    assert draws.step(3, 4) != draws.step(4, 4)
    assert len(draws.step(0, 1000)) == len(pool)


def _resume_check(tmp_path, log_a, log_b1, log_b2, n, stop):
    a, b1, b2 = _train_metrics(log_a), _train_metrics(log_b1), _train_metrics(log_b2)
    assert sorted(a) == list(range(1, n + 1))
    assert sorted(b2) == list(range(stop + 1, n + 1)), "the second leg should resume, not restart"
    for step in range(1, n + 1):
        got = (b1 if step <= stop else b2)[step]
        for k in DETERMINISTIC:
            assert got[k] == a[step][k], f"step {step}: {k} {got[k]} != {a[step][k]}"
    last = f"step-{n:08d}"
    _assert_same_weights(tmp_path / "A" / "checkpoints" / last, tmp_path / "B" / "checkpoints" / last)
    _assert_same_weights(tmp_path / "A" / "model", tmp_path / "B" / "model")
    sa = load_state(tmp_path / "A" / "checkpoints" / last)
    sb = load_state(tmp_path / "B" / "checkpoints" / last)
    for k in ("step", "best_acc", "best_step"):
        assert sa["counters"][k] == sb["counters"][k], k
    assert not (tmp_path / "B" / "checkpoints.stale-0").exists()


GRPO_RESUME = dict(
    grpo__checkpoint_every=1,
    grpo__eval_every=2,
    grpo__inner_updates=2,
    grpo__minibatch_size=3,
    grpo__beta=0.04,
    grpo__temperatures=[0.7, 1.0],
)


def test_grpo_resume_equals_straight_run(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity):
    """4 steps straight == 2 steps (steps=2), then the same out dir with steps=4."""
    cfg_full = tiny_cfg(tmp_path, grpo__max_steps=4, **GRPO_RESUME)
    log_a, log_b1, log_b2 = NullLogger(), NullLogger(), NullLogger()
    run_grpo(cfg_full, tiny_data_dir, tiny_model_dir, tmp_path / "A", log_a)
    assert not all(m["train/frac_reward_zero_std"] == 1 for m in _train_metrics(log_a).values())
    _assert_moved(tiny_model_dir, tmp_path / "A" / "checkpoints" / "step-00000004")
    run_grpo(
        tiny_cfg(tmp_path, grpo__max_steps=2, **GRPO_RESUME), tiny_data_dir, tiny_model_dir, tmp_path / "B", log_b1
    )
    run_grpo(cfg_full, tiny_data_dir, tiny_model_dir, tmp_path / "B", log_b2)
    _resume_check(tmp_path, log_a, log_b1, log_b2, n=4, stop=2)


class Crash(Exception):
    pass


class CrashingLogger(NullLogger):
    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def log_metrics(self, metrics, step=None):
        if step == self.at and "train/loss" in metrics:
            raise Crash(step)  # after the step's update, before its checkpoint
        super().log_metrics(metrics, step)


# PPO (grpo.algorithm) also checkpoints its value model and that model's optimizer.
PPO = dict(grpo__algorithm="ppo", grpo__ppo={"gae_gamma": 0.99, "gae_lambda": 0.95})


@pytest.mark.parametrize("algorithm", [{}, PPO], ids=["grpo", "ppo"])
def test_grpo_resume_after_crash_equals_straight_run(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity, algorithm
):
    cfg = tiny_cfg(tmp_path, grpo__max_steps=4, **GRPO_RESUME, **algorithm)
    log_a, log_b2 = NullLogger(), NullLogger()
    run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "A", log_a)
    crashing = CrashingLogger(at=3)
    with pytest.raises(Crash):
        run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "B", crashing)
    assert latest_checkpoint(tmp_path / "B" / "checkpoints").name == "step-00000002"
    run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "B", log_b2)
    _resume_check(tmp_path, log_a, crashing, log_b2, n=4, stop=2)
    a, b = _train_metrics(log_a)[4], _train_metrics(log_b2)[4]
    assert sorted(k for k in a if k.startswith("train/value")) == (
        [] if not algorithm else ["train/value_clip_ratio", "train/value_loss", "train/value_mean"]
    )
    assert all(b[k] == a[k] for k in a if k.startswith("train/value"))  # the value model resumed too


def test_grpo_checkpoints_from_another_start_are_set_aside(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity):
    out = tmp_path / "grpo"
    run_grpo(tiny_cfg(tmp_path, grpo__max_steps=1), tiny_data_dir, tiny_model_dir, out)
    # Another starting model (same recipe) invalidates the checkpoints: its digest is in the identity.
    other = tmp_path / "other_init"
    model, tok = load_model(tiny_model_dir)
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    model.save_pretrained(other)
    tok.save_pretrained(other)
    log = NullLogger()
    run_grpo(tiny_cfg(tmp_path, grpo__max_steps=2), tiny_data_dir, other, out, log)
    assert (tmp_path / "grpo" / "checkpoints.stale-0").is_dir()
    assert sorted(_train_metrics(log)) == [1, 2]


def _assert_moved(before: Path, after: Path) -> None:
    sa, sb = _state(before), _state(after)
    assert any(not torch.equal(sa[k], sb[k]) for k in sa), "training did not change the weights"


# ---------------------------------------------------------------------------- zero-spread groups


class RecordingAdamW(torch.optim.AdamW):
    """AdamW that keeps a copy of the gradients it was asked to apply."""

    def step(self, closure=None):
        self.grads = [
            None if p.grad is None else p.grad.detach().clone() for g in self.param_groups for p in g["params"]
        ]
        return super().step(closure)


def _grpo_setup(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, **overrides):
    cfg = tiny_cfg(tmp_path, grpo__max_grad_norm=1e9, grpo__lr=1e-2, **overrides)
    policy, tok = load_model(tiny_model_dir)
    ref, _ = load_model(tiny_model_dir)
    ref.eval().requires_grad_(False)
    opt = RecordingAdamW(policy.parameters(), lr=cfg.grpo.lr, betas=(0.9, 0.95), weight_decay=0.0)
    questions = QuestionSampler(read_split(tiny_data_dir, "rl"), 0).step(0, cfg.grpo.questions_per_step)
    return cfg, policy, ref, tok, opt, questions


def _eight_rows_and_a_moved_reference(policy, ref, tok, questions):
    """Two questions' groups of 4 sampled from ``policy``, with ``ref`` moved off it (a KL to feel)."""
    from grpo_core.lm.policy import generate

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    prompts = [q.question for q in questions[:2] for _ in range(4)]
    return generate(policy, tok, prompts, max_new_tokens=8, temperatures=[1.0] * 8, seed=3)


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_zero_spread_groups_leave_params_unchanged_without_kl(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, monkeypatch, value
):
    """Every group has identical rewards: zero advantages, so with beta = 0 the gradient is exactly
    zero and AdamW (weight decay 0) leaves every parameter as it was."""
    monkeypatch.setattr(rewards_mod, "rule_reward", lambda c, g: torch.full((len(c),), value))
    cfg, policy, _, tok, opt, questions = _grpo_setup(
        tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, grpo__beta=0.0, grpo__inner_updates=2
    )
    policy.train()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    m = rl_step(
        Learner(Models(policy, None), tok, opt, cfg.grpo, RewardScorer.for_recipe(cfg.grpo, tok), 1), questions, 0
    )
    assert m["train/frac_reward_zero_std"] == 1.0 and m["train/reward_std"] == 0.0
    assert m["train/reward_mean"] == value
    assert m["train/loss"] == 0.0 and m["train/pg_loss"] == 0.0 and m["train/grad_norm"] == 0.0
    assert all(g is None or not g.any() for g in opt.grads)
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_zero_spread_groups_only_kl_gradient(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, monkeypatch):
    """With beta > 0 and a reference that differs from the policy, the applied gradient is exactly
    that of beta * KL (the policy-gradient term contributes nothing)."""
    monkeypatch.setattr(rewards_mod, "rule_reward", lambda c, g: torch.zeros(len(c)))
    seen = {}
    real_generate = step_mod.generate

    def recording_generate(*args, **kwargs):
        seen["rollout"] = real_generate(*args, **kwargs)
        return seen["rollout"]

    monkeypatch.setattr(step_mod, "generate", recording_generate)
    beta = 0.5
    cfg, policy, ref, tok, opt, questions = _grpo_setup(
        tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, grpo__beta=beta, grpo__loss_agg="token-mean"
    )
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    policy.train()
    start = copy.deepcopy(policy)
    m = rl_step(
        Learner(Models(policy, ref), tok, opt, cfg.grpo, RewardScorer.for_recipe(cfg.grpo, tok), 1), questions, 0
    )
    assert m["train/frac_reward_zero_std"] == 1.0 and m["train/pg_loss"] == 0.0
    assert m["train/kl"] > 0
    # token-mean: the loss is beta times the token-mean KL the step reports.
    assert m["train/loss"] == pytest.approx(beta * m["train/kl"], rel=1e-5)

    rollout = seen["rollout"]
    logp = token_logprobs(start, rollout)
    with torch.no_grad():
        ref_logp = token_logprobs(ref, rollout)
    expected_loss = beta * aggregate(kl_k3(logp, ref_logp), rollout.completion_mask, "token-mean")
    start.zero_grad()
    expected_loss.backward()
    assert float(expected_loss.detach()) == pytest.approx(m["train/loss"], rel=1e-5)
    expected = [p.grad for p in start.parameters()]
    assert len(expected) == len(opt.grads)
    for got, want in zip(opt.grads, expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    assert any(g.abs().max() > 0 for g in opt.grads)


@pytest.mark.parametrize(
    "budget", [dict(grpo__max_steps=2), dict(grpo__max_steps=50, grpo__max_seconds=1e-3)], ids=["steps", "max_seconds"]
)
def test_rerunning_a_finished_grpo_does_not_train_again(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity, budget
):
    """Started again with the same recipe, a run that ended (all its steps, or its time budget) must
    return its result without training further."""
    cfg = tiny_cfg(tmp_path, grpo__checkpoint_every=10, **budget)
    first = run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "grpo")
    log = NullLogger()
    again = run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "grpo", log)
    trained = sorted(_train_metrics(log))
    assert trained == [], f"the re-run trained steps {trained}"
    assert again["steps"] == first["steps"]


@pytest.mark.parametrize("micro", [None, 2, 3], ids=["one-pass", "passes-of-2", "passes-of-3"])
def test_repeated_rollouts_are_trained_once_with_the_same_gradient(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, micro
):
    """``update`` passes a group's repeated solutions once, weighted by their count: the gradient is
    the one of the loss over every row (computed here directly on the full batch), and the step's
    metrics count every row. The same in passes of a few distinct rows (``grpo.micro_batch_rows``,
    their gradients summed: one update), down to float rounding."""
    from grpo_core.losses import grpo_loss
    from grpo_core.stages.rl_types import Advantages

    cfg, policy, ref, tok, opt, questions = _grpo_setup(
        tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, grpo__group_size=4, grpo__micro_batch_rows=micro
    )
    rollout = _eight_rows_and_a_moved_reference(policy, ref, tok, questions)
    same = torch.tensor([0, 0, 0, 3, 4, 4, 6, 7])  # rows 1, 2 repeat row 0; row 5 repeats row 4
    rollout = rollout.select(same)
    adv = torch.tensor([1.0, 1.0, 1.0, -3.0, 0.5, 0.5, -0.5, 0.5])[:, None].expand(-1, rollout.completion_mask.shape[1])
    assert len(rollout.distinct(adv).index) == 5
    start = copy.deepcopy(policy)
    policy.train()
    learner = step_mod.Learner(Models(policy, ref), tok, opt, cfg.grpo, None, 0)
    sums, n, *_ = step_mod.update(learner, rollout, Advantages(adv, rollout.completion_mask, {}), 2)
    logp = token_logprobs(start, rollout)
    with torch.no_grad():
        ref_logp = token_logprobs(ref, rollout)
    loss, m = grpo_loss(logp, logp.detach(), ref_logp, adv, rollout.completion_mask, beta=cfg.grpo.beta)
    loss.backward()
    for got, want in zip(opt.grads, [p.grad for p in start.parameters()]):
        torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-5)
    assert n == 1 and sums["loss"] == pytest.approx(loss.item(), rel=1e-6)
    assert sums["kl"] == pytest.approx(m["kl"], rel=1e-5) and sums["ratio_mean"] == pytest.approx(1.0)


def test_reward_mean_means_the_same_under_outcome_and_process_supervision(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, monkeypatch
):
    """train/reward_mean is the mean of the solutions' weighted rewards (the checker plus the PRM's
    lowest step) under either supervision; only the advantages differ (the PRM's steps)."""
    from grpo_core.rewards.heads import reward_model_from
    from grpo_core.rewards.scorer import RewardScorer

    monkeypatch.setattr(rewards_mod, "rule_reward", parity_reward)
    cfg, policy, ref, tok, _, questions = _grpo_setup(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir)
    torch.manual_seed(0)
    prm = reward_model_from(ref, "prm").eval().requires_grad_(False)
    grads = []
    for step in range(3):  # the same model each time: a step whose solutions have several lines differs
        m = {}
        for supervision in ("outcome", "process"):
            grpo = cfg.grpo.model_copy(update={"reward_weights": {"rule": 1.0, "prm": 0.5}, "supervision": supervision})
            scorer = RewardScorer(grpo.reward_weights, supervision, tok, prm=prm)
            model = copy.deepcopy(policy).train()
            opt = torch.optim.AdamW(model.parameters(), lr=grpo.lr)
            m[supervision] = rl_step(Learner(Models(model, ref), tok, opt, grpo, scorer, seed=1), questions, step)
        assert m["outcome"]["train/reward_mean"] == m["process"]["train/reward_mean"]
        assert m["outcome"]["train/reward_std"] == m["process"]["train/reward_std"]
        grads.append((m["outcome"]["train/grad_norm"], m["process"]["train/grad_norm"]))
    # The advantages differ where a solution has several steps, and so does the gradient they give.
    # (The loss itself can be equal: a first update's is the mean of z-scored advantages, 0 either way.)
    assert any(a != b for a, b in grads), grads


def test_keep_best_also_keeps_the_last_policy_when_it_published_another(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity
):
    """The untrained model never answers right: validation stays at 0, so keep-best publishes step 0
    (the starting model) and the policy that 2 steps trained is kept beside it as ``last``."""
    cfg = tiny_cfg(tmp_path, grpo__max_steps=2, grpo__eval_every=1, grpo__keep_best=True, grpo__beta=0.0)
    out = run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "grpo")
    assert out["best_step"] == 0 and out["steps"] == 2 and out["last_model"] == str(tmp_path / "grpo" / "last")
    _assert_same_weights(Path(out["model"]), tiny_model_dir)  # step 0: the starting model republished
    trained, start = _state(Path(out["last_model"])), _state(tiny_model_dir)
    assert any(not torch.equal(trained[k], start[k]) for k in start)  # what 2 steps made, not the start
    last = run_grpo(
        tiny_cfg(tmp_path, grpo__max_steps=2, grpo__keep_best=False),
        tiny_data_dir,
        tiny_model_dir,
        tmp_path / "last-published",
    )
    assert last["last_model"] is None  # nothing else published: the model is the last


def test_oracle_prm_trains_and_every_run_logs_its_position_profile(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir):
    """``grpo.prm_oracle``: the exact step checker stands in for the PRM (no model to load), and the
    mean advantage by step place in checker-silent groups is logged at every step and summarised in
    the manifest, under process and outcome supervision alike (0 there: the checker is silent)."""
    oracle = {"reward_weights": {"rule": 1.0, "prm": 1.0}, "supervision": "process", "prm_oracle": True}
    for name, grpo in (("oracle", oracle), ("rule", {})):
        cfg = tiny_cfg(tmp_path, grpo__max_steps=2, **{f"grpo__{k}": v for k, v in grpo.items()})
        log = NullLogger()
        out = run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / name, log)
        steps = _train_metrics(log)
        assert len(steps) == 2 and any(f"adv/silent_{p}" in m for m in steps.values() for p in ("first", "answer"))
        assert set(out["position_bias"]) == {"first", "middle", "last", "answer"}
        if name == "rule":  # outcome supervision: a silent group's advantages are all 0
            assert all(v == 0 or v != v for v in out["position_bias"].values()), out["position_bias"]
    with pytest.raises(ValueError, match="prm_oracle"):
        tiny_cfg(tmp_path, grpo__prm_oracle=True)


def test_the_calculators_tokens_stay_out_of_the_loss_ratio_and_kl(tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir):
    """A rollout whose ``tool_mask`` marks tokens the calculator wrote: ``update``'s gradient and
    metrics are the loss over the other tokens alone, and differ from the loss over every token."""
    from grpo_core.losses import grpo_loss
    from grpo_core.stages.rl_types import Advantages

    cfg, policy, ref, tok, opt, questions = _grpo_setup(
        tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, grpo__group_size=4
    )
    rollout = _eight_rows_and_a_moved_reference(policy, ref, tok, questions)
    tool = torch.zeros_like(rollout.completion_mask)
    tool[:, 2:4] = rollout.completion_mask[:, 2:4]  # as if the calculator wrote tokens 2 and 3 of every row
    rollout = dataclasses.replace(rollout, tool_mask=tool)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, -0.3])[:, None].expand(-1, tool.shape[1])
    start = copy.deepcopy(policy)
    policy.train()
    learner = step_mod.Learner(Models(policy, ref), tok, opt, cfg.grpo, None, 0)
    sums, *_ = step_mod.update(learner, rollout, Advantages(adv, rollout.completion_mask, {}), 2)
    logp = token_logprobs(start, rollout)
    with torch.no_grad():
        ref_logp = token_logprobs(ref, rollout)
    policy_tokens = rollout.completion_mask * (1 - tool)
    loss, m = grpo_loss(logp, logp.detach(), ref_logp, adv, policy_tokens, beta=cfg.grpo.beta)
    every, _ = grpo_loss(logp, logp.detach(), ref_logp, adv, rollout.completion_mask, beta=cfg.grpo.beta)
    assert tool.sum() > 0 and abs(every.item() - loss.item()) > 1e-6  # the marked tokens would move the loss
    loss.backward()
    for got, want in zip(opt.grads, [p.grad for p in start.parameters()]):
        torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-5)
    assert sums["loss"] == pytest.approx(loss.item(), rel=1e-6) and sums["kl"] == pytest.approx(m["kl"], rel=1e-5)

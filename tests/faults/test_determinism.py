"""The same recipe and seed give the same metrics and weights on CPU: data, SFT, reward data, a
reward model and GRPO run twice into fresh folders, compared exactly (wall-time metrics aside)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from grpo_core.stages.grpo import run_grpo
from grpo_core.stages.inputs import reward_datasets
from grpo_core.stages.prepare import run_prepare
from grpo_core.stages.reward_data import run_reward_data
from grpo_core.stages.reward_model import run_reward_model
from grpo_core.stages.sft import run_sft
from grpo_core.tracking import NullLogger

TIMING = ("time/", "perf/", "wall_s")


def _deterministic(history: list) -> list:
    return [(step, {k: v for k, v in m.items() if not k.startswith(TIMING)}) for step, m in history]


def _run_all(cfg, root: Path) -> tuple[dict, dict]:
    logs = {name: NullLogger() for name in ("sft", "reward_data", "orm", "grpo")}
    data = run_prepare(cfg, root / "data")
    sft = run_sft(cfg, Path(data["dir"]), root / "sft", logs["sft"])
    reward_data = run_reward_data(cfg, Path(data["dir"]), sft["model"], root / "reward_data", logs["reward_data"])
    orm = run_reward_model(cfg, "orm", reward_datasets(reward_data), sft["model"], root / "orm", logs["orm"])
    grpo = run_grpo(
        cfg, Path(data["dir"]), sft["model"], root / "grpo", logs["grpo"], reward_models={"orm": orm["model"]}
    )
    models = {
        name: load_file(str(next(Path(m["model"]).glob("*.safetensors"))))
        for name, m in (("sft", sft), ("orm", orm), ("grpo", grpo))
    }
    return {name: _deterministic(log.history) for name, log in logs.items()}, models


def _parity(completion: str, gold: str) -> bool:
    """Deterministic verdicts with spread: the tiny model never answers right after 4 SFT steps."""
    return sum(map(ord, completion)) % 2 == 1


def test_same_recipe_and_seed_give_the_same_metrics_twice(tmp_path, tiny_cfg, monkeypatch):
    import grpo_core.rewards.labels
    import grpo_core.rewards.scorer

    monkeypatch.setattr(grpo_core.rewards.labels, "is_correct", _parity)
    monkeypatch.setattr(grpo_core.rewards.scorer, "is_correct", _parity)
    cfg = tiny_cfg(
        tmp_path,
        sft__max_steps=4,
        grpo__max_steps=2,
        grpo__reward_weights={"rule": 1.0, "orm": 0.5},
        reward_data__questions=16,
        reward_data__heldout_fraction=0.25,
        reward_data__step_questions=2,
        reward_data__samples_per_question=4,
        reward_data__max_new_tokens=12,
        orm__train=True,
        orm__batch_size=2,
    )
    first_metrics, first_models = _run_all(cfg, tmp_path / "first")
    second_metrics, second_models = _run_all(cfg, tmp_path / "second")
    for name in first_metrics:
        assert first_metrics[name], name  # the stage logged something
        assert first_metrics[name] == second_metrics[name], name
    for name, weights in first_models.items():
        assert all(torch.equal(w, second_models[name][k]) for k, w in weights.items()), name


def test_the_shared_prompt_backward_gives_the_same_bits_on_a_busy_cpu(tiny_model_dir):
    """GRPO's log-prob pass computes each distinct prompt once and selects its keys and values per row;
    the backward of that selection accumulates over rows. With two other processes busy on the cores
    (a shared machine), its default CPU kernel summed in the order the threads finished and the
    gradients changed from one pass to the next (measured 2026-11-26: 8 different results in 12
    passes, from the last layer's key and value projections down). ``set_compute`` (every stage's
    start) turns on torch's deterministic algorithms: the same bits every time."""
    import hashlib
    import subprocess
    import sys

    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.policy import CompletionLogprobs
    from grpo_core.lm.runtime import set_compute

    threads = torch.get_num_threads()
    set_compute(2)
    model, _ = load_model(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 90, (48, 100), generator=g)
    ids[:, :40] = ids[:1, :40]  # one prompt, 48 completions: the shared path
    reader = CompletionLogprobs(model)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        seen = set()
        for _ in range(8):
            model.zero_grad()
            (reader(ids, torch.ones_like(ids), 40)[0] * torch.linspace(-1, 1, 60)).mean().backward()
            seen.add(hashlib.sha256(b"".join(p.grad.numpy().tobytes() for p in model.parameters())).hexdigest())
    finally:
        for b in burners:
            b.kill()
        torch.set_num_threads(threads)
    assert len(seen) == 1

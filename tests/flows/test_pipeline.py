"""The pipeline flow end to end on a tiny recipe: the public manifest (docs/architecture.md), MLflow's parent and
child runs, and content caching (a re-run skips finished stages; a deleted output is recomputed).

Prefect and the flow are imported inside the test, after the session fixture has pointed
PREFECT_HOME at a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from grpo_core.recipe import flatten


def _manifest(cfg) -> dict:
    return json.loads((Path(cfg.output_dir) / cfg.run_name / "manifest.json").read_text())


@pytest.fixture
def mlflow_client(tmp_path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")


def test_pipeline_end_to_end_and_cached_rerun(prefect_harness, tmp_path, tiny_cfg, mlflow_client, monkeypatch):
    from flows.pipeline import pipeline

    secret = "hf_5e1d0c9b8a7f6e5d4c3b"  # an environment secret: it must appear in no param or tag
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", secret)
    cfg = tiny_cfg(tmp_path, run_name="e2e", sft__max_steps=3, grpo__max_steps=2, grpo__checkpoint_every=1)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    returned = pipeline(cfg)
    run_dir = tmp_path / "runs" / "e2e"
    manifest = _manifest(cfg)
    assert manifest == json.loads(json.dumps(returned))

    # ---- the public contract
    for key in ("policy", "sft_model", "eval", "mlflow_run_id", "tracking_uri"):
        assert key in manifest, key
    assert manifest["tracking_uri"] == uri
    assert Path(manifest["policy"]) == run_dir / "round-1" / "grpo" / "model"
    assert Path(manifest["sft_model"]) == run_dir / "sft" / "model"
    for folder in (manifest["policy"], manifest["sft_model"]):
        assert (Path(folder) / "config.json").exists() and (Path(folder) / "tokenizer.json").exists()
    assert set(manifest["eval"]) == {"sft", "policy"}
    for name, result in manifest["eval"].items():
        assert result["n"] == 10 and 0.0 <= result["accuracy"] <= 1.0, name
    assert manifest["cached_stages"] == []
    assert (run_dir / "config.yaml").exists()
    # The numerics the run computed with (tests/core/test_numerics.py: who set them, in stage processes too).
    assert manifest["numerics"]["settings"]["MKL_CBWR"]["value"] == os.environ["MKL_CBWR"]

    # Each stage's own peak memory, though they ran in the flow's process, and the run's over all of them.
    peaks = [m["peak_memory"] for m in manifest["stages"].values()]
    stage_peaks = [p.get("rss_mib", p.get("process_rss_mib", 0)) for p in peaks]  # the second where no reset
    assert all(p > 0 for p in stage_peaks) and manifest["peak_memory"]["rss_mib"] >= max(stage_peaks)

    [round1] = manifest["rounds"]
    assert round1["test_accuracy"] == manifest["eval"]["policy"]["accuracy"]  # one round: the final policy

    # ---- MLflow: one parent run with a child per stage and per round; the round's stages nested in it
    parent = mlflow_client.get_run(manifest["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    exp_id = parent.info.experiment_id
    experiment = mlflow_client.get_experiment(exp_id)
    assert experiment.name == cfg.tracking.experiment
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # opens in the model-training view
    assert parent.data.params == flatten(cfg)
    assert parent.data.metrics["eval/policy/accuracy"] == manifest["eval"]["policy"]["accuracy"]
    assert parent.data.metrics["eval/sft/accuracy"] == manifest["eval"]["sft"]["accuracy"]
    # The time profile: every stage, a round's as round-<k>/<stage>; they account for most of the flow.
    profile = manifest["profile"]
    assert set(profile["stages_s"]) == {"data", "sft", "eval", "round-1/grpo", "round-1/eval", "round-1/register"}
    assert 0 < profile["stage_share"] <= 1.0  # (a tiny run is mostly Prefect and MLflow bookkeeping)
    assert sum(profile["stages_s"].values()) == pytest.approx(profile["stage_share"] * profile["wall_s"], rel=1e-2)
    assert parent.data.metrics["time/stage/round-1/grpo_s"] == profile["stages_s"]["round-1/grpo"]
    children = mlflow_client.search_runs([exp_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_name = {r.info.run_name: r for r in children}
    assert sorted(by_name) == ["data", "eval", "round-1", "sft"]
    round_run = by_name["round-1"]
    assert parent.data.tags["round_run.1"] == round_run.info.run_id == round1["mlflow_run_id"]
    in_round = {
        r.info.run_name: r
        for r in mlflow_client.search_runs(
            [exp_id], filter_string=f"tags.mlflow.parentRunId = '{round_run.info.run_id}'"
        )
    }
    assert sorted(in_round) == ["round-1/eval", "round-1/grpo"]  # the round in the name: rounds differ in a comparison
    for run in [parent, *children, *in_round.values()]:
        assert run.info.status == "FINISHED"
        logged = [*run.data.params.values(), *run.data.tags.values()]
        assert not any(secret in v for v in logged), run.info.run_name
    grpo_run = in_round["round-1/grpo"]
    assert round_run.data.tags["stage_run.grpo"] == grpo_run.info.run_id
    assert round_run.data.metrics["round/test_accuracy"] == round1["test_accuracy"]
    history = mlflow_client.get_metric_history(grpo_run.info.run_id, "train/reward_mean")
    assert sorted(m.step for m in history) == [1, 2]
    sft_history = mlflow_client.get_metric_history(by_name["sft"].info.run_id, "sft/train/loss")  # stage-prefixed
    assert sorted(m.step for m in sft_history) == [1, 2, 3]
    assert grpo_run.data.params["grpo.group_size"] == str(cfg.grpo.group_size)
    assert "eval/sft/accuracy" in by_name["eval"].data.metrics
    assert "eval/policy/accuracy" in in_round["round-1/eval"].data.metrics  # the round evaluated its policy

    # ---- a second run of the same recipe: every stage from the cache (the round run only reports)
    mtime = (run_dir / "round-1" / "grpo" / "model" / "model.safetensors").stat().st_mtime_ns
    second = pipeline(cfg)
    manifest2 = _manifest(cfg)
    assert sorted(manifest2["cached_stages"]) == ["data", "eval", "round-1/eval", "round-1/grpo", "sft"]
    assert manifest2["eval"] == manifest["eval"]
    assert manifest2["mlflow_run_id"] != manifest["mlflow_run_id"]
    assert (run_dir / "round-1" / "grpo" / "model" / "model.safetensors").stat().st_mtime_ns == mtime
    parent2 = mlflow_client.get_run(second["mlflow_run_id"])
    assert parent2.data.tags["cached_stages"] == ",".join(manifest2["cached_stages"])
    # A round served whole from the cache is the run that computed it, not a copy under the new parent.
    assert mlflow_client.search_runs([exp_id], filter_string=f"tags.mlflow.parentRunId = '{parent2.info.run_id}'") == []
    assert parent2.data.tags["round_run.1"] == round1["mlflow_run_id"] == manifest2["rounds"][0]["mlflow_run_id"]
    assert manifest2["rounds"][0]["model_version"] == round1["model_version"]  # registered once

    # ---- a deleted stage output is recomputed; the others still come from the cache
    shutil.rmtree(run_dir / "eval")
    third = pipeline(cfg)
    manifest3 = _manifest(cfg)
    assert "eval" not in manifest3["cached_stages"]
    assert sorted(manifest3["cached_stages"]) == ["data", "round-1/eval", "round-1/grpo", "sft"]
    assert (run_dir / "eval" / "manifest.json").exists()
    assert manifest3["eval"] == manifest["eval"]  # greedy evaluation of the same models
    children3 = mlflow_client.search_runs(
        [exp_id], filter_string=f"tags.mlflow.parentRunId = '{third['mlflow_run_id']}'"
    )
    assert sorted(r.info.run_name for r in children3) == ["eval"]  # (the round: all from the cache)

    # ---- damaged outputs (docs/reliability.md): SFT's published weights cut short, a manifest that
    # is not JSON. Those stages run again (SFT from its last checkpoint: the same weights, so the
    # stages after it keep their cache); nothing damaged is served.
    sft_weights = run_dir / "sft" / "model" / "model.safetensors"
    with open(sft_weights, "r+b") as f:
        f.truncate(100)
    (run_dir / "round-1" / "eval" / "manifest.json").write_text('{"stage": "eval", "res')
    pipeline(cfg)
    manifest4 = _manifest(cfg)
    assert sorted(manifest4["cached_stages"]) == ["data", "eval", "round-1/grpo"]
    assert manifest4["stages"]["sft"]["digest"] == manifest["stages"]["sft"]["digest"]
    assert manifest4["eval"] == manifest["eval"]

    # ---- a run folder copied elsewhere (another project), the original moved out of reach: every
    # stage reused, read where it is now (docs/pipeline.md, "Iterative RL")
    from flows.pipeline import made_elsewhere
    from grpo_core.stages.inputs import DataInputs
    from tasks.stage_tasks import data_task

    elsewhere = tmp_path / "elsewhere" / "runs"
    shutil.copytree(run_dir, elsewhere / "e2e")
    run_dir.rename(run_dir.with_name("gone"))
    moved_cfg = cfg.model_copy(update={"output_dir": str(elsewhere)})
    assert made_elsewhere(elsewhere / "e2e") == run_dir
    pipeline(moved_cfg)
    manifest5 = _manifest(moved_cfg)
    assert sorted(manifest5["cached_stages"]) == ["data", "eval", "round-1/eval", "round-1/grpo", "sft"]
    assert manifest5["eval"]["policy"]["accuracy"] == manifest["eval"]["policy"]["accuracy"]
    assert Path(manifest5["policy"]) == elsewhere / "e2e" / "round-1" / "grpo" / "model"
    assert str(run_dir) not in json.dumps(manifest5)
    assert made_elsewhere(elsewhere / "e2e") is None
    # With no result in this Prefect home the task itself serves what is on disk (no MLflow run opened).
    done = data_task.fn(
        cfg=moved_cfg,
        out_dir=str(elsewhere / "e2e" / "data"),
        inputs=DataInputs(),
        uri="sqlite:///nowhere/mlflow.db",
        parent_id="none",
    )
    assert Path(done["dir"]) == elsewhere / "e2e" / "data"


def test_failed_stage_marks_runs_failed(prefect_harness, tmp_path, tiny_cfg, mlflow_client):
    """A stage that raises fails the flow and marks both its child run and the parent FAILED."""
    from flows.pipeline import pipeline

    from grpo_core.data import DataError

    # Operands 1..1 in pairs allow only two distinct questions: the data stage cannot draw 10.
    cfg = tiny_cfg(tmp_path, run_name="broken", data__arithmetic__max_operand=1, data__arithmetic__operand_counts=[2])
    with pytest.raises(DataError, match="cannot draw"):
        pipeline(cfg)
    assert not (tmp_path / "runs" / "broken" / "manifest.json").exists()
    exp = mlflow_client.get_experiment_by_name(cfg.tracking.experiment)
    runs = {r.info.run_name: r for r in mlflow_client.search_runs([exp.experiment_id])}
    assert set(runs) == {"broken", "data"}
    assert runs["broken"].info.status == "FAILED"
    assert runs["data"].info.status == "FAILED"
    assert runs["data"].data.tags["mlflow.parentRunId"] == runs["broken"].info.run_id


def test_cli_run_prints_summary(prefect_harness, tmp_path, tiny_cfg, capsys):
    """``grpo-pipeline run CONFIG.yaml --set ...``: the YAML recipe plus overrides, a JSON summary."""
    import yaml

    from flows.cli import main

    cfg = tiny_cfg(tmp_path, run_name="viacli", sft__max_steps=2, grpo__max_steps=1)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    svamp = tmp_path / "svamp.jsonl"  # a further held-out set in SVAMP's form, named on the command line
    svamp.write_text(
        "".join(
            json.dumps({"Body": f"Sam has {i} apples.", "Question": f"What is {i} + 2?", "Answer": float(i + 2)}) + "\n"
            for i in range(7)
        )
    )
    main(
        [
            "run",
            str(recipe),
            "--set",
            "grpo.max_steps=2",
            "--set",
            "run_name=viacli2",
            "--set",
            f"data.held_out.svamp.file={svamp}",
            "--set",
            "data.held_out.svamp.format=svamp",
            "--json",
        ]
    )
    summary = json.loads(capsys.readouterr().out)
    run_dir = Path(cfg.output_dir) / "viacli2"
    assert summary["run_dir"] == str(run_dir)
    assert set(summary["eval"]) == {"sft", "policy"} and "accuracy" in summary["eval"]["policy"]
    # ---- the held-out set: every model measured on it beside the test split, the gain with its interval
    held_out = summary["held_out"]["svamp"]
    assert held_out["n"] == 7 and set(held_out["gain_over_sft"]) == {"mean", "low", "high", "n"}
    assert held_out["policy"] - held_out["sft"] == pytest.approx(held_out["gain_over_sft"]["mean"])
    assert summary["eval"]["sft"]["held_out"]["svamp"] == {"n": 7, "accuracy": held_out["sft"]}  # no file paths
    assert summary["cached_stages"] == []
    assert summary["tracking_uri"] == f"sqlite:///{tmp_path}/mlflow.db"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["mlflow_run_id"] == summary["mlflow_run_id"]
    assert manifest["rounds"][0]["grpo"]["steps"] == 2  # the --set override was applied
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["grpo"]["max_steps"] == 2
    per_question = json.loads(Path(manifest["eval"]["policy"]["held_out"]["svamp"]["per_question"]).read_text())
    assert len(per_question) == 7 and sum(per_question) / 7 == held_out["policy"]
    assert manifest["rounds"][0]["held_out_accuracy"] == {"svamp": held_out["policy"]}
    from mlflow.tracking import MlflowClient

    metrics = MlflowClient(summary["tracking_uri"]).get_run(manifest["mlflow_run_id"]).data.metrics
    assert metrics["eval/svamp/policy/accuracy"] == held_out["policy"] and "eval/svamp/gain_over_sft_low" in metrics
    summary_md, _ = _prefect_summary("viacli2-summary")
    assert (
        "| model | test accuracy (10 questions) | minus SFT, paired (95% interval) | svamp accuracy (7 questions) |"
        in summary_md
    )


def test_pipeline_with_reward_models_and_process_supervision(
    prefect_harness, tmp_path, tiny_cfg, mlflow_client, monkeypatch
):
    """reward_data -> orm, prm -> GRPO with PRM process supervision: child runs, datasets logged as
    MLflow inputs, TRL-form datasets on disk, and a cached rerun that skips every stage."""
    import grpo_core.rewards.labels as reward_data_mod
    from datasets import load_from_disk
    from flows.pipeline import pipeline

    # An untrained tiny policy is never right; a parity "checker" gives the mixed groups that pairs
    # and step labels need, so the wiring is exercised end to end.
    monkeypatch.setattr(reward_data_mod, "is_correct", lambda text, gold: sum(map(ord, text)) % 2 == 1)
    cfg = tiny_cfg(
        tmp_path,
        "grpo.reward_weights={prm: 1.0, rule: 0.5}",
        run_name="rm",
        sft__max_steps=2,
        grpo__max_steps=2,
        grpo__supervision="process",
        orm__train=True,
        prm__train=True,
        reward_data__questions=8,
        reward_data__samples_per_question=3,
        reward_data__max_new_tokens=12,
        reward_data__mc_rollouts=2,
        reward_data__heldout_fraction=0.25,
        orm__batch_size=4,
        prm__batch_size=4,
        orm__lr=1e-3,
        prm__lr=1e-3,
    )
    manifest = pipeline(cfg)
    run_dir = tmp_path / "runs" / "rm"
    assert set(manifest["reward_models"]) == {"orm", "prm"}
    for kind in ("orm", "prm"):
        stage = manifest["rounds"][0]["stages"][kind]
        assert Path(stage["model"]) == run_dir / "round-1" / kind / "model" and stage["epochs"] == 1
        assert stage["replay"]["replay"] == 0 and stage["replay"]["share"] == 0.0  # round 1 has no history
    pairs = load_from_disk(str(run_dir / "round-1" / "reward_data" / "pairs"))
    steps = load_from_disk(str(run_dir / "round-1" / "reward_data" / "steps"))
    assert set(pairs) == {"train", "test"} and pairs["train"].column_names == [
        "prompt",
        "chosen",
        "rejected",
        "origin_round",
    ]
    assert {"prompt", "completions", "labels"} <= set(steps["train"].column_names)

    round_run = mlflow_client.get_run(manifest["rounds"][0]["mlflow_run_id"])
    # The settings that decide a round, for MLflow's compare view (two rounds, two recipes).
    assert round_run.data.params["round"] == "1" and round_run.data.params["grpo.lr"] == str(cfg.grpo.lr)
    assert "rounds.replay_fraction" in round_run.data.params and "sft.lr" not in round_run.data.params
    # The headline metrics come first where MLflow lists them by name, before dozens of rm/* rows.
    names = sorted(round_run.data.metrics)
    assert names[:3] == ["headline/kl", "headline/reward_mean", "headline/test_accuracy"], names[:5]
    assert round_run.data.metrics["headline/test_accuracy"] == round_run.data.metrics["round/test_accuracy"]
    assert any(n.startswith("rm/") for n in names)
    children = {
        r.info.run_name: r
        for r in mlflow_client.search_runs(
            [round_run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{round_run.info.run_id}'"
        )
    }
    assert sorted(children) == [f"round-1/{s}" for s in ("eval", "grpo", "orm", "prm", "replay", "reward_data")]
    prm_inputs = [d.dataset.name for d in children["round-1/prm"].inputs.dataset_inputs]
    assert prm_inputs == ["reward_data/steps"]
    assert {"prm/heldout/step_auc", "prm/heldout/step_accuracy"} & set(children["round-1/prm"].data.metrics)
    assert not any(m.startswith("train/") for m in children["round-1/prm"].data.metrics)  # train/* is GRPO's alone
    grpo_metrics = children["round-1/grpo"].data.metrics
    assert "train/accuracy" in grpo_metrics and "reward/steps_per_completion" in grpo_metrics

    # ---- what a user sees: the figures (files, MLflow images), the Prefect summary, named flow runs
    assert set(manifest["figures"]) == {"test_accuracy", "grpo_curves", "reward_models"}
    assert all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in manifest["figures"].values())
    parent = mlflow_client.get_run(manifest["mlflow_run_id"])
    assert sorted(a.path for a in mlflow_client.list_artifacts(parent.info.run_id, "figures")) == [
        "figures/grpo_curves.png",
        "figures/reward_models.png",
        "figures/test_accuracy.png",
    ]
    assert "Artifacts -> `figures`" in parent.data.tags["mlflow.note.content"]

    again = pipeline(cfg)
    assert sorted(again["cached_stages"]) == [
        "data",
        "eval",
        *(f"round-1/{s}" for s in ("eval", "grpo", "orm", "prm", "replay", "reward_data")),
        "sft",
    ]
    summary, flow_runs = _prefect_summary("rm-summary")
    assert {"rm", "rm-2", "rm/round-1"} <= flow_runs  # the recipe's run_name, numbered on a rerun
    lines = summary.splitlines()
    header = lines.index("| model | test accuracy (10 questions) | minus SFT, paired (95% interval) | MLflow run |")
    assert lines[header + 1] == "|---|---|---|---|" and lines[header + 2].startswith("| SFT | ")
    assert (
        lines[header + 3].startswith("| round 1 policy (final) | ")
        and "?workflowType=machine_learning)" in lines[header + 3]
    )
    assert any(line.startswith("| ORM | 1 | within_question_auc ") for line in lines) and "| | |" not in summary
    assert summary.count("](data:image/png;base64,") == 3


def _prefect_summary(key: str) -> tuple[str, set[str]]:
    """The newest Prefect artifact ``key``'s Markdown, and the names of every flow run so far."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        [artifact] = client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        return artifact.data, {r.name for r in client.read_flow_runs()}


def test_compare_flow_reuses_the_runs_grpo_and_tabulates(
    prefect_harness, tmp_path, tiny_cfg, mlflow_client, monkeypatch
):
    """compare: the variant equal to the run's GRPO is reused, the others train for the seconds it
    trained, one eval covers all."""
    import grpo_core.rewards.labels as reward_data_mod
    from flows.experiment import experiment
    from flows.pipeline import pipeline

    monkeypatch.setattr(reward_data_mod, "is_correct", lambda text, gold: sum(map(ord, text)) % 2 == 1)
    cfg = tiny_cfg(
        tmp_path,
        "grpo.reward_weights={orm: 1.0}",
        run_name="cmp",
        sft__max_steps=2,
        grpo__max_steps=1,
        orm__train=True,
        reward_data__questions=8,
        reward_data__samples_per_question=3,
        reward_data__max_new_tokens=12,
        reward_data__mc_rollouts=2,
        reward_data__heldout_fraction=0.25,
    )
    manifest = pipeline(cfg)
    # Each seed its own reward data and ORM: seed 0's are the run's round 1 again (the same seed: the
    # same bits), so its GRPO (as many steps as the run's) is the run's, reused; seed 1's are its own.
    own = experiment(str(tmp_path / "runs" / "cmp"), "compare", ["orm-outcome"], seeds=2, steps=1)
    chains = Path(own["dir"]) / "chains"
    orm = [
        json.loads((chains / f"seed-{i}" / "round-1" / "orm" / "manifest.json").read_text())["digest"] for i in (0, 1)
    ]
    assert own["reward_models"] == "per seed" and orm[0] == manifest["rounds"][0]["stages"]["orm"]["digest"] != orm[1]
    assert own["runs"]["orm-outcome"][0]["model"]["path"] == manifest["rounds"][0]["stages"]["grpo"]["model"]
    assert "mean of 2 seeds' own" in {r["variant"]: r for r in own["rows"]}["orm-outcome"]["reward_model"]
    # New seeds for a planned confirmation: from seed 1 on, in a folder of their own; seed 1 is the same bits.
    again = experiment(str(tmp_path / "runs" / "cmp"), "compare", ["orm-outcome"], seeds=1, steps=1, first_seed=1)
    assert again["dir"] == own["dir"] + "-from-seed-1" and again["seed_ids"] == [1]
    (run,) = again["runs"]["orm-outcome"]
    assert run["seed"] == cfg.seed + 1 and run["model"]["digest"] == own["runs"]["orm-outcome"][1]["model"]["digest"]
    assert {r["variant"]: r for r in again["rows"]}["orm-outcome"]["per_seed"] == (
        {r["variant"]: r for r in own["rows"]}["orm-outcome"]["per_seed"][1:]
    )
    # Shared: every seed on the run's own reward models; the PRM variants are skipped (no PRM was trained).
    out = experiment(str(tmp_path / "runs" / "cmp"), "compare", seeds=2, shared_reward_models=True)
    by_variant = {r["variant"]: r for r in out["rows"]}
    assert (
        list(by_variant) == ["sft", "continued-sft", "rule-outcome", "orm-outcome"] and out["reward_models"] == "shared"
    )
    grpo = manifest["rounds"][0]["stages"]["grpo"]
    root = Path(out["dir"])
    assert (
        out["budget"] == {"seconds": grpo["train_s"], "steps": None}
        and root.parent == tmp_path / "runs" / "cmp" / "compare"
    )
    assert root.name.endswith("-shared-rm")
    runs = out["runs"]
    assert runs["orm-outcome"][0]["model"]["path"] == grpo["model"]  # seed 0 reused
    assert [r["seed"] for r in runs["orm-outcome"]] == [cfg.seed, cfg.seed + 1]
    assert not (root / "orm-outcome" / "seed-0").exists() and (root / "orm-outcome" / "seed-1" / "model").is_dir()
    assert (root / "rule-outcome" / "seed-0" / "model").is_dir() and (
        root / "continued-sft" / "seed-1" / "model"
    ).is_dir()
    sft_acc = by_variant["sft"]["test_accuracy_mean"]
    for name in ("continued-sft", "rule-outcome", "orm-outcome"):
        row = by_variant[name]
        assert row["seeds"] == 2 and len(row["per_seed"]) == 2
        assert row["gain_over_sft"] == pytest.approx(row["test_accuracy_mean"] - sft_acc, abs=1e-4)
        low, high = row["gain_over_sft_95ci"]
        assert low <= row["gain_over_sft"] <= high
    assert (
        "gain_over_continued-sft" in by_variant["rule-outcome"]
        and "gain_over_continued-sft" not in by_variant["continued-sft"]
    )
    # The paper's §5 algorithms on request, one seed each, at the same budget.
    section5 = {
        r["variant"]: r
        for r in experiment(
            str(tmp_path / "runs" / "cmp"), "compare", ["rft", "online-rft", "ppo"], seeds=1, samples=2
        )["rows"]
    }
    assert list(section5) == ["sft", "rft", "online-rft", "ppo"]
    for row in section5.values():  # maj@K and pass@K of every model (pass@K >= maj@K: any correct of K)
        assert 0 <= row["maj@2_mean"] <= row["pass@2_mean"] <= 1
    assert "maj@2_mean" not in by_variant["rule-outcome"]  # K = 1: greedy only
    exp_id = mlflow_client.get_run(manifest["mlflow_run_id"]).info.experiment_id
    for algorithm in ("rft", "online_rft", "ppo"):  # each stage's run is named after its algorithm
        [stage_run] = mlflow_client.search_runs([exp_id], filter_string=f"params.`grpo.algorithm` = '{algorithm}'")
        assert ("train/value_loss" in stage_run.data.metrics) == (algorithm == "ppo")
        assert stage_run.info.run_name == algorithm
    with pytest.raises(ValueError, match="unknown compare variant"):
        experiment(str(tmp_path / "runs" / "cmp"), "compare", ["reinforce"], seeds=1)
    compare_run = mlflow_client.search_runs(
        [mlflow_client.get_run(manifest["mlflow_run_id"]).info.experiment_id],
        filter_string="tags.mlflow.runName = 'compare-cmp'",
    )[0]
    assert compare_run.data.metrics["compare/sft/test_accuracy_mean"] == sft_acc


def test_manifest_paths_move_with_their_folder(tmp_path):
    """A manifest read where it was not written: the paths under its run folder move with it, every
    other path stays (a model beside the project, another run); one found at another place within
    its run moves its own folder's paths only; one written before manifests said where is as it was."""
    from grpo_core.manifests import read_manifest, write_manifest

    run, new_run = tmp_path / "a" / "proj" / "runs" / "demo", tmp_path / "b" / "proj" / "runs" / "demo"
    outside = [str(tmp_path / "a" / "proj" / "models" / "m"), str(tmp_path / "a" / "proj" / "runs" / "demo2"), "/opt/m"]
    write_manifest(
        run / "sft", {"model": str(run / "sft" / "model"), "data": [str(run / "data")], "outside": outside, "n": 3}, run
    )
    shutil.copytree(run, new_run)
    got = read_manifest(new_run / "sft" / "manifest.json")
    assert got["model"] == str(new_run / "sft" / "model") and got["data"] == [str(new_run / "data")]
    assert got["outside"] == outside and got["n"] == 3 and got["run_folder"] == str(new_run)
    assert read_manifest(run / "sft" / "manifest.json")["model"] == str(run / "sft" / "model")
    shutil.copytree(run / "sft", tmp_path / "c" / "renamed")
    got = read_manifest(tmp_path / "c" / "renamed" / "manifest.json")
    assert got["model"] == str(tmp_path / "c" / "renamed" / "model") and got["data"] == [str(run / "data")]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "manifest.json").write_text(json.dumps({"model": str(run / "x")}))
    assert read_manifest(tmp_path / "old" / "manifest.json") == {"model": str(run / "x")}

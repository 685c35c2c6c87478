"""The §5 study flow on a tiny recipe with 2 seeds: every variant's runs, the table with its paired
intervals, the two-round variant's PRM retraining, peak memory from stages in processes of their own,
the figures on disk, in MLflow and in the Prefect artifact; and the study's figures from a hand-made
manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.flows.test_rounds import REWARD_MODELS

VARIANTS = ["continued-sft", "ppo", "prm-process", "prm-process-2-rounds"]


def test_study_flow_two_seeds(prefect_harness, tmp_path, tiny_cfg, monkeypatch):
    import grpo_core.rewards.labels as reward_data_mod
    from mlflow.tracking import MlflowClient
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.pipeline import pipeline
    from flows.experiment import experiment
    from grpo_core.stages.sft import continued

    monkeypatch.setattr(reward_data_mod, "is_correct", lambda text, gold: sum(map(ord, text)) % 2 == 1)
    cfg = tiny_cfg(
        tmp_path,
        "grpo.reward_weights={prm: 1.0, rule: 1.0}",
        run_name="st",
        grpo__supervision="process",
        **REWARD_MODELS,
    )
    manifest = pipeline(cfg)
    run_dir = tmp_path / "runs" / "st"
    out = experiment(
        str(run_dir), "study", VARIANTS, seeds=2, seconds=3, steps=2, samples=2, sample_questions=4, eval_every=1
    )

    # Continued SFT goes on at the lr SFT ended with (from the manifest, or its last checkpoint).
    sft = manifest["stages"]["sft"]
    no_record = {k: v for k, v in sft.items() if k != "final_lr"}
    assert continued(cfg, sft).sft.lr == sft["final_lr"] == continued(cfg, no_record).sft.lr
    assert continued(cfg, {"final_lr": 2.5e-4}).sft.lr == 2.5e-4
    resolved = yaml.safe_load((Path(out["dir"]) / "continued-sft" / "seed-0" / "resolved.yaml").read_text())
    assert resolved["sft"]["lr"] == sft["final_lr"] and resolved["launch"]["own_process"]
    rows = {r["variant"]: r for r in out["rows"]}
    assert list(rows) == ["sft", *VARIANTS]
    sft_acc = rows["sft"]["test_accuracy_mean"]
    for name in VARIANTS:
        row = rows[name]
        assert row["seeds"] == 2 and len(row["per_seed"]) == 2
        assert row["gain_over_sft"] == pytest.approx(row["test_accuracy_mean"] - sft_acc, abs=1e-4)
        assert 0 <= row["maj@2_mean"] <= 1 and 0 <= row["pass@2_mean"] <= 1
        assert row["peak_rss_mib_mean"] > 50  # a torch process of its own, measured there
        assert row["steps_per_s_mean"] > 0
    assert "gain_over_continued-sft" in rows["ppo"] and "gain_over_prm-process" in rows["prm-process-2-rounds"]
    # Equal samples: 2 GRPO steps per RL run, split 1 + 1 over the two rounds.
    runs = out["runs"]
    assert [r["steps"] for r in runs["ppo"]] == [2, 2] and [r["steps"] for r in runs["prm-process-2-rounds"]] == [2, 2]
    assert [r["seed"] for r in runs["ppo"]] == [cfg.seed, cfg.seed + 1]
    # Curves against training time; the two-round one runs on after round 1's time.
    two = runs["prm-process-2-rounds"][0]
    times = [t for t, _ in two["curve"]]
    assert times == sorted(times) and len(times) >= 4 and two["extra_s"] > 0
    assert out["dir"] == str(run_dir / "study" / "steps-2-eval1")
    seed_dir = Path(out["dir"]) / "prm-process-2-rounds" / "seed-0"
    prm = json.loads((seed_dir / "round-2" / "prm" / "manifest.json").read_text())
    assert prm["replay"]["share"] > 0  # retrained on fresh samples plus a replay of the run's round-1 data
    g2 = json.loads((seed_dir / "round-2" / "grpo" / "manifest.json").read_text())
    [g1] = (Path(out["dir"]) / "round-1").glob("grpo-*/seed-0")  # round 1 in the folder variants share
    assert g2["init"] == str(g1 / "model") and "rss_mib" in g2["peak_memory"]
    assert g2["steps"] == 1 and 0 < g2["train_s"] <= g2["wall_s"]  # evaluations are not training time
    # The report: manifest, figures, MLflow run, Prefect artifact.
    assert json.loads((Path(out["dir"]) / "manifest.json").read_text())["rows"] == out["rows"]
    # Where a learned reward drives GRPO, every step records it beside the checker's accuracy.
    assert all({"accuracy", "prm_lowest_mean"} <= set(p) for p in two["rewards"]) and len(two["rewards"]) == 2
    reward_times = [p["elapsed_s"] for p in two["rewards"]]  # each step's end, round 2's after round 1's
    assert 0 < reward_times[0] < reward_times[1] <= two["train_s"] + 0.01
    assert set(out["figures"]) == {"accuracy_over_time", "sampling", "memory", "reward_hacking"}
    for path in out["figures"].values():
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    client = MlflowClient(manifest["tracking_uri"])
    run = client.get_run(out["mlflow_run_id"])
    assert run.info.run_name == "study-st" and run.info.status == "FINISHED"
    assert {f.path for f in client.list_artifacts(run.info.run_id, "figures")} == {
        f"figures/{n}.png" for n in out["figures"]
    }
    with get_client(sync_client=True) as prefect:
        [artifact] = prefect.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["study-st"]))
        )
    assert "| prm-process-2-rounds | 2 |" in artifact.data and artifact.data.count("data:image/png;base64,") == 4
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "study.json", str(tmp_path))).read_text())
    assert {"gain_over_prm-process", "peak_rss_mib_mean"} <= set(table["columns"])  # not just the SFT row's
    with pytest.raises(ValueError, match="unknown study variant"):
        experiment(str(run_dir), "study", ["reinforce"], seeds=1)
    with pytest.raises(ValueError, match="at least 2 GRPO steps"):
        experiment(str(run_dir), "study", ["prm-process-2-rounds"], seeds=1, steps=1)


def test_study_figures_from_a_manifest(tmp_path):
    """The figures draw from the manifest alone: curves of unequal length, a missing seed value, K."""
    from grpo_core import figures

    run = {
        "seed": 0,
        "model": {"path": "m", "digest": "d"},
        "train_s": 10.0,
        "steps": 4,
        "extra_s": 0.0,
        "peak_memory": {"rss_mib": 600.0},
        "curve": [[0.0, 0.5], [4.0, 0.6], [10.0, 0.7]],
    }
    short = run | {"seed": 1, "curve": [[0.0, 0.5], [6.0, 0.55]]}
    row = {
        "test_accuracy_mean": 0.6,
        "test_accuracy_std": 0.01,
        "maj@4_mean": 0.62,
        "maj@4_std": 0.01,
        "pass@4_mean": 0.8,
        "pass@4_std": 0.02,
        "steps_per_s_mean": 0.4,
        "peak_rss_mib_mean": 600.0,
    }
    study = {
        "run_name": "x",
        "seeds": 2,
        "samples": 4,
        "n_sampled": 10,
        "sft_val_accuracy": 0.5,
        "budget": {"seconds": 10.0, "steps": None},
        "runs": {"grpo": [run, short], "continued-sft": [run, run]},
        "rows": [
            {
                "variant": "sft",
                "test_accuracy_mean": 0.5,
                "test_accuracy_std": 0.0,
                "maj@4_mean": 0.55,
                "pass@4_mean": 0.7,
            },
            row | {"variant": "grpo"},
            row | {"variant": "continued-sft"},
        ],
    }
    assert figures._at([(0.0, 0.5), (4.0, 0.6)], [0.0, 3.9, 4.0, 9.0]) == [0.5, 0.5, 0.6, 0.6]
    assert figures._at([(2.0, 0.5)], [1.0])[0] != figures._at([(2.0, 0.5)], [1.0])[0]  # NaN before the first
    paths = figures.save(figures.study_figures(study), tmp_path)
    assert set(paths) == {"accuracy_over_time", "sampling", "memory"} and all(
        p.stat().st_size > 1000 for p in paths.values()
    )
    # A variant on a learned reward adds the checker against that reward; rule-only steps have none.
    rewards = [{"elapsed_s": t, "accuracy": 0.5 + t / 100, "orm_mean": 0.6 + t / 50} for t in (0.0, 3.0, 7.0)]
    study["runs"]["orm"] = [run | {"rewards": rewards}, short | {"rewards": rewards[:2]}]
    study["runs"]["grpo"] = [r | {"rewards": [{"elapsed_s": 0.0, "accuracy": 0.5}]} for r in study["runs"]["grpo"]]
    study["rows"].append(row | {"variant": "orm"})
    drawn = figures.study_figures(study)
    assert set(drawn) == {"accuracy_over_time", "sampling", "memory", "reward_hacking"}
    assert [ax.get_title() for ax in drawn["reward_hacking"].axes] == ["orm"]
    figures.save(drawn, tmp_path)
    # On a budget of steps the axis is the runs' steps, not their seconds (which the machine's load sets);
    # a run without its steps (an older manifest) keeps the seconds axis.
    (ax,) = drawn["accuracy_over_time"].axes
    assert ax.get_xlabel().startswith("training seconds") and max(ax.lines[0].get_xdata()) == 10.0
    study["budget"] = {"seconds": None, "steps": 40}
    for runs in study["runs"].values():
        runs[:] = [r | {"curve_steps": [0, 16, 40][: len(r["curve"])]} for r in runs]
    (ax,) = figures.accuracy_over_time_figure(study).axes
    assert ax.get_xlabel().startswith("training steps") and max(ax.lines[0].get_xdata()) == 40.0
    del study["runs"]["orm"][0]["curve_steps"]
    (ax,) = figures.accuracy_over_time_figure(study).axes
    assert ax.get_xlabel().startswith("training seconds")


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "manifest.json: run the pipeline first"),
        (["--variants", "ppo,reinforce"], "--variants: unknown reinforce; choose from continued-sft"),
        (["--steps", "0"], "--steps 0: must be at least 1"),
        (["--sample-questions", "0"], "--sample-questions 0: must be at least 1"),
        (["--seconds", "-1"], "--seconds -1.0: must be positive"),
    ],
)
def test_study_command_rejects_bad_input_before_any_work(tmp_path, capsys, args, message):
    from flows.cli import main

    run = tmp_path / "run"
    run.mkdir()
    if args:
        (run / "manifest.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["study", str(run), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err

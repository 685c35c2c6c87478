"""Iterative RL rounds end to end on a tiny recipe: what each round starts from, the replay buffer's
versions and the replay in each retraining set, MLflow round runs and the model registry, Prefect
artifacts, and ``rl_rounds`` continuing a finished run without redoing its rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REWARD_MODELS = dict(
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
    sft__max_steps=2,
    grpo__max_steps=1,
)


@pytest.fixture
def mixed_checker(monkeypatch):
    # An untrained tiny policy is never right; a parity "checker" gives the mixed groups that pairs
    # and step labels need.
    import grpo_core.rewards.labels as reward_data_mod

    monkeypatch.setattr(reward_data_mod, "is_correct", lambda text, gold: sum(map(ord, text)) % 2 == 1)


def test_three_rounds_chain_policies_reward_models_and_replay(prefect_harness, tmp_path, tiny_cfg, mixed_checker):
    from datasets import load_from_disk
    from mlflow.tracking import MlflowClient

    from flows.pipeline import pipeline
    from grpo_core.rewards.replay import ORIGIN

    cfg = tiny_cfg(
        tmp_path,
        "grpo.reward_weights={orm: 1.0, rule: 1.0}",
        run_name="iter",
        rounds__count=3,
        rounds__replay_fraction=0.5,
        **REWARD_MODELS,
    )
    manifest = pipeline(cfg)
    run_dir = tmp_path / "runs" / "iter"
    rounds = manifest["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert manifest["policy"] == rounds[-1]["policy"] == str(run_dir / "round-3" / "grpo" / "model")
    assert manifest["reward_models"] == {k: str(run_dir / "round-3" / k / "model") for k in ("orm", "prm")}

    for k, r in enumerate(rounds, start=1):
        stages = r["stages"]
        # ref <- policy: round k's GRPO starts (and takes its reference) from round k-1's policy.
        assert stages["grpo"]["init"] == (manifest["sft_model"] if k == 1 else rounds[k - 2]["policy"])
        assert stages["reward_data"]["round"] == k
        for kind in ("orm", "prm"):
            rm = stages[kind]
            # Continued from last round's reward model (round 1: from the SFT checkpoint).
            assert rm["init"] == (manifest["sft_model"] if k == 1 else rounds[k - 2]["stages"][kind]["model"])
            mix = rm["replay"]
            assert set(r["reward_models"][kind]["before"]) == set(r["reward_models"][kind]["after"])
            if k == 1:
                assert mix["replay"] == 0 and mix["share"] == 0.0
            else:
                # Fraction 0.5: as many replayed rows as fresh ones, or all of version k-1 if it
                # holds fewer; each from an earlier round.
                name = "solutions" if kind == "orm" else "steps"  # the ORM's default: pointwise
                history = load_from_disk(str(run_dir / "replay" / f"v{k - 1}" / name))
                assert mix["replay_wanted"] == mix["fresh"]
                assert mix["replay"] == min(mix["replay_wanted"], len(history)) > 0
                if len(history) >= mix["replay_wanted"]:
                    assert mix["share"] == 0.5
                assert sum(mix["by_round"].values()) == mix["replay"]
                assert set(map(int, mix["by_round"])) <= set(range(1, k))
        assert 0.0 <= r["test_accuracy"] <= 1.0 and r["model_version"] == str(k)
        # Round k against round k-1 on the same test questions, with its interval (none for round 1).
        gain = r["minus_previous_round"]
        if k == 1:
            assert gain is None
        else:
            assert gain["mean"] == pytest.approx(r["test_accuracy"] - rounds[k - 2]["test_accuracy"])
            assert gain["low"] <= gain["mean"] <= gain["high"]
    # Round 2's reward data was sampled from round 1's policy, on other questions than round 1's.
    assert rounds[1]["stages"]["reward_data"]["round"] == 2
    q1 = set(load_from_disk(str(run_dir / "round-1" / "reward_data" / "solutions"))["train"]["prompt"])
    q2 = set(load_from_disk(str(run_dir / "round-2" / "reward_data" / "solutions"))["train"]["prompt"])
    assert q1 != q2
    # ... plus round 1's GRPO rollouts of training questions, as samples of round 1 (origin 1).
    from grpo_core.rewards.rollout_log import read_logs

    assert rounds[1]["stages"]["reward_data"]["rollouts_from"] == str(run_dir / "round-1" / "grpo")
    train2 = load_from_disk(str(run_dir / "round-2" / "reward_data" / "solutions"))["train"]
    from_rollouts = [r for r in train2 if r[ORIGIN] == 1]
    heldout1 = set(load_from_disk(str(run_dir / "round-1" / "reward_data" / "solutions"))["test"]["prompt"])
    logged = [r for r in read_logs(run_dir / "round-1" / "grpo")]
    assert len(logged) == cfg.grpo.questions_per_step * cfg.grpo.group_size  # one step
    assert 0 < len(from_rollouts) <= len(logged)
    assert all(r["prompt"] not in heldout1 for r in from_rollouts)

    # Held-out questions are the same share of the pool in every round: never trained on, in any round.
    trained, heldout = set(), set()
    for k in (1, 2, 3):
        for name in ("pairs", "steps", "solutions"):
            data = load_from_disk(str(run_dir / f"round-{k}" / "reward_data" / name))
            trained |= set(data["train"]["prompt"])
            heldout |= set(data["test"]["prompt"])
    assert heldout and trained and not heldout & trained

    # ---- the buffer: version k holds the training rows of rounds 1..k, tagged with their round
    for k in (1, 2, 3):
        version = run_dir / "replay" / f"v{k}"
        pairs = load_from_disk(str(version / "pairs"))
        fresh = [
            len(load_from_disk(str(run_dir / f"round-{j}" / "reward_data" / "pairs"))["train"]) for j in range(1, k + 1)
        ]
        assert len(pairs) == sum(fresh)
        assert set(pairs[ORIGIN]) <= set(range(1, k + 1))
        assert json.loads((version / "manifest.json").read_text())["round"] == k

    # ---- MLflow: round runs under the parent with their stages nested; registry and champion
    client = MlflowClient(cfg.tracking.tracking_uri)
    parent = client.get_run(manifest["mlflow_run_id"])
    exp = [parent.info.experiment_id]
    round_runs = {
        r.info.run_name: r
        for r in client.search_runs(
            exp, filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.round != ''"
        )
    }
    assert sorted(round_runs) == ["round-1", "round-2", "round-3"]
    nested = {
        r.info.run_name
        for r in client.search_runs(
            exp, filter_string=f"tags.mlflow.parentRunId = '{round_runs['round-2'].info.run_id}'"
        )
    }
    assert nested == {f"round-2/{s}" for s in ("reward_data", "replay", "orm", "prm", "grpo", "eval")}
    metrics = round_runs["round-2"].data.metrics
    for key in (
        "round/test_accuracy",
        "rm/orm/before/auc",
        "rm/orm/after/auc",
        "rm/orm/quality_gate_passed",
        "rm/orm/after/within_question_auc",
        "rm/orm/baseline/within_question_auc",
        "rm/prm/before/step_accuracy",
        "rm/prm/baseline/step_auc",
        "rm/orm/replay_share",
    ):
        assert key in metrics, key
    orm_run = client.get_run(round_runs["round-2"].data.tags["stage_run.orm"])
    inputs = {d.dataset.name for d in orm_run.inputs.dataset_inputs}
    assert inputs == {"reward_data/solutions", "replay/v1/solutions"}
    # The ORM drives GRPO here; a tiny untrained model is near chance, and the round says so.
    gate = rounds[1]["reward_models"]["orm"]["quality_gate"]
    assert round_runs["round-2"].data.tags["quality_gate"] == (
        "passed" if gate["passed"] else "FAILED: " + "; ".join(rounds[1]["quality_warnings"])
    )
    history = client.get_metric_history(parent.info.run_id, "round/test_accuracy")
    assert sorted(m.step for m in history) == [1, 2, 3]

    name = "iter-policy"
    versions = client.search_model_versions(f"name='{name}'")
    assert sorted(int(v.version) for v in versions) == [1, 2, 3]
    champion = client.get_model_version_by_alias(name, "champion")
    best = max(r["val_accuracy"] for r in rounds)
    assert float(champion.tags["val_accuracy"]) == pytest.approx(best, abs=1e-6)
    assert manifest["champion"]["version"] == str(champion.version)
    assert champion.run_id == rounds[int(champion.tags["round"]) - 1]["mlflow_run_id"]

    # ---- a Prefect artifact per round
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="iter-round-")))
    assert {a.key for a in artifacts} == {"iter-round-1", "iter-round-2", "iter-round-3"}
    report = next(a for a in artifacts if a.key == "iter-round-2").data
    assert "ORM within_question_auc on fresh samples: before -> after" in report and "champion" in report
    assert ("Warning: ORM held-out" in report) == (not gate["passed"])


def test_rl_rounds_continues_a_finished_run(prefect_harness, tmp_path, tiny_cfg, mixed_checker):
    from mlflow.tracking import MlflowClient

    from flows.pipeline import pipeline, rl_rounds

    cfg = tiny_cfg(
        tmp_path, "grpo.reward_weights={prm: 1.0}", run_name="more", grpo__supervision="process", **REWARD_MODELS
    )
    first = pipeline(cfg)
    run_dir = tmp_path / "runs" / "more"
    mtime = (run_dir / "round-1" / "grpo" / "model" / "model.safetensors").stat().st_mtime_ns
    # Marked seconds for the stages the next call reuses: a tiny stage runs as fast as a cache hit (the
    # data stage took 0.05 s on a fast CI machine), so only a value no run measures shows which one is kept.
    manifest = json.loads((run_dir / "manifest.json").read_text())
    reused = ("data", "sft", "round-1/grpo", "round-1/reward_data")
    marked = {stage: 100.0 + i for i, stage in enumerate(reused)}
    manifest["profile"]["stages_s"] |= marked
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    more = rl_rounds(str(run_dir), rounds=1)
    assert [r["round"] for r in more["rounds"]] == [1, 2]
    assert sorted(more["rounds"][0]["cached_stages"]) == ["eval", "grpo", "orm", "prm", "replay", "reward_data"]
    assert more["rounds"][1]["cached_stages"] == []
    # The stages it reused keep the seconds they took when they ran, not the cache hit's.
    assert {stage: more["profile"]["stages_s"][stage] for stage in reused} == marked
    assert (run_dir / "round-1" / "grpo" / "model" / "model.safetensors").stat().st_mtime_ns == mtime
    assert more["rounds"][0]["model_version"] == first["rounds"][0]["model_version"] == "1"
    assert more["rounds"][1]["model_version"] == "2"
    assert json.loads((run_dir / "manifest.json").read_text())["policy"].endswith("round-2/grpo/model")
    run = MlflowClient(cfg.tracking.tracking_uri).get_run(more["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "more: to round 2" and run.data.tags["continues"] == first["mlflow_run_id"]


def test_rl_rounds_needs_a_finished_run(prefect_harness, tmp_path):
    from flows.pipeline import rl_rounds

    with pytest.raises(FileNotFoundError, match="not a finished run"):
        rl_rounds(str(tmp_path / "nothing"), rounds=1)


def test_a_reward_model_near_chance_that_drives_grpo_is_reported_loudly(tiny_cfg, tmp_path):
    from flows.reports import round_report
    from grpo_core.rewards.gate import gate_grpo

    summary = {
        "round": 2,
        "test_accuracy": 0.5,
        "val_accuracy": 0.5,
        "grpo": {"steps": 3, "wall_s": 1.0, "best_step": 3, "reward_mean": 0.5, "kl": 0.0},
        "reward_models": {
            "orm": {
                "before": {"within_question_auc": 0.5},
                "after": {"within_question_auc": 0.55},
                "baseline": {"within_question_auc": 0.8},
                "replay": {"share": 0.1},
                "quality_gate": {
                    "metric": "within_question_auc",
                    "value": 0.55,
                    "threshold": 0.6,
                    "baseline": 0.8,
                    "beats_baseline": False,
                    "passed": False,
                },
            },
            "prm": {
                "before": {"within_question_auc": 0.9},
                "after": {"within_question_auc": 0.7},
                "baseline": {"within_question_auc": 0.85},
                "replay": {"share": 0.1},
                "quality_gate": {
                    "metric": "within_question_auc",
                    "value": 0.7,
                    "threshold": 0.6,
                    "baseline": 0.85,
                    "beats_baseline": False,
                    "passed": False,
                },
            },
        },
    }
    gates = {kind: rm["quality_gate"] for kind, rm in summary["reward_models"].items()}
    assert gate_grpo(tiny_cfg(tmp_path), gates).failures == []  # near chance, but driving nothing (rule only)
    drives = tiny_cfg(
        tmp_path,
        "grpo.reward_weights={rule: 1.0, orm: 0.5, prm: 1.0}",
        grpo__supervision="process",
        orm__train=True,
        prm__train=True,
    )
    gated = gate_grpo(drives, gates)
    assert gated.cfg is drives and gated.excluded == []  # rounds.on_gate_failure: report (the default) uses them
    warnings = gated.failures
    assert warnings == [
        "ORM held-out within_question_auc 0.550 < 0.6 and no better than the zero-training verifier (the SFT "
        "model's own likelihood: 0.800): GRPO's group-normalised reward ranks one question's solutions by it",
        "PRM held-out no better than the zero-training verifier (the SFT model's own likelihood: 0.850): GRPO's "
        "group-normalised reward ranks one question's solutions by it",
    ]
    report = round_report({**summary, "quality_warnings": warnings}, {"version": "2", "round": 2}, "http://x")
    lines = report.splitlines()
    assert lines[2].startswith("> **Warning: ORM held-out within_question_auc 0.550 < 0.6")
    assert (
        "| ORM within_question_auc on fresh samples: before -> after retraining | 0.5000 -> 0.5500 (replay share "
        "0.100; the SFT model's own likelihood, untrained: 0.8000) |"
    ) in report


def test_a_reward_model_that_fails_its_gate_can_be_kept_out_of_grpos_reward(tiny_cfg, tmp_path):
    """rounds.on_gate_failure: exclude: the round's GRPO runs without it (process supervision falls
    back to outcome without the PRM); with nothing left to drive GRPO, a clear error."""
    from flows.reports import round_report
    from grpo_core.rewards.gate import gate_grpo

    cfg = tiny_cfg(
        tmp_path,
        "grpo.reward_weights={rule: 1.0, orm: 0.5, prm: 1.0}",
        grpo__supervision="process",
        grpo__process_credit="min",
        rounds__on_gate_failure="exclude",
        orm__train=True,
        prm__train=True,
    )
    passed, failed = (
        {"passed": True},
        {"metric": "within_question_auc", "value": 0.5, "threshold": 0.6, "passed": False},
    )
    assert gate_grpo(cfg, {"orm": passed, "prm": passed}) == (cfg, [], [])
    no_orm = gate_grpo(cfg, {"orm": failed, "prm": passed})
    assert no_orm.excluded == ["orm"] and no_orm.failures[0].startswith("ORM held-out within_question_auc 0.500 < 0.6")
    assert no_orm.cfg.grpo.reward_weights == {"rule": 1.0, "prm": 1.0} and no_orm.cfg.grpo.supervision == "process"
    no_prm = gate_grpo(cfg, {"orm": passed, "prm": failed}).cfg.grpo
    assert no_prm.reward_weights == {"rule": 1.0, "orm": 0.5} and no_prm.supervision == "outcome"
    assert (
        no_orm.cfg.grpo.process_credit == "min" and no_prm.process_credit == "centred"
    )  # the default: outcome supervision refuses another
    only_prm = tiny_cfg(
        tmp_path,
        "grpo.reward_weights={prm: 1.0}",
        grpo__supervision="process",
        prm__train=True,
        rounds__on_gate_failure="exclude",
    )
    with pytest.raises(ValueError, match="nothing is left to drive GRPO"):
        gate_grpo(only_prm, {"prm": failed})
    summary = {
        "round": 1,
        "test_accuracy": 0.5,
        "val_accuracy": 0.5,
        "reward_models": {},
        "grpo": {"steps": 1, "wall_s": 1.0, "best_step": 1},
        "excluded_reward_models": ["prm"],
    }
    assert "Kept out of this round's GRPO reward (rounds.on_gate_failure: exclude): PRM." in round_report(
        summary, {"version": "1", "round": 1}, "http://x"
    )


@pytest.mark.parametrize("curriculum, stages", [(0.0, []), (0.5, ["reward_data"])])
def test_a_curriculum_alone_samples_the_reward_data_for_its_pass_rates(
    tiny_cfg, tmp_path, monkeypatch, curriculum, stages
):
    """No reward model trained: reward_data runs only where GRPO's curriculum needs pass rates (no replay)."""
    import flows.rounds as rounds
    from grpo_core.manifests import Ref

    ran = []
    monkeypatch.setattr(rounds, "run_stage", lambda task, cfg, out, inputs, **kw: ran.append(inputs.stage))
    cfg = tiny_cfg(tmp_path, grpo__curriculum=curriculum)
    ref = Ref(path="p", digest="d")
    rounds.reward_stages(cfg, 1, tmp_path / "round-1", tmp_path, ref, ref, rounds.RoundStart(policy=ref), {})
    assert ran == stages


def test_run_and_rounds_end_with_a_table_a_person_reads():
    """Each round's test accuracy, against SFT and against the round before in points with the
    interval, the champion marked, what came from the cache, where the details are."""
    from flows.reports import terminal_report

    manifest = {
        "run_name": "demo",
        "eval": {"sft": {"accuracy": 0.832, "n": 2000}},
        "cached_stages": ["data", "sft"],
        "rounds": [
            {"round": 1, "test_accuracy": 0.8635, "cached_stages": ["grpo"]},
            {"round": 2, "test_accuracy": 0.879, "minus_previous_round": {"mean": 0.0155, "low": 0.009, "high": 0.022}},
        ],
        "champion": {"version": "2", "name": "demo-policy", "round": 2, "val_accuracy": 0.92},
    }
    gains = {
        1: {"test": {"mean": 0.0315, "low": 0.021, "high": 0.042}},
        2: {"test": {"mean": 0.047, "low": 0.036, "high": 0.058}},
    }
    assert terminal_report(manifest, gains, Path("runs/demo/manifest.json")).splitlines() == [
        "demo: 2 RL round(s) after SFT",
        "model               test (2,000 q)  minus SFT (95%)            minus previous round (95%)",
        "SFT                 83.20%",
        "round 1             86.35%          +3.15 points [+2.1, +4.2]",
        "round 2 (champion)  87.90%          +4.70 points [+3.6, +5.8]  +1.55 points [+0.9, +2.2]",
        "",
        "champion: version 2 of demo-policy (round 2, validation 92.00%)",
        "from the cache: data, round-1/grpo, sft",
        "details: runs/demo/manifest.json (--json prints the summary as JSON)",
    ]


def test_a_gate_on_too_few_mixed_held_out_questions_is_undecided_and_says_so():
    """min_questions: a good AUC on 12 mixed questions is no verdict (the gate fails as undecided, with
    its own sentence); 30 of them decide it; 0 (the default) leaves the gate as it was."""
    from grpo_core.rewards.gate import gate_failure, quality_gate

    few = {"within_question_auc": 0.8, "mixed_questions": 12.0}
    gate = quality_gate("within_question_auc", few, 0.6, {"within_question_auc": 0.7}, min_questions=30)
    assert gate["passed"] is False and gate["undecided"] and gate["beats_baseline"]
    assert gate_failure("prm", gate) == (
        "PRM undecided: held-out too small (12 questions with right and wrong solutions, fewer than 30)"
    )
    low = quality_gate("within_question_auc", few | {"within_question_auc": 0.5}, 0.6, None, min_questions=30)
    assert gate_failure("orm", low).startswith("ORM undecided: held-out too small (12 questions") and (
        "; ORM held-out within_question_auc 0.500 < 0.6" in gate_failure("orm", low)
    )
    enough = quality_gate("within_question_auc", few | {"mixed_questions": 30.0}, 0.6, None, min_questions=30)
    assert enough["passed"] is True and "undecided" not in enough
    assert quality_gate("within_question_auc", few, 0.6, None)["passed"] is True

"""The ``iterate`` preset: every arm trains the same GRPO steps in the recipe's rounds; only what
happens to the reward models between rounds differs (frozen, retrained with the recipe's replay
share, without replay, half replayed); its rows carry paired intervals against ``frozen``. Checked
on the arms' recipes and on the stages they would run (recorded, not trained)."""

from __future__ import annotations

import json

import pytest
import yaml

from flows.variants import EQUAL_LABELS, FROZEN, PRESETS, RETRAINED

ARMS = PRESETS["iterate"].variants


def _finished_run(tmp_path, tiny_cfg, **recipe):
    run = tmp_path / "run"
    run.mkdir(parents=True)
    cfg = tiny_cfg(
        tmp_path,
        grpo__reward_weights={"orm": 1.0},
        grpo__max_steps=7,
        grpo__curriculum=0.0,
        orm__train=True,
        rounds__count=2,
        **recipe,
    )
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    model = {"model": str(run / "model"), "digest": "d"}
    grpo = {"stage": "grpo", **model, "best_val_accuracy": 0.5, "best_step": 3, "train_s": 10.0, "wall_s": 15.0}
    manifest = {
        "stages": {"sft": {"final_lr": 1e-4}, "data": {"stage": "data", "dir": str(run / "data"), "digest": "d"}},
        "rounds": [
            {
                "stages": {
                    "grpo": grpo,
                    "orm": {"stage": "orm", **model, "steps": 40},
                    "reward_data": {"stage": "reward_data", "dir": str(run / "rd"), "questions": 16},
                }
            }
        ],
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_every_arm_trains_the_recipes_steps_over_its_rounds(tmp_path, tiny_cfg):
    from flows.experiment_setup import setup

    s = setup(str(_finished_run(tmp_path, tiny_cfg)), "iterate", None, None, None, None)
    assert s.budget.steps == 14  # grpo.max_steps 7 x rounds.count 2, the default budget
    for name in ARMS:
        assert s.rounds(name) == 2
        steps = [s.config(name, 0, k).grpo.max_steps for k in (1, 2)]
        assert steps == [7, 7], name
        assert s.config(name, 0).grpo.reward_weights == {"orm": 1.0}  # the recipe's learned reward alone
    odd = setup(str(_finished_run(tmp_path / "b", tiny_cfg)), "iterate", None, None, 15, None)
    assert [odd.config(FROZEN, 0, k).grpo.max_steps for k in (1, 2)] == [7, 8]  # the last round takes the rest


class Recorder:
    """Stands in for the Prefect tasks: records each stage's recipe and inputs, returns a typed output."""

    def __init__(self):
        self.grpo, self.retrained = [], []

    def run_stage(self, task, cfg, out_dir, inputs, **common):
        from grpo_core.stages.outputs import GRPOOutput

        self.grpo.append((cfg, inputs))
        k = len(self.grpo)
        out = GRPOOutput(
            stage="grpo",
            model=f"{out_dir}/model",
            digest=f"policy-{k}",
            best_val_accuracy=0.5,
            best_step=1,
            train_s=2.0,
            wall_s=3.0,
            steps=cfg.grpo.max_steps,
            rollouts=out_dir,
            rewards=[{"step": i, "elapsed_s": float(i), "accuracy": 0.5} for i in range(cfg.grpo.max_steps)],
        )
        return type("StageRun", (), {"output": out})

    def reward_stages(self, cfg, k, round_dir, run_dir, data, sft, start, common):
        from grpo_core.stages.inputs import Ref

        self.retrained.append((cfg, k, start))
        stage = lambda ref, seconds, **extra: type(  # noqa: E731
            "StageRun",
            (),
            {
                "output": type(
                    "Out",
                    (),
                    {  # noqa: E731
                        "ref": Ref(path=ref, digest=ref),
                        "wall_s": seconds,
                        **extra,
                    },
                )
            },
        )
        return {  # a retraining: 16 questions' samples plus 40 GRPO rollouts, 30 updates
            "reward_data": stage("data", 4.0, pass_rates_ref=None, labelled=lambda k: 16 * k + 40),
            "replay": stage(f"buffer-{k}", 1.0),
            "orm": stage(f"orm-{k}", 6.0, quality_gate={}, steps=30),
        }


@pytest.mark.parametrize(
    "arm, replay", [(FROZEN, None), (RETRAINED, 0.1), ("retrained-no-replay", 0.0), ("retrained-replay-50", 0.5)]
)
def test_an_arm_retrains_only_what_it_says_with_its_replay_share(tmp_path, tiny_cfg, monkeypatch, arm, replay):
    import flows.experiment as experiment
    import flows.rounds as rounds

    s = experiment.setup(str(_finished_run(tmp_path, tiny_cfg)), "iterate", None, None, None, None)
    rec = Recorder()
    monkeypatch.setattr(experiment, "run_stage", rec.run_stage)
    monkeypatch.setattr(rounds, "run_stage", rec.run_stage)  # a round's GRPO (rounds.grpo_stage)
    monkeypatch.setattr(experiment, "reward_stages", rec.reward_stages)
    sft = experiment.Ref(path="sft", digest="sft")
    run = experiment.train_variant(s, arm, 0, tmp_path / "out", experiment.Ref(path="data", digest="d"), sft, {})

    assert run.steps == 14 and [cfg.grpo.max_steps for cfg, _ in rec.grpo] == [7, 7]
    (_, first), (_, second) = rec.grpo
    assert (first.init, first.round, second.round) == (sft, 1, 2)
    assert second.init.digest == "policy-1"  # round 2 from round 1's policy, its reference
    if replay is None:  # frozen: the round-1 ORM the whole way, nothing retrained
        assert rec.retrained == [] and second.reward_models == first.reward_models and run.extra_s == 0
        return
    ((cfg, k, start),) = rec.retrained
    assert (k, cfg.rounds.replay_fraction, cfg.orm.train, cfg.prm.train) == (2, replay, True, False)
    assert start.policy.digest == "policy-1" and start.reward_models == first.reward_models
    assert second.reward_models["orm"].digest == "orm-2"  # round 2 trains on the retrained ORM
    assert run.extra == {"reward_data": 4.0, "replay": 1.0, "orm": 6.0} and run.extra_s == 11.0
    # What its reward model was given in all: round 1's 16 questions x 8 samples, 40 updates, plus the retraining's.
    assert run.reward_model_updates == {"orm": 40 + 30} and run.reward_model_labels == 16 * 8 + (16 * 8 + 40)


def test_the_equal_labels_arm_differs_from_frozen_in_its_reward_models_labels_and_updates_alone(
    tmp_path, tiny_cfg, monkeypatch
):
    import flows.experiment as experiment
    import flows.rounds as rounds

    s = experiment.setup(str(_finished_run(tmp_path, tiny_cfg)), "iterate", None, None, None, None)
    rec = Recorder()
    monkeypatch.setattr(experiment, "run_stage", rec.run_stage)
    monkeypatch.setattr(rounds, "run_stage", rec.run_stage)  # a round's GRPO (rounds.grpo_stage)
    monkeypatch.setattr(experiment, "reward_stages", rec.reward_stages)
    data, sft = experiment.Ref(path="data", digest="d"), experiment.Ref(path="sft", digest="sft")
    retrained = experiment.train_variant(s, RETRAINED, 0, tmp_path / RETRAINED, data, sft, {})
    rec.retrained.clear()

    own = experiment.equal_label_reward_models(s, EQUAL_LABELS, retrained, tmp_path / "eq", data, sft, {})
    ((cfg, k, start),) = rec.retrained  # trained once, before RL, from the SFT model's samples
    assert (k, start.policy, start.reward_models) == (1, sft, {})
    assert cfg.reward_data.questions * 8 == retrained.reward_model_labels == 296  # 37 questions x 8 samples
    assert (cfg.orm.train, cfg.orm.max_steps, cfg.prm.train) == (True, 70, False)  # retrained's 40 + 30 updates
    # Besides what it trains its reward model on, its recipe is frozen's: the same GRPO, rounds and seed.
    assert cfg.model_copy(update={"reward_data": s.cfg.reward_data, "orm": s.cfg.orm}) == s.cfg.model_copy(
        update={"orm": s.cfg.orm.model_copy(update={"train": True})}
    )
    for k in (1, 2):
        assert s.config(EQUAL_LABELS, 0, k) == s.config(FROZEN, 0, k)

    rec.grpo.clear()
    eq = experiment.train_variant(
        s, EQUAL_LABELS, 0, tmp_path / "iterate" / EQUAL_LABELS / "seed-0", data, sft, {}, later=own
    )
    (_, first), (_, second) = rec.grpo
    assert rec.retrained == [(cfg, 1, start)]  # frozen: nothing retrained between its rounds
    # Round 1 on the round-1 ORM, as the retrained arm; from round 2 on its own, larger one.
    assert first.reward_models == {"orm": s.first["orm"].ref} and second.reward_models == {"orm": own["orm"].ref}
    assert eq.reward_model_updates == {"orm": 30}  # (the recorder's reward-model stage makes 30 updates)


def test_the_equal_labels_arm_is_refused_without_the_arm_it_is_matched_to(tmp_path, tiny_cfg):
    from flows.experiment_setup import setup

    with pytest.raises(ValueError, match=f"run it beside {RETRAINED}"):
        setup(str(_finished_run(tmp_path, tiny_cfg)), "iterate", [FROZEN, EQUAL_LABELS], None, None, None)


def test_one_runs_staleness_reads_the_loops_windows_of_22_and_23_steps():
    """``run_staleness``, what a committed seed records: the real-model loop's 45 steps as 22 + 23
    make windows of 11 (half the shorter round): steps 1-11, round 2's first 11 (23-33) and its last
    11 (35-45), each its own AUC and mixed groups, the checker's accuracy beside it."""
    from flows.experiment_table import run_staleness

    auc = [0.9] * 11 + [0.5] * 11 + [0.6] * 11 + [0.0] + [0.7] * 11  # steps 1-11, 12-22 | 23-33, 34, 35-45
    rewards = [
        {"step": i + 1, "round": 1 + (i >= 22), "accuracy": 0.25 + (i >= 22) * 0.5, "orm_mean": 0.5}
        | {"orm_within_auc": a, "orm_mixed_groups": 3.0 if i < 44 else 1.0}
        for i, a in enumerate(auc)
    ]
    got = run_staleness(rewards)
    assert got["orm_within_auc_start"] == pytest.approx(0.9) and got["orm_within_auc_middle"] == pytest.approx(0.6)
    # The last 11 steps: ten with 3 mixed groups and one with 1, all at 0.7; step 34 (AUC 0) in no window.
    assert got["orm_within_auc_end"] == pytest.approx(0.7) and got["orm_mixed_groups_end"] == 31
    assert (got["orm_mixed_groups_start"], got["orm_mixed_groups_middle"]) == (33, 33)
    assert (got["checker_accuracy_start"], got["checker_accuracy_end"]) == (0.25, 0.75)
    assert "prm_within_auc_start" not in got  # no PRM trained on: nothing said of one
    assert run_staleness([{k: v for k, v in r.items() if not k.startswith("orm_")} for r in rewards]) == {}


def test_rows_carry_paired_intervals_against_frozen_and_the_staleness(tmp_path, tiny_cfg):
    from flows.experiment_setup import Run, setup
    from flows.experiment_table import format_table, variant_row

    s = setup(str(_finished_run(tmp_path, tiny_cfg)), "iterate", None, None, None, None)

    def run(seed, aucs):  # one recorded step per AUC, 2 mixed groups each
        rewards = [
            {
                "step": i,
                "elapsed_s": float(i),
                "accuracy": 0.5,
                "orm_mean": 0.6,
                "orm_within_auc": a,
                "orm_mixed_groups": 2.0,
            }
            for i, a in enumerate(aucs)
        ]
        return Run(
            seed=seed,
            model={"path": "m", "digest": "d"},
            train_s=1.0,
            steps=len(aucs),
            peak_memory={},
            curve=[],
            rewards=rewards,
        )

    accs = {FROZEN: [0.50, 0.52, 0.55], RETRAINED: [0.53, 0.56, 0.57], "retrained-no-replay": [0.52, 0.52, 0.58]}
    runs = [run(i, [0.9] * 20 + [0.8] * 20 + [0.7] * 20) for i in range(3)]
    row = variant_row(s, "retrained-no-replay", runs, {}, 0.4, accs, 1)
    # Paired differences seed by seed: against frozen (0.02, 0.0, 0.03), mean 0.0167; against
    # retrained (-0.01, -0.04, 0.01), mean -0.0133.
    assert row["gain_over_frozen"] == pytest.approx(0.0167, abs=1e-4)
    assert row["gain_over_retrained"] == pytest.approx(-0.0133, abs=1e-4)
    low, high = row["gain_over_frozen_95ci"]
    assert low < row["gain_over_frozen"] < high
    # Windows of 20 steps: the first, the middle (steps 20-39) and the last, each with its mixed
    # groups over the seeds (20 steps x 2 x 3 seeds).
    assert (row["orm_within_auc_start_mean"], row["orm_within_auc_middle_mean"], row["orm_within_auc_end_mean"]) == (
        0.9,
        0.8,
        0.7,
    )
    assert row["orm_mixed_groups_middle"] == 120
    table = format_table({"samples": 1, "rows": [row]})
    assert "vs frozen (95% CI)" in table and "vs retrained (95% CI)" in table
    assert "0.900 (120), 0.800 (120), 0.700 (120)" in table
    # Two rounds of 30 steps: windows of 15 (half a round), the middle one round 2's first 15 steps
    # (10 at 0.6, 5 at 0.7), not steps 20-39 across the retraining, and apart from the last 15.
    two = [run(i, [0.9] * 30 + [0.6] * 10 + [0.7] * 20) for i in range(3)]
    for r in two:
        for i, p in enumerate(r.rewards):
            p["round"] = 1 + (i >= 30)
    row = variant_row(s, "retrained-no-replay", two, {}, 0.4, accs, 1)
    assert row["orm_within_auc_middle_mean"] == round(2 / 3 * 0.6 + 1 / 3 * 0.7, 4)  # the table rounds to 4
    assert row["orm_within_auc_start_mean"] == 0.9 and row["orm_within_auc_end_mean"] == pytest.approx(0.7)
    assert row["orm_mixed_groups_middle"] == 15 * 2 * 3
    assert "gain_over_frozen" not in variant_row(s, FROZEN, runs, {}, 0.4, accs, 1)
    # A policy that collapsed onto one solution per question leaves the last window without a mixed
    # group in every seed: no AUC there, and the table says so instead of failing.
    collapsed = [run(i, [0.9] * 40 + [None] * 20) for i in range(3)]
    for r in collapsed:
        for p in r.rewards[40:]:
            p.update(orm_within_auc=None, orm_mixed_groups=0.0)
    row = variant_row(s, "retrained-no-replay", collapsed, {}, 0.4, accs, 1)
    assert "orm_within_auc_end_mean" not in row and row["orm_within_auc_middle_mean"] == 0.9
    assert "0.900 (120), 0.900 (120), - (0)" in format_table({"samples": 1, "rows": [row]})


def test_a_variant_on_a_reward_model_that_failed_its_gate_says_so_in_its_row_and_report(tmp_path, tiny_cfg):
    from flows.experiment_setup import Run, setup
    from flows.experiment_table import report, variant_row
    from grpo_core.rewards.gate import gate_failure

    run_dir = _finished_run(tmp_path, tiny_cfg)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    gate = {"metric": "within_question_auc", "value": 0.5, "threshold": 0.6, "passed": False}
    manifest["rounds"][0]["stages"]["orm"] |= {
        "heldout": {"within_question_auc": 0.5, "auc": 0.52},
        "quality_gate": gate,
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    s = setup(str(run_dir), "iterate", None, None, None, None)
    runs = [Run(seed=0, model={"path": "m", "digest": "d"}, train_s=1.0, steps=1, peak_memory={}, curve=[], rewards=[])]
    row = variant_row(s, FROZEN, runs, {}, 0.4, {FROZEN: [0.5]}, 1)
    sentence = gate_failure("orm", gate)  # the rounds' own sentence (its wording: test_rounds.py)
    assert sentence and row["quality_warnings"] == [sentence]
    result = {
        "preset": "iterate",
        "run_name": "r",
        "budget": {"steps": 14, "seconds": None},
        "seeds": 1,
        "n_test": 10,
        "n_sampled": 0,
        "samples": 1,
        "rows": [row],
        "figures": {},
    }
    assert f"> **Warning ({FROZEN}): {sentence}.**" in report(result, "x")
    # Each seed its own reward models: two seeds whose models failed alike are two warnings, each naming its seed.
    two = runs + [runs[0].model_copy(update={"seed": s.cfg.seed + 1})]
    per_seed = variant_row(s, FROZEN, two, {}, 0.4, {FROZEN: [0.5, 0.5]}, 1, chains=[s.first, s.first])
    assert per_seed["quality_warnings"] == [f"seed 0: {sentence}", f"seed 1: {sentence}"]
    manifest["rounds"][0]["stages"]["orm"]["quality_gate"]["passed"] = True
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    passed = variant_row(
        setup(str(run_dir), "iterate", None, None, None, None), FROZEN, runs, {}, 0.4, {FROZEN: [0.5]}, 1
    )
    assert "quality_warnings" not in passed


def test_a_recipe_for_another_sft_model_is_refused_in_one_line(tmp_path, tiny_cfg):
    from flows.experiment_setup import setup

    run = _finished_run(tmp_path, tiny_cfg)
    recipe = yaml.safe_load((run / "config.yaml").read_text())
    recipe["grpo"]["max_steps"] = 9
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(recipe))
    s = setup(str(run), "iterate", None, None, None, None, recipe=str(tmp_path / "ok.yaml"))
    assert s.budget.steps == 18 and s.cfg.run_name == "tiny"
    recipe["sft"]["max_steps"] += 1
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(ValueError, match=r"other.yaml is not for the SFT model of .*: it sets sft.max_steps"):
        setup(str(run), "iterate", None, None, None, None, recipe=str(tmp_path / "other.yaml"))


def test_iterate_flow_on_a_tiny_run(prefect_harness, tmp_path, tiny_cfg, monkeypatch):
    """The preset end to end: round-1 ORM trained by the experiment from the run's SFT model under
    its recipe, frozen and retrained arms over two rounds, 2 seeds; the retrained arm's ORM really
    replays its share, the rows carry intervals and staleness, and the staleness figure is drawn."""
    import grpo_core.rewards.labels as reward_data_mod
    import grpo_core.rewards.scorer as scorer_mod

    from flows.experiment import experiment
    from flows.pipeline import pipeline
    from tests.flows.test_rounds import REWARD_MODELS

    parity = lambda text, gold: sum(map(ord, text)) % 2 == 1  # noqa: E731 - mixed groups from an untrained policy
    monkeypatch.setattr(reward_data_mod, "is_correct", parity)
    monkeypatch.setattr(scorer_mod, "is_correct", parity)
    cfg = tiny_cfg(tmp_path, run_name="it", **REWARD_MODELS)
    pipeline(cfg)
    run_dir = tmp_path / "runs" / "it"
    recipe = yaml.safe_load((run_dir / "config.yaml").read_text())
    recipe["grpo"] |= {"reward_weights": {"orm": 1.0}, "supervision": "outcome", "keep_best": False, "max_steps": 2}
    recipe["rounds"] |= {"count": 2, "replay_fraction": 0.5}
    recipe["prm"]["train"] = False
    (tmp_path / "regime.yaml").write_text(yaml.safe_dump(recipe))
    out = experiment(
        str(run_dir),
        "iterate",
        [FROZEN, EQUAL_LABELS, RETRAINED],  # the equal-labels arm runs after the arm it is matched to
        seeds=2,
        eval_every=1,
        recipe=str(tmp_path / "regime.yaml"),
    )

    assert out["dir"] == str(run_dir / "iterate" / "regime-steps-4-eval1") and out["budget"]["steps"] == 4
    rows = {r["variant"]: r for r in out["rows"]}
    assert [r["steps"] for rs in out["runs"].values() for r in rs] == [4] * 6  # 2 rounds x 2 steps, every arm
    low, high = rows[RETRAINED]["gain_over_frozen_95ci"]
    assert low <= rows[RETRAINED]["gain_over_frozen"] <= high
    assert 0 <= rows[FROZEN]["orm_within_auc_start_mean"] <= 1 and "orm_within_auc_end_mean" in rows[RETRAINED]
    assert rows[FROZEN]["extra_s_mean"] == 0 and rows[RETRAINED]["extra_orm_s_mean"] > 0
    seed = run_dir / "iterate" / "regime-steps-4-eval1" / RETRAINED / "seed-0"
    orm = json.loads((seed / "round-2" / "orm" / "manifest.json").read_text())
    # Each retrained ORM's quality gate, as the pipeline's rounds apply it, said in the arm's row.
    from grpo_core.rewards.gate import gate_failure

    gates = [
        json.loads((seed.parent / f"seed-{i}" / "round-2" / "orm" / "manifest.json").read_text())["quality_gate"]
        for i in (0, 1)
    ]
    said = [f"round 2, seed {i}: {f}" for i, g in enumerate(gates) if (f := gate_failure("orm", g))]
    assert [w for w in rows[RETRAINED].get("quality_warnings", []) if w.startswith("round ")] == said
    from grpo_core.rewards.replay import replay_size

    mix = orm["replay"]  # the recipe's replay share asked for, and drawn (as much as the history holds)
    assert mix["replay_wanted"] == replay_size(mix["fresh"], 0.5) > 0 and 0 < mix["replay"] <= mix["replay_wanted"]
    assert not (run_dir / "iterate" / "regime-steps-4-eval1" / FROZEN / "seed-0" / "round-2" / "orm").exists()
    g2 = json.loads((seed / "round-2" / "grpo" / "manifest.json").read_text())
    # Round 1 ran once per seed, shared by both arms (the same GRPO settings: they differ between rounds).
    [shared] = (run_dir / "iterate" / "regime-steps-4-eval1" / "round-1").glob("grpo-*/seed-0")
    assert g2["init"] == str(shared / "model") and g2["staleness"]["orm_within_auc"]
    assert [r["steps"] for r in out["runs"][FROZEN]] == [4, 4]
    # Frozen on as many labels (to a question's samples) and updates as retrained's ORM was given, seed by seed.
    for eq, re in zip(out["runs"][EQUAL_LABELS], out["runs"][RETRAINED]):
        assert eq["reward_model_updates"] == re["reward_model_updates"]
        assert (
            0 <= eq["reward_model_labels"] - re["reward_model_labels"] < recipe["reward_data"]["samples_per_question"]
        )
    assert "gain_over_frozen-equal-labels" in rows[RETRAINED]
    assert "staleness" in out["figures"]


def test_the_command_refuses_a_recipe_for_another_sft_model_before_any_flow_runs(tmp_path, tiny_cfg, capsys):
    from flows.cli import main

    run = _finished_run(tmp_path, tiny_cfg)
    recipe = yaml.safe_load((run / "config.yaml").read_text())
    recipe["data"]["arithmetic"]["max_operand"] = 20
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(recipe))
    for bad, said in ((tmp_path / "other.yaml", "data.arithmetic.max_operand"), (tmp_path / "nope.yaml", "nope.yaml")):
        with pytest.raises(SystemExit) as exc:
            main(["iterate", str(run), "--recipe", str(bad)])
        assert exc.value.code == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert said in line
    assert not (run / "iterate").exists()

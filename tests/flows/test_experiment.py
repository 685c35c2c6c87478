"""The experiment flow's presets (``compare``, ``study``, ``baseline``) give every variant the same
training seconds: what the run's GRPO trained (``train_s``), not its wall time (which counts its
evaluations); the baseline the sum over every round. Checked on each variant's recipe, without training."""

from __future__ import annotations

import json

import pytest
import yaml

from flows.variants import PRESETS, VARIANTS


def _finished_run(tmp_path, tiny_cfg):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(tiny_cfg(tmp_path).model_dump(mode="json")))
    model = {"model": str(run / "model"), "digest": "d"}
    grpo = [
        {"stage": "grpo", **model, "best_val_accuracy": 0.5, "best_step": 3, "train_s": t, "wall_s": w}
        for t, w in ((10.0, 15.0), (12.5, 19.0))
    ]  # wall time includes evaluations
    rms = {kind: {"stage": kind, **model} for kind in ("orm", "prm")}
    manifest = {"stages": {"sft": {"final_lr": 1e-4}}, "rounds": [{"stages": {"grpo": g, **rms}} for g in grpo]}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


@pytest.mark.parametrize("preset, seconds", [("compare", 10.0), ("study", 10.0), ("baseline", 22.5)])
def test_every_variant_trains_for_the_seconds_grpo_trained(tmp_path, tiny_cfg, preset, seconds):
    from flows.experiment_setup import setup  # imports prefect: after the test environment is set

    s = setup(str(_finished_run(tmp_path, tiny_cfg)), preset, list(VARIANTS), None, None, None)
    assert s.budget.seconds == seconds
    for name, variant in VARIANTS.items():
        if variant.grpo is None:  # continued SFT: its time budget, no early stop
            cfg = s.config(name, 0)
            assert (cfg.sft.max_seconds, cfg.sft.patience, cfg.sft.lr) == (seconds, 0, 1e-4), name
            continue
        rounds = [s.config(name, 0, k) for k in range(1, s.rounds(name) + 1)]
        assert sum(c.grpo.max_seconds for c in rounds) == pytest.approx(seconds), name  # two rounds share it
        assert all(c.grpo.max_steps >= 10**9 for c in rounds), name  # time decides, not steps
        assert rounds[0].launch.own_process == PRESETS[preset].own_process


@pytest.mark.parametrize("overrides", [None, ["grpo.redraws=2"]])  # the second: a recipe with dynamic sampling
def test_an_arm_differs_from_the_arms_it_is_compared_with_only_in_what_it_names(tmp_path, tiny_cfg, overrides):
    """Each ``against`` pair (the rows' paired gains): the arm's recipe differs from its control's
    only in ``grpo`` settings the arm names (e.g. a learned-reward arm keeps its control's dynamic
    sampling), PPO bringing its own section (``grpo.ppo``); rounds, retraining and replay are the
    variants' own fields. The §5 and sparse comparisons are among the pairs, and a sparse arm, a
    learned reward beside the checker and one learned reward alone against the other differ from
    their controls in the reward alone."""
    from flows.experiment_setup import setup
    from grpo_core.recipe import flatten

    s = setup(str(_finished_run(tmp_path, tiny_cfg)), "compare", None, None, 6, None, overrides=overrides)
    pairs = [(name, other) for name, v in VARIANTS.items() for other in v.against]
    section_5 = {("online-rft", "rft"), ("online-rft", "rule-outcome"), ("ppo", "rule-outcome")}
    section_5 |= {("prm-process", "orm-outcome"), ("prm-process-min-credit", "prm-process-paper")}
    section_5 |= {("prm-process-paper", "prm-process")}
    sparse = {("rule+orm", "dynamic"), ("rule+prm", "dynamic"), ("rule+oracle-prm", "dynamic")}
    # Beside the checker, with its draw; a learned reward alone against another, with theirs.
    sparse |= {("rule+orm-outcome", "rule-outcome"), ("rule+prm-process", "rule-outcome")}
    sparse |= {("prm-process", "orm-outcome")}
    assert section_5 | sparse | {("prm-process-2-rounds", "prm-process"), ("retrained", "frozen")} <= set(pairs)
    for name, other in pairs:
        mine, theirs = flatten(s.config(name, 0)), flatten(s.config(other, 0))
        named = {f"grpo.{k}" for k in VARIANTS[name].grpo or {}}
        if "grpo.algorithm" in named and mine["grpo.algorithm"] == "ppo":
            named.add("grpo.ppo")  # PPO's own settings (the value model, GAE) come with it
        if VARIANTS[name].rounds != VARIANTS[other].rounds:
            named |= {"grpo.max_steps", "grpo.max_seconds"}  # the budget shared over the rounds
        differ = {
            k.split(".")[0] + "." + k.split(".")[1] for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)
        }
        assert differ <= named, (name, other, differ)
        if (name, other) in sparse:  # the reward alone: dynamic sampling and the draw are the control's
            reward = {"grpo.reward_weights", "grpo.supervision", "grpo.prm_oracle"}
            assert "grpo.reward_weights" in differ and differ <= reward, differ


def test_equal_samples_and_an_explicit_time(tmp_path, tiny_cfg):
    from flows.experiment_setup import setup

    run = str(_finished_run(tmp_path, tiny_cfg))
    s = setup(run, "study", None, None, 5, None)
    assert [s.config("ppo", 0).grpo.max_steps] == [5] and [
        s.config("prm-process-2-rounds", 0, k).grpo.max_steps for k in (1, 2)
    ] == [2, 3]
    assert s.config("continued-sft", 0).sft.max_seconds == 10.0  # continued SFT keeps the time
    assert setup(run, "compare", None, 7.0, None, None).config("rule-outcome", 0).grpo.max_seconds == 7.0
    with pytest.raises(ValueError, match="unknown baseline variant"):
        setup(run, "baseline", ["reinforce"], None, None, None)


def test_a_learning_rate_sweep_sets_every_rl_variant_and_only_them(tmp_path, tiny_cfg):
    from flows.experiment_setup import setup

    s = setup(str(_finished_run(tmp_path, tiny_cfg)), "sampling", None, None, 5, None, lr=3e-5)
    assert {s.config(v, 0).grpo.lr for v in PRESETS["sampling"].variants} == {3e-5}
    assert s.config("continued-sft", 0).sft.lr == 1e-4  # SFT keeps the rate it ended with
    assert (s.config("dynamic", 0).grpo.redraws, s.config("curriculum", 0).grpo.curriculum) == (3, 0.75)
    assert (s.config("uniform", 0).grpo.redraws, s.config("uniform", 0).grpo.curriculum) == (0, 0.0)


def test_a_recipes_dynamic_sampling_stays_with_grpo_and_outcome_supervision(tmp_path, tiny_cfg):
    """The §5 algorithms pin redraws to 0 over a recipe that sets it; under a recipe supervised by
    the PRM alone the dynamic variants are refused (they judge a group by the answer checker; the
    experiment skips them, saying why), beside the checker they run."""
    from flows.experiment_setup import setup

    run = _finished_run(tmp_path, tiny_cfg)
    recipe = yaml.safe_load((run / "config.yaml").read_text())
    recipe["grpo"] |= {"redraws": 3}
    (run / "config.yaml").write_text(yaml.safe_dump(recipe))
    s = setup(str(run), "study", None, None, 5, None)
    assert [s.config(v, 0).grpo.redraws for v in ("rft", "online-rft", "ppo", "rule-outcome")] == [0, 0, 0, 3]
    recipe["grpo"] |= {"reward_weights": {"prm": 1.0}, "supervision": "process", "redraws": 0}
    recipe["prm"]["train"] = True
    (run / "config.yaml").write_text(yaml.safe_dump(recipe))
    s = setup(str(run), "sampling", None, None, 5, None)
    assert s.config("curriculum", 0).grpo.curriculum == 0.75
    with pytest.raises(ValueError, match="supervision=process"):
        s.config("dynamic", 0)
    recipe["grpo"]["reward_weights"] = {"rule": 1.0, "prm": 1.0}
    (run / "config.yaml").write_text(yaml.safe_dump(recipe))
    assert setup(str(run), "sampling", None, None, 5, None).config("dynamic", 0).grpo.redraws == 3


def test_rows_compare_with_uniform_and_count_steps_with_a_gradient(tmp_path, tiny_cfg):
    from flows.experiment_setup import Run, setup
    from flows.experiment_table import format_table, variant_row

    s = setup(str(_finished_run(tmp_path, tiny_cfg)), "sampling", None, None, 5, None)
    run = lambda seed, zero: Run(  # noqa: E731
        seed=seed,
        model={"path": "m", "digest": "d"},
        train_s=1.0,
        steps=2,  # noqa: E731
        peak_memory={},
        curve=[],
        rewards=[{"frac_batch_zero_std": z} for z in zero],
    )
    accs = {"uniform": [0.10, 0.12], "dynamic": [0.15, 0.16]}
    row = variant_row(s, "dynamic", [run(0, [1.0, 0.5]), run(1, [0.0, 0.0])], {}, 0.1, accs, 1)
    assert row["gain_over_uniform"] == pytest.approx(0.045)
    assert row["steps_with_gradient_mean"] == 0.75  # seed 0: 1 step in 2; seed 1: both
    assert row["groups_with_gradient_mean"] == 0.625  # (0.25 + 1) / 2
    table = format_table({"samples": 1, "rows": [row]})
    assert "vs uniform (95% CI)" in table and "75% / 62%, 2.0" in table  # tiny recipe: 2 questions a step


def test_a_run_of_two_rounds_joins_its_curves_in_seconds_and_in_steps():
    """Run.of joins its stages' validation curves end to end: seconds after the earlier stages'
    seconds, steps after their steps (the study's figure reads steps on a budget of steps)."""
    from flows.experiment_setup import Run
    from grpo_core.stages.outputs import GRPOOutput

    curve = [{"step": 0, "elapsed_s": 0.0, "val/accuracy": 0.5}, {"step": 4, "elapsed_s": 3.0, "val/accuracy": 0.6}]
    grpo = dict(
        stage="grpo", model="m", digest="d", best_val_accuracy=0.6, train_s=3.5, steps=4, best_step=4, curve=curve
    )
    run = Run.of(0, [GRPOOutput(**grpo), GRPOOutput(**grpo)])
    assert run.curve == [(0.0, 0.5), (3.0, 0.6), (3.5, 0.5), (6.5, 0.6)] and run.curve_steps == [0, 4, 4, 8]
    assert (run.steps, run.train_s) == (8, 7.0)


def test_a_row_reports_the_last_policy_beside_the_kept_one_and_names_a_kept_step_0(tmp_path, tiny_cfg):
    """Keep-best published step 0 (the SFT model itself) for seed 0 and the last step for seed 1: the
    row gives the last policies' accuracy with its interval, and the table says what step 0 was."""
    from flows.experiment_setup import Run, setup
    from flows.experiment_table import format_table, report, variant_row
    from grpo_core.stages.outputs import GRPOOutput

    s = setup(str(_finished_run(tmp_path, tiny_cfg)), "sampling", None, None, 5, None)
    grpo = dict(stage="grpo", model="m", digest="d", best_val_accuracy=0.1, train_s=1.0, steps=4)
    kept_0 = Run.of(0, [GRPOOutput(**grpo, best_step=0, last_model="l", last_digest="e")])
    kept_last = Run.of(1, [GRPOOutput(**grpo, best_step=4)])
    assert (kept_0.kept_step, kept_0.last.path, kept_last.kept_step, kept_last.last) == (0, "l", 4, None)
    accs = {"dynamic": [0.10, 0.14], "uniform": [0.11, 0.12]}
    row = variant_row(s, "dynamic", [kept_0, kept_last], {}, 0.10, accs, 1, last={"dynamic": [0.13, 0.14]})
    assert row["kept_steps"] == [0, 4] and row["last_accuracy_mean"] == pytest.approx(0.135)
    assert row["last_gain_over_sft"] == pytest.approx(0.035) and row["gain_over_sft"] == pytest.approx(0.02)
    # Against its control as kept, and between the policies the runs ended with (uniform's kept = its last).
    assert row["gain_over_uniform"] == pytest.approx(0.005) and row["last_gain_over_uniform"] == pytest.approx(0.02)
    # The other way round: the control ended elsewhere, the arm kept its last; neither: no such gain.
    other_way = variant_row(s, "dynamic", [kept_last, kept_last], {}, 0.10, accs, 1, last={"uniform": [0.09, 0.10]})
    assert other_way["last_gain_over_uniform"] == pytest.approx(0.025) and "last_accuracy_mean" not in other_way
    neither = variant_row(s, "dynamic", [kept_last, kept_last], {}, 0.10, accs, 1)
    assert not any(key.startswith("last_") for key in neither)
    table = format_table({"samples": 1, "rows": [row]})
    assert (
        "last step: accuracy, vs SFT (95% CI)" in table
        and "0 (its start, unchanged), 4" in table
        and "13.5, +3.5" in table
    )
    assert "lora_rank" not in row and "LoRA" not in table
    # The report's line for an arm against its control gives both comparisons.
    gains = {"gain_over_dynamic": 0.01, "gain_over_dynamic_95ci": [0.0, 0.02]}
    gains |= {"last_gain_over_dynamic": -0.03, "last_gain_over_dynamic_95ci": [-0.05, -0.01]}
    result = {"preset": "sparse", "run_name": "r", "budget": {"steps": 5, "seconds": None}, "seeds": 2}
    result |= {
        "n_test": 10,
        "n_sampled": 0,
        "samples": 1,
        "figures": {},
        "rows": [row | {"variant": "rule+orm"} | gains],
    }
    assert (
        "- rule+orm against dynamic (same GRPO steps): +1.00 [+0.00, +2.00] points, 2 seeds; "
        "the policies the runs ended with: -3.00 [-5.00, -1.00]." in report(result, "x")
    )
    (tmp_path / "l").mkdir()
    lora = setup(
        str(_finished_run(tmp_path / "l", tiny_cfg)),
        "sampling",
        None,
        None,
        5,
        None,
        overrides=["grpo.lora={rank: 4, alpha: 8}", "grpo.beta=0.0"],
    )
    row = variant_row(lora, "dynamic", [kept_0, kept_last], {}, 0.10, {"dynamic": [0.10, 0.14]}, 1)
    assert "| dynamic (LoRA rank 4) |" in format_table({"samples": 1, "rows": [row]})


def test_stage_outputs_are_typed_and_name_a_missing_field():
    """Every stage's inputs class names its output class; a manifest read back as it is checked
    field by field, and keeps the stage's further metrics as extra fields."""
    from pydantic import ValidationError

    from grpo_core.stages.inputs import INPUTS
    from grpo_core.stages.outputs import GRPOOutput, StageOutput

    assert all(issubclass(cls.output, StageOutput) for cls in INPUTS.values())
    manifest = {
        "stage": "grpo",
        "model": "m",
        "digest": "d",
        "best_val_accuracy": 0.9,
        "best_step": 4,
        "train_s": 12.0,
        "wall_s": 15.0,
        "steps": 8,
        "n_custom": 3,
    }
    out = INPUTS["grpo"].output.model_validate(manifest)
    assert (out.ref.path, out.train_s, out.algorithm, out.model_extra) == ("m", 12.0, "grpo", {"n_custom": 3})
    with pytest.raises(ValidationError, match="train_s"):
        GRPOOutput.model_validate({k: v for k, v in manifest.items() if k != "train_s"})


def test_the_reward_model_cell_is_the_mean_of_the_seeds_own_beside_the_sft_likelihood():
    """Two seeds' own ORMs: their held-out within-question AUC, pooled AUC, the SFT likelihood's on
    the same rows and the difference paired by question, each the mean over the seeds."""
    from flows.experiment_table import reward_model_quality
    from grpo_core.stages.outputs import RewardModelOutput

    def orm(within: float, pooled: float, sft: float, paired: float) -> dict:
        heldout = {"within_question_auc": within, "auc": pooled, "within_question_auc_minus_baseline": paired}
        return {
            "orm": RewardModelOutput(
                stage="orm", model="m", digest="d", heldout=heldout, baseline={"within_question_auc": sft}
            )
        }

    cell = reward_model_quality([orm(0.7, 0.8, 0.6, 0.1), orm(0.5, 0.6, 0.6, -0.1)], ("orm",))
    assert cell == (
        "ORM within-question AUC 0.600 (pooled AUC 0.700; SFT likelihood 0.600, paired difference +0.000; "
        "mean of 2 seeds' own)"
    )
    assert reward_model_quality([orm(0.7, 0.8, 0.6, 0.1)], ()) == "-"  # a variant on the checker alone

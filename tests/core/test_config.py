"""The recipe: YAML -> frozen pydantic models, failing before any work with the field path and reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from grpo_core.config import PipelineConfig
from grpo_core.recipe import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_the_papers():
    cfg = load_config()
    assert (cfg.grpo.group_size, cfg.grpo.lr, cfg.grpo.beta, cfg.grpo.clip_eps) == (64, 1e-6, 0.04, 0.2)
    assert cfg.grpo.loss_agg == "seq-mean-token-mean"


def test_yaml_round_trip(tmp_path):
    path = _write(
        tmp_path,
        "run_name: rt\nseed: 7\ngrpo:\n  group_size: 8\n  temperatures: [0.7, 1.0]\n"
        "data:\n  arithmetic:\n    max_operand: 20\n",
    )
    cfg = load_config(path)
    assert cfg.run_name == "rt" and cfg.seed == 7 and cfg.grpo.group_size == 8
    assert cfg.grpo.temperatures == (0.7, 1.0) and cfg.data.arithmetic.max_operand == 20
    # dump -> YAML -> load gives the same config
    again = load_config(_write(tmp_path, yaml.safe_dump(cfg.model_dump(mode="json")), "again.yaml"))
    assert again == cfg


def test_overrides_are_parsed_as_yaml(tmp_path):
    path = _write(tmp_path, "grpo:\n  lr: 1.0e-6\n")
    cfg = load_config(path, ["grpo.lr=1e-4", "grpo.temperatures=[0.7, 1.0]", "seed=3", "model.init=tiny"])
    assert cfg.grpo.lr == pytest.approx(1e-4) and isinstance(cfg.grpo.lr, float)
    assert cfg.grpo.temperatures == (0.7, 1.0)
    assert cfg.seed == 3
    # An override creates a section absent from the file.
    assert load_config(path, ["sft.max_steps=5"]).sft.max_steps == 5


def test_override_without_equals_fails():
    with pytest.raises(ConfigError, match="grpo.lr"):
        load_config(None, ["grpo.lr"])


def test_unknown_key_fails_naming_field_path(tmp_path):
    with pytest.raises(ConfigError, match=r"grpo\.bogus"):
        load_config(None, ["grpo.bogus=1"])
    path = _write(tmp_path, "data:\n  arithmetic:\n    max_operandz: 5\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "data.arithmetic.max_operandz" in str(e.value) and str(path) in str(e.value)


def test_group_size_one_fails():
    with pytest.raises(ConfigError, match=r"grpo\.group_size"):
        load_config(None, ["grpo.group_size=1"])


def test_minibatch_not_dividing_batch_fails_with_reason():
    # 16 questions x 4 = 64 completions; 24 does not divide 64.
    with pytest.raises(ConfigError) as e:
        load_config(None, ["grpo.questions_per_step=16", "grpo.group_size=4", "grpo.minibatch_size=24"])
    msg = str(e.value)
    assert "grpo" in msg and "minibatch_size=24" in msg and "not divisible" in msg
    # 32 divides 64 and holds whole groups of 4: fine.
    assert load_config(None, ["grpo.questions_per_step=16", "grpo.group_size=4", "grpo.minibatch_size=32"])


def test_models_are_frozen():
    cfg = load_config()
    with pytest.raises(ValidationError):
        cfg.grpo.lr = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        cfg.seed = 1  # type: ignore[misc]
    assert cfg.grpo.lr == 1e-6


def test_invalid_yaml_names_the_file(tmp_path):
    path = _write(tmp_path, "grpo:\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML") as e:
        load_config(path)
    assert str(path) in str(e.value)


def test_missing_file_and_non_mapping_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=str(missing)):
        load_config(missing)
    path = _write(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match=str(path)):
        load_config(path)


def test_yaml_is_data_not_code(tmp_path):
    # safe_load: a python tag is an error, never an object construction.
    path = _write(tmp_path, "run_name: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError):
        load_config(path)


def test_jsonl_source_needs_files():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.source=jsonl"])
    assert "data" in str(e.value) and "sft_file" in str(e.value) and "test_file" in str(e.value)
    cfg = load_config(
        None, ["data.source=jsonl", "data.sft_file=a.jsonl", "data.rl_file=b.jsonl", "data.test_file=c.jsonl"]
    )
    assert cfg.data.sft_file == "a.jsonl"


RECIPES = sorted((REPO / "configs").glob("*.yaml")) + sorted((REPO / "configs").glob("*.yml"))


@pytest.mark.skipif(not RECIPES, reason="no recipes in configs/ yet")
@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_repo_recipes_validate(path):
    assert isinstance(load_config(path), PipelineConfig)


def test_readme_config_table_matches_the_models():
    """The recipe reference in docs/recipes.md is generated (`python -m grpo_core.recipe`); it must not drift."""
    from grpo_core.recipe import config_reference

    reference = (Path(__file__).resolve().parents[2] / "docs" / "recipes.md").read_text()
    assert config_reference() in reference, (
        "docs/recipes.md's config table is stale: paste `python -m grpo_core.recipe`"
    )


def test_extends_merges_sections_and_replaces_reward_weights(tmp_path):
    """`extends:` reads the base first; sections merge key by key, dict-valued fields are replaced."""
    _write(
        tmp_path,
        "seed: 3\ngrpo: {lr: 1.0e-4, reward_weights: {rule: 1.0, orm: 1.0}}\norm: {train: true}\n",
        "base.yaml",
    )
    top = _write(tmp_path, "extends: base.yaml\ngrpo: {reward_weights: {rule: 1.0}}\n", "top.yaml")
    cfg = load_config(top)
    assert cfg.seed == 3 and cfg.grpo.lr == 1e-4 and cfg.orm.train
    assert cfg.grpo.reward_weights == {"rule": 1.0}


def test_extends_cycle_is_an_error(tmp_path):
    a = _write(tmp_path, "extends: b.yaml\n", "a.yaml")
    _write(tmp_path, "extends: a.yaml\n", "b.yaml")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(a)


@pytest.mark.parametrize(
    "setting, says",
    [
        ("sft.lora={rank: 8}", "sft.lora"),
        ("grpo.algorithm=ppo", "grpo.algorithm=ppo"),
        ("orm.train=true", "orm.train"),
    ],
)
def test_the_calculator_is_refused_where_its_tokens_would_pass_for_the_models(setting, says):
    load_config(None, ["model.calculator=true"])
    with pytest.raises(ConfigError, match=f"model.calculator with {says}"):
        load_config(None, ["model.calculator=true", setting])


def test_process_supervision_needs_a_trained_prm():
    with pytest.raises(ConfigError, match="supervision=process needs a PRM"):
        load_config(None, ["grpo.supervision=process"])
    with pytest.raises(ConfigError, match="prm.train is false"):
        load_config(None, ["grpo.supervision=process", "grpo.reward_weights={prm: 1.0}"])
    with pytest.raises(ConfigError, match="reward_weights"):
        load_config(None, ["grpo.reward_weights={rule: 0}"])
    # Min-form process credit is a process-supervision setting: refused where nothing would read it.
    with pytest.raises(ConfigError, match="process_credit=min applies to supervision=process only"):
        load_config(None, ["grpo.process_credit=min"])
    cfg = load_config(
        None,
        ["grpo.supervision=process", "grpo.reward_weights={prm: 1.0}", "prm.train=true", "grpo.process_credit=min"],
    )
    assert cfg.grpo.process_credit == "min"
    # Dynamic sampling under process supervision judges a group by the answer checker: refused without it.
    with pytest.raises(ConfigError, match="reward_weights.rule"):
        load_config(
            None, ["grpo.supervision=process", "grpo.reward_weights={prm: 1.0}", "prm.train=true", "grpo.redraws=2"]
        )
    assert (
        load_config(
            None,
            [
                "grpo.supervision=process",
                "grpo.reward_weights={rule: 1.0, prm: 1.0}",
                "prm.train=true",
                "grpo.redraws=2",
            ],
        ).grpo.redraws
        == 2
    )


@pytest.mark.parametrize(
    "algorithm, beta, loss, reward, reference",
    [
        ("grpo", 0.04, 0.04, 0.0, True),
        ("grpo", 0.0, 0.0, 0.0, False),
        ("ppo", 0.05, 0.0, 0.05, True),
        ("online_rft", 0.0, 0.0, 0.0, False),
        ("rft", 0.0, 0.0, 0.0, True),
    ],
)  # RFT samples the reference
def test_beta_is_placed_by_the_algorithm_in_one_place(algorithm, beta, loss, reward, reference):
    from grpo_core.config import GRPOConfig

    gc = GRPOConfig(algorithm=algorithm, beta=beta)
    assert (gc.kl.loss, gc.kl.reward, gc.loads_reference) == (loss, reward, reference)


def test_a_beta_the_algorithm_has_no_place_for_is_refused():
    from grpo_core.config import GRPOConfig

    assert GRPOConfig(algorithm="rft").kl.loss == 0.0  # absent: the algorithm's default, none
    with pytest.raises(ValidationError, match="algorithm=rft has no KL term: beta must be 0"):
        GRPOConfig(algorithm="rft", beta=0.04)


def test_a_renamed_key_is_refused_in_one_line_naming_its_new_name(tmp_path):
    from grpo_core.recipe import ConfigError, load_config

    with pytest.raises(
        ConfigError, match=r"^--set 'grpo.steps=5': grpo.steps is now grpo.max_steps \(--set grpo.max_steps=5\)$"
    ):
        load_config(None, ["grpo.steps=5"])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("grpo:\n  steps: 7\n")
    with pytest.raises(
        ConfigError, match=r"r.yaml: grpo.steps is now grpo.max_steps: rename `steps:` to `max_steps:` under `grpo:`$"
    ):
        load_config(recipe)
    # A run's own config.yaml, written before the rename, is read under the new name.
    with pytest.warns(UserWarning, match="grpo.steps is read as grpo.max_steps"):
        assert load_config(recipe, migrate=True).grpo.max_steps == 7
    assert load_config(None, ["grpo.max_steps=5"]).grpo.max_steps == 5


def test_a_run_folder_recorded_before_centred_credit_became_the_default_still_loads(tmp_path):
    """A run's own config.yaml of outcome supervision recorded the old default ``process_credit: sum``,
    now refused there: read as a run's config (``migrate``) it is dropped with a warning; a recipe
    that says it is refused, naming the field; under process supervision it stays the paper's form."""
    recipe = tmp_path / "config.yaml"
    recipe.write_text("grpo:\n  supervision: outcome\n  process_credit: sum\n")
    with pytest.raises(ConfigError, match="grpo.*process_credit=sum applies to supervision=process only"):
        load_config(recipe)
    with pytest.warns(UserWarning, match="process_credit: sum"):
        assert load_config(recipe, migrate=True).grpo.process_credit == "centred"
    recipe.write_text(
        "grpo:\n  supervision: process\n  process_credit: sum\n  reward_weights: {prm: 1.0}\nprm:\n  train: true\n"
    )
    assert load_config(recipe, migrate=True).grpo.process_credit == "sum"

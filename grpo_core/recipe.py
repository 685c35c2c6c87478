"""Reading a recipe: YAML files (``extends:`` merged key by key), ``--set section.key=value``
overrides, validation against the schema (``config.PipelineConfig``) with every bad field named,
and the recipe as flat parameters for tracking; ``python -m grpo_core.recipe`` prints the generated
reference table of every key (docs/recipes.md)."""

from __future__ import annotations

import json
import typing
import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from grpo_core.config import PipelineConfig, Section


class ConfigError(ValueError):
    """An invalid recipe: the message names the file and every offending field."""


# Recipe keys that were renamed, and their names now: a recipe that uses an old one is refused in
# one line naming the new one (a training budget in steps is ``max_steps`` in every section).
RENAMED = {"grpo.steps": "grpo.max_steps"}


def renamed(raw: dict[str, Any], source: str, migrate: bool = False) -> dict[str, Any]:
    """``raw`` (a recipe file's sections) without the keys of ``RENAMED``: refused in one line naming
    the new key, or (``migrate``: a run's own ``config.yaml``, written before the rename) read under
    the new name with a warning."""
    for old, new in RENAMED.items():
        (section, key), new_key = old.split("."), new.split(".")[1]
        if isinstance(raw.get(section), dict) and key in raw[section]:
            if not migrate:
                raise ConfigError(f"{source}: {old} is now {new}: rename `{key}:` to `{new_key}:` under `{section}:`")
            warnings.warn(f"{source}: {old} is read as {new} (renamed)", stacklevel=3)
            raw[section][new_key] = raw[section].pop(key)
    return raw


# A default a run's own config.yaml recorded that is no longer the default and is now refused where
# it does not apply: (section, key, old default) -> (the setting it needs, its value). Read from a run's
# config (``migrate``), it is dropped where that setting has another value.
RETIRED_DEFAULTS = {("grpo", "process_credit", "sum"): ("supervision", "process")}


def retired(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """A run's own ``raw`` config without the ``RETIRED_DEFAULTS`` it recorded where they do not apply."""
    for (section, key, value), (needs, wanted) in RETIRED_DEFAULTS.items():
        sec = raw.get(section)
        if isinstance(sec, dict) and sec.get(key) == value and sec.get(needs) != wanted:
            warnings.warn(f"{source}: {section}.{key}: {value} (a default it recorded) dropped", stacklevel=3)
            del sec[key]
    return raw


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings; values are parsed as YAML (``1e-4``, ``[0.7, 1.0]``)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        dotted, value = item.split("=", 1)
        if dotted.strip() in RENAMED:
            raise ConfigError(
                f"--set {item!r}: {dotted.strip()} is now {RENAMED[dotted.strip()]} "
                f"(--set {RENAMED[dotted.strip()]}={value})"
            )
        keys = dotted.strip().split(".")
        node = raw
        for key in keys[:-1]:
            if node.get(key) is None:  # absent, or an empty section (`grpo:` alone in YAML)
                node[key] = {}
            node = node[key]
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {key!r} is not a section")
        node[keys[-1]] = yaml.safe_load(value)
    return raw


def _read_yaml(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """A recipe file as a dict; ``extends: other.yaml`` (relative to this file) is read first and
    this file's sections are merged into it key by key."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text file, so not a YAML recipe (byte {e.start}: {e.reason})") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    base = raw.pop("extends", None)
    if base is None:
        return raw
    parent = (path.parent / str(base)).resolve()
    if parent in seen or parent == path.resolve():
        raise ConfigError(f"{path}: extends {base!r} forms a cycle")
    return _merge(_read_yaml(parent, seen + (path.resolve(),)), raw, PipelineConfig)


def _merge(base: dict[str, Any], top: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """Sections merge key by key; any other value (a number, a list, ``reward_weights``) is replaced."""
    out = dict(base)
    for key, value in top.items():
        field = model.model_fields.get(key)
        sub = field.annotation if field is not None else None
        is_section = isinstance(sub, type) and issubclass(sub, Section)
        both_dicts = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value, sub) if is_section and both_dicts else value
    return out


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, migrate: bool = False
) -> PipelineConfig:
    """Read a YAML recipe (safe_load: a config is data, never code), apply overrides, validate.
    ``migrate``: ``path`` is a run's own resolved ``config.yaml``, whose renamed keys are read under
    their new names (``renamed``)."""
    raw: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        raw = renamed(_read_yaml(Path(path), seen=()), source, migrate)
        raw = retired(raw, source) if migrate else raw
    raw = apply_overrides(raw, overrides or [])
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            field = ".".join(str(p) for p in err["loc"]) or "<root>"
            lines.append(f"  {field}: {err['msg']}")
        raise ConfigError(f"{source}: invalid config\n" + "\n".join(lines)) from None


def flatten(config: BaseModel, prefix: str = "") -> dict[str, str]:
    """``{"grpo.lr": "1e-06", ...}``: the config as flat params for tracking."""
    out: dict[str, str] = {}
    for key, value in config.model_dump(mode="json").items():
        _flatten_into(out, f"{prefix}{key}", value)
    return out


def _flatten_into(out: dict[str, str], key: str, value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten_into(out, f"{key}.{k}", v)
    else:
        out[key] = str(value)


def config_reference() -> str:
    """docs/recipes.md's table of every recipe key, its default and meaning, from the models themselves."""
    rows = ["| key | default | meaning |", "|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            sub = next(
                (
                    a
                    for a in typing.get_args(field.annotation) or (field.annotation,)
                    if isinstance(a, type) and issubclass(a, Section)
                ),
                None,
            )  # a section, or one | None
            if sub is not None:
                named = typing.get_origin(field.annotation) is dict  # sections by name (data.held_out)
                if field.default is None or named:
                    rows.append(f"| `{prefix}{name}` | `{field.default}` | {field.description} |")
                walk(sub, f"{prefix}{name}." + ("<name>." if named else ""))
                continue
            default = field.default
            shown = (
                "required"
                if field.is_required()
                else json.dumps(default)[1:-1]
                if isinstance(default, str)  # "\n" shows as \n
                else str(list(default))
                if isinstance(default, tuple)
                else str(default)
            )
            budget = " [budget]" if (field.json_schema_extra or {}).get("budget") else ""
            rows.append(
                f"| `{prefix}{name}` | `{shown}` | {(field.description or '').replace('|', '&#124;')}{budget} |"
            )

    walk(PipelineConfig, "")
    return "\n".join(rows)


if __name__ == "__main__":
    print(config_reference())

"""What every ``grpo-pipeline`` command shares: a refusal in one line (exit 2), flags declared by the
config models, and a recipe read and checked before anything starts."""

from __future__ import annotations

import argparse
import sys
import typing

from grpo_core.check import recipe_problems
from grpo_core.mlflow_runs import tracking_uri
from grpo_core.recipe import ConfigError, load_config
from grpo_core.tracking import TrackingError, check_tracking
from tasks.run_lock import in_use


def fail(message: str) -> "None":
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def config_flags(parser: argparse.ArgumentParser, section, *names: str) -> None:
    """Flags for recipe fields: type, help and default from the config model, where they are declared
    once (a flag not given stays None, and the model's default applies: ``given``)."""
    for name in names:
        f = section.model_fields[name]
        kind = next(t for t in typing.get_args(f.annotation) or (f.annotation,) if t is not type(None))
        parser.add_argument("--" + name.replace("_", "-"), type=kind, help=f"{f.description} (default {f.default})")


def given(a: argparse.Namespace, names: tuple[str, ...]) -> dict:
    return {k: getattr(a, k) for k in names if getattr(a, k) is not None}


def read_recipe(a: argparse.Namespace):
    """The recipe of ``a.config`` with ``--set`` overrides; an invalid one fails here, before any work."""
    try:
        return load_config(a.config, a.overrides)
    except ConfigError as e:
        fail(str(e))


def inputs_ready(cfg) -> dict[str, float]:
    """Every problem with the recipe's data files, model folders, output folder, disk and what it
    asks of this machine, and a run folder another run holds, one line each, before any server
    starts (``grpo_core.check``); exit 2 if there is one. Returns the run's disk report."""
    problems, disk = recipe_problems(cfg)
    problems += [held] if (held := in_use(cfg.run_dir)) else []
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        raise SystemExit(2)
    return disk


def tracking_ready(cfg) -> None:
    """An unusable tracking store fails here, in seconds, before any stage runs."""
    try:
        check_tracking(tracking_uri(cfg))
    except TrackingError as e:
        fail(str(e))


def recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """A YAML recipe and its ``--set`` overrides (read by ``read_recipe``)."""
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="SECTION.KEY=VALUE")

"""``grpo-pipeline``: run a recipe, evaluate a model, score solutions with a reward model, run the
no-RL baseline, compare GRPO reward variants or the paper's §5 study (presets of one experiment flow),
continue a run for more RL rounds, open the UIs."""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import time
from pathlib import Path

# Deferred imports: each command imports the modules it runs (torch, transformers, Prefect, MLflow
# behind them) inside its function, so that ``check`` and ``--help`` answer in under a second; the
# modules imported here are light.
from flows.cli_args import config_flags, fail, given, inputs_ready, read_recipe, recipe_arguments, tracking_ready
from flows.cli_corpus import corpus_parsers
from flows.cli_process import Terminated, on_sigterm, prefect_server, run_folder, stopped
from flows.ui import serve_uis
from flows.variants import PRESETS, VARIANTS
from grpo_core.config import EvalConfig
from grpo_core.data import HELD_OUT_FORMATS, DataError, load_held_out
from grpo_core.env import default_tracking_uri, setup_environment
from grpo_core.manifests import read_manifest
from grpo_core.mlflow_runs import tracking_uri
from grpo_core.recipe import ConfigError, load_config
from grpo_core.tracking import STORE, TrackingError, check_tracking, redact, send_unsent, unsent_count, unsent_dir
from tasks.run_lock import RunInUse, in_use


def _stage_failed(error: Exception, debug: bool) -> "None":
    """An error a stage raised during a run: one line naming the stage and its folder, exit 1; any
    other error, or ``--debug``: raised as it is, with its traceback."""
    from tasks.stage_tasks import failed_stage

    if debug or failed_stage(error) is None:
        raise error
    print(
        f"error: {failed_stage(error)}. Finished stages are cached and checkpoints kept: fix the cause and run "
        f"the same command to resume (--debug shows the traceback)",
        file=sys.stderr,
    )
    raise SystemExit(1) from None


EVAL_FLAGS = ("samples", "temperature", "max_new_tokens", "batch_size")


def cmd_check(a: argparse.Namespace) -> None:
    """The recipe and what it names, checked in seconds without starting anything."""
    cfg = read_recipe(a)
    disk = inputs_ready(cfg)
    print(json.dumps({"recipe": a.config, "run_dir": str(cfg.run_dir), "ok": True, "disk": disk}))


def _measured(result: dict) -> dict:
    """An eval result without its file paths (``model``, ``per_question``, ``completions``), held-out sets included."""
    paths = ("model", "per_question", "completions")
    return {k: (_measured(v) if isinstance(v, dict) else v) for k, v in result.items() if k not in paths}


def cmd_run(a: argparse.Namespace) -> None:
    cfg = read_recipe(a)
    if held := in_use(cfg.run_dir):  # refused before anything heavy is imported or checked
        fail(held)
    inputs_ready(cfg)
    tracking_ready(cfg)
    from flows.pipeline import pipeline

    prefect_server()
    manifest = pipeline(cfg)
    summary = {
        "run_dir": str(cfg.run_dir),
        "eval": {k: _measured(v) for k, v in manifest["eval"].items()},
        "gain_over_sft": manifest["gain_over_sft"],
        "held_out": manifest["held_out"],
        "cached_stages": manifest["cached_stages"],
        "mlflow_run_id": manifest["mlflow_run_id"],
        "tracking_uri": manifest["tracking_uri"],
        "tracking_unsent": unsent_count(unsent_dir(cfg.run_dir)),
    }
    _finished(a, manifest, cfg.run_dir, summary)


def _finished(a: argparse.Namespace, manifest: dict, run_dir: Path, summary: dict) -> None:
    """What ``run`` and ``rounds`` print at the end: a table a person reads, or (``--json``) ``summary``."""
    from flows.pipeline import round_gains
    from flows.reports import terminal_report

    if a.json:
        print(json.dumps(summary, indent=2))
        return
    print(terminal_report(manifest, round_gains(manifest), run_dir / "manifest.json"))
    if kept := unsent_count(unsent_dir(run_dir)):
        print(f"{kept} tracking records wait in {unsent_dir(run_dir)}: grpo-pipeline sync {run_dir} sends them")


def cmd_eval(a: argparse.Namespace) -> None:
    from pydantic import ValidationError

    from grpo_core.evaluation import evaluate_with
    from grpo_core.lm.modeling import ModelError, load_model

    try:
        ec = EvalConfig(**given(a, EVAL_FLAGS))
        examples = load_held_out(a.data, a.format, limit=a.n)
        model, tokenizer = load_model(a.model)
    except (DataError, ModelError, ValidationError) as e:
        fail(str(e))
    metrics, rows = evaluate_with(model, tokenizer, examples, ec, seed=a.seed)
    if a.per_question:  # greedy correctness per question, for paired differences (grpo_core.stats)
        Path(a.per_question).write_text(json.dumps([int(r["correct"]) for r in rows]))
    print(json.dumps(metrics))


def cmd_score(a: argparse.Namespace) -> None:
    from grpo_core.lm.modeling import ModelError
    from grpo_core.rewards.score_command import ScoreInputError, read_rows, reward_model_kind, score

    try:
        reward_model_kind(a.model)  # a wrong folder fails before the data is read
        results = score(a.model, read_rows(a.data), batch_size=a.batch_size)
    except (ScoreInputError, ModelError) as e:
        fail(str(e))
    lines = "".join(json.dumps(r) + "\n" for r in results)
    if a.out:
        Path(a.out).write_text(lines)
    else:
        sys.stdout.write(lines)


def _finished_run(a: argparse.Namespace, known) -> tuple[Path, list[str] | None]:
    """``a.run_dir`` (it must hold a finished run) and ``a.variants`` as a list, each one of ``known``."""
    run_dir = Path(a.run_dir)
    if not (run_dir / "manifest.json").exists():
        fail(f"{run_dir / 'manifest.json'}: run the pipeline first (grpo-pipeline run ...)")
    variants = a.variants.split(",") if a.variants else None
    unknown = sorted(set(variants or []) - set(known))
    if unknown:
        fail(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return run_dir, variants


def _at_least_one(a: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(a, name)
        if value is not None and value < 1:
            fail(f"--{name.replace('_', '-')} {value}: must be at least 1")


def cmd_experiment(a: argparse.Namespace) -> None:
    """``compare``, ``study`` and ``baseline``: presets of the experiment flow."""
    from flows.experiment import experiment
    from flows.experiment_setup import setup

    run_dir, variants = _finished_run(a, VARIANTS)
    if held := in_use(run_dir):
        fail(held)
    _at_least_one(a, "seeds", "samples", "eval_every", "steps", "sample_questions")
    if a.first_seed < 0:
        fail(f"--first-seed {a.first_seed}: must be 0 or more")
    for name in ("seconds", "lr"):
        if getattr(a, name) is not None and getattr(a, name) <= 0:
            fail(f"--{name} {getattr(a, name)}: must be positive")
    try:
        # A recipe or a setting that cannot serve is refused before a flow run starts.
        setup(str(run_dir), a.command, variants, a.seconds, a.steps, a.eval_every, a.lr, a.recipe, a.overrides)
        prefect_server()
        result = experiment(
            str(run_dir),
            a.command,
            variants,
            a.seeds,
            a.seconds,
            a.steps,
            a.samples,
            a.sample_questions,
            a.eval_every,
            a.lr,
            a.recipe,
            a.overrides,
            a.shared_reward_models,
            a.first_seed,
        )
    except ValueError as e:
        fail(str(e))
    # The flow's log has shown the table; what is left to say is where it is kept.
    print(f"{result['dir']}/manifest.json; figures:", *result["figures"].values(), sep="\n  ")


def cmd_join(a: argparse.Namespace) -> None:
    import logging

    from tasks.launch import join

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        done = join(Path(a.run_dir), a.timeout)
    except TimeoutError as e:
        fail(str(e))
    print(json.dumps({"run_dir": a.run_dir, **done}))
    if done["failed"]:
        fail(f"this machine's agent failed in: {', '.join(done['failed'])} (its last lines are logged above)")


def cmd_sync(a: argparse.Namespace) -> None:
    """Send what a run's loggers kept while the tracking store did not answer (``<run>/mlflow-unsent``)."""
    kept_for = unsent_dir(a.run_dir) / STORE  # the store the records are for (a URI without credentials)
    recipe = Path(a.run_dir) / "config.yaml"  # a finished run's
    uri = a.tracking_uri or (kept_for.read_text().strip() if kept_for.exists() else None)
    uri = uri or (tracking_uri(load_config(recipe, [], migrate=True)) if recipe.exists() else None)
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    try:
        check_tracking(uri)
    except TrackingError as e:
        fail(str(e))
    sent, kept = send_unsent(uri, unsent_dir(a.run_dir))
    print(json.dumps({"run_dir": a.run_dir, "tracking_uri": redact(uri), "sent": sent, "kept": kept}))
    if kept:
        fail(f"{kept} records are still kept in {unsent_dir(a.run_dir)}: the store at {redact(uri)} did not take them")


def cmd_rounds(a: argparse.Namespace) -> None:
    run_dir = Path(a.run_dir)
    if held := in_use(run_dir):  # refused before anything heavy is imported or checked
        fail(held)
    from flows.pipeline import rl_rounds

    if not (run_dir / "manifest.json").exists():
        fail(f"{run_dir / 'manifest.json'}: run the pipeline first (grpo-pipeline run ...)")
    if a.rounds < 1:
        fail(f"--rounds {a.rounds}: must be at least 1")

    try:
        read_manifest(run_dir / "manifest.json")
    except ValueError as e:
        fail(str(e))

    try:
        cfg = load_config(run_dir / "config.yaml", a.overrides, migrate=True)
    except ConfigError as e:
        fail(str(e))
    inputs_ready(cfg)
    tracking_ready(cfg)
    prefect_server()
    manifest = rl_rounds(str(run_dir), a.rounds, a.overrides)
    _finished(
        a,
        manifest,
        run_dir,
        {
            "rounds": [
                {
                    k: r.get(k)
                    for k in (
                        "round",
                        "test_accuracy",
                        "minus_previous_round",
                        "held_out_accuracy",
                        "val_accuracy",
                        "model_version",
                        "cached_stages",
                    )
                }
                for r in manifest["rounds"]
            ],
            "champion": manifest["champion"],
            "mlflow_run_id": manifest["mlflow_run_id"],
        },
    )


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cmd_ui(a: argparse.Namespace) -> None:
    if a.host not in LOOPBACK and not a.expose:
        fail(
            f"--host {a.host}: the MLflow and Prefect servers have no login; on {a.host} anyone who reaches this "
            "machine can read every run, metric and model and start or cancel flows. Add --expose to serve them "
            "there anyway (behind a firewall or an authenticating proxy; MLflow's basic-auth app: docs/reliability.md)"
        )
    serve_uis(host=a.host, mlflow_port=a.mlflow_port, prefect_port=a.prefect_port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo-pipeline", description=__doc__)
    p.add_argument("--debug", action="store_true", help="a stage that fails shows its traceback")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the pipeline flow on a YAML recipe")
    recipe_arguments(r)
    r.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    r.set_defaults(func=cmd_run)
    ck = sub.add_parser(
        "check",
        help="check a recipe and the data files, models and output folder it names, "
        "in seconds, without starting anything (exit 2 on any problem)",
    )
    recipe_arguments(ck)
    ck.set_defaults(func=cmd_check)
    _eval_and_score_parsers(sub)
    for name, preset in PRESETS.items():  # the experiment flow's presets
        _experiment_parser(sub, name, preset)
    _rounds_join_sync_parsers(sub)
    corpus_parsers(sub)
    u = sub.add_parser("ui", help="start the MLflow and Prefect UIs (127.0.0.1 by default)")
    u.add_argument("--host", default="127.0.0.1", help="address to serve on; other than loopback needs --expose")
    u.add_argument(
        "--expose", action="store_true", help="serve on a --host other than loopback (the servers have no login)"
    )
    u.add_argument("--mlflow-port", type=int, default=5000)
    u.add_argument("--prefect-port", type=int, default=4200)
    u.set_defaults(func=cmd_ui)
    return p


def _eval_and_score_parsers(sub) -> None:
    """``eval`` (a model's accuracy on a file of questions) and ``score`` (a reward model's scores)."""
    e = sub.add_parser("eval", help="accuracy of a model folder on a JSONL file of questions (GSM8K form or --format)")
    e.add_argument("--model", required=True)
    e.add_argument("--data", required=True)
    config_flags(e, EvalConfig, *EVAL_FLAGS)
    e.add_argument(
        "--format",
        default="gsm8k",
        choices=["gsm8k", *HELD_OUT_FORMATS],
        help="the file's form: GSM8K (question, answer ending in '#### N') or another benchmark's",
    )
    e.add_argument("--n", type=int, default=None, help="only the first N questions")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--per-question", help="also write each question's greedy correctness (a JSON list of 0/1) here")
    e.set_defaults(func=cmd_eval)
    sc = sub.add_parser("score", help="an ORM's or PRM's scores of solutions in a JSONL file (one JSON line per row)")
    sc.add_argument(
        "--model", required=True, help="a reward-model folder (runs/<run>/round-<k>/orm/model or prm/model)"
    )
    sc.add_argument("--data", required=True, help="JSONL rows with question (or prompt) and completion")
    sc.add_argument("--out", help="write the lines here instead of stdout")
    sc.add_argument("--batch-size", type=int, default=64)
    sc.set_defaults(func=cmd_score)


def _experiment_parser(sub, name: str, preset) -> None:
    """One experiment preset's command (``compare``, ``study``, ...: ``flows/variants.py``'s ``PRESETS``)."""
    x = sub.add_parser(name, help=preset.about)
    x.add_argument("run_dir", help="a finished run, e.g. runs/demo")
    x.add_argument(
        "--variants",
        help="comma-separated, default "
        + ",".join(preset.variants)
        + "; any of: "
        + "; ".join(f"{v} ({spec.about})" for v, spec in VARIANTS.items()).replace("%", "%%"),
    )
    x.add_argument(
        "--seeds", type=int, help=f"runs per variant, seed = the recipe's seed + 0..N-1 (default {preset.seeds})"
    )
    x.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seeds from the recipe's seed + this on (new seeds, to confirm a planned result; their own folder)",
    )
    _budget_arguments(x, preset)
    x.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        help="as for run, over the run's recipe (the variants' own settings apply over these)",
    )
    x.add_argument(
        "--shared-reward-models",
        action="store_true",
        help="every seed trains on the same round-1 reward models (the run's own, or the experiment's); "
        "default: each seed draws its own reward data and trains its own, so that the intervals "
        "cover the reward models' variance",
    )
    x.add_argument(
        "--recipe",
        help="a YAML recipe for the RL side (reward data, reward models, GRPO, rounds): "
        "the run's SFT model must be the one it describes (e.g. configs/demo-iterate.yaml, "
        "configs/smollm2-cpu-rewards.yaml); default: the run's own",
    )
    x.set_defaults(func=cmd_experiment)


def _budget_arguments(x, preset) -> None:
    """What every variant of an experiment gets: its seconds or steps, its evaluation, its lr."""
    x.add_argument(
        "--seconds",
        type=float,
        help="training seconds per run (default: what the run's GRPO trained, "
        + ("every round" if preset.all_rounds else "round 1")
        + ")",
    )
    x.add_argument(
        "--steps", type=int, help="equal samples instead: GRPO steps per RL run (continued SFT keeps --seconds)"
    )
    x.add_argument("--samples", type=int, help=f"K of maj@K and pass@K, 1: greedy only (default {preset.samples})")
    x.add_argument(
        "--sample-questions",
        type=int,
        help="test questions for maj@K / pass@K (default "
        + (str(preset.sample_questions) if preset.sample_questions else "the recipe's eval.n_questions")
        + ")",
    )
    x.add_argument(
        "--eval-every",
        type=int,
        help="GRPO steps between validation evaluations, the curves (default "
        + (str(preset.eval_every) if preset.eval_every else "the recipe's")
        + ")",
    )
    x.add_argument(
        "--lr",
        type=float,
        help="GRPO's learning rate for every RL variant, in a folder of its own "
        "(one call per value: a sweep; default: the recipe's grpo.lr)",
    )


def _rounds_join_sync_parsers(sub) -> None:
    """``rounds`` (more RL rounds on a finished run), ``join`` (another machine's part) and ``sync``."""
    rr = sub.add_parser("rounds", help="continue a finished run for more RL rounds (the rl-rounds flow)")
    rr.add_argument("run_dir", help="a finished run, e.g. runs/demo")
    rr.add_argument("--rounds", type=int, default=1, help="how many more rounds")
    rr.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        help="as for run, over the run's recipe (a setting that changes what a stage computes runs it again)",
    )
    rr.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    rr.set_defaults(func=cmd_rounds)
    j = sub.add_parser(
        "join",
        help="on each other machine of a launch.nnodes > 1 run: start the training stages' "
        "processes here as the flow launches them (docs/scaling.md)",
    )
    j.add_argument("run_dir", help="the run's folder, at the same path on every machine (a shared file system)")
    j.add_argument("--timeout", type=float, default=24 * 3600, help="seconds to wait for the run to finish")
    j.set_defaults(func=cmd_join)
    sy = sub.add_parser("sync", help="send to MLflow what a run kept while its tracking server did not answer")
    sy.add_argument("run_dir", help="the run's folder, e.g. runs/demo")
    sy.add_argument(
        "--tracking-uri",
        help="default: the store the records were for, else the run's recipe, else "
        "$MLFLOW_TRACKING_URI, else the project's sqlite",
    )
    sy.set_defaults(func=cmd_sync)


def main(argv: list[str] | None = None) -> None:
    import httpx

    started = time.time()  # (on the file system's clock, which stamps the manifests: stopped)
    args = build_parser().parse_args(argv)
    setup_environment()
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        args.func(args)
    except RunInUse as e:  # run, rounds, compare, study, baseline on a run folder another process writes
        fail(str(e))
    except TrackingError as e:  # the tracking store stopped answering mid-run for longer than tracking.wait_s
        fail(str(e))
    except httpx.TransportError as e:  # Prefect's API (only Prefect's client speaks httpx here) went away
        fail(
            f"the Prefect API at {os.environ.get('PREFECT_API_URL') or 'its temporary server'} stopped answering "
            f"({e}). Nothing finished is lost: the stages' folders, checkpoints and cache are kept. Start the "
            f"server again and run the same command: finished stages come from the cache, an interrupted one "
            f"resumes from its last checkpoint"
        )
    except OSError as e:  # a full disk (checkpoint.DiskFull names the folder and the space needed)
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            _stage_failed(e, args.debug)
        fail(str(e))
    except Exception as e:  # a stage raised during the run
        _stage_failed(e, args.debug)
    except (KeyboardInterrupt, Terminated) as e:  # Ctrl-C or SIGTERM: the shell's 128 + the signal
        print(
            f"{'interrupted' if isinstance(e, KeyboardInterrupt) else 'terminated'}: "
            + stopped(run_folder(args), started),
            file=sys.stderr,
        )
        raise SystemExit(130 if isinstance(e, KeyboardInterrupt) else 143) from None


if __name__ == "__main__":
    main()

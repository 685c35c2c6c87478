"""What the numerics settings (``grpo_core.env.NUMERICS``: MKL's conditional numerical
reproducibility) cost: our GRPO, SFT and reward-model steps (the workers of ``grpo_step.py``,
``sft_step.py`` and ``reward_model_step.py`` on their default work) with ``MKL_CBWR`` as the project
sets it and off (an empty value), each run in a process of its own, alternating, ``--rounds``
times, in one run, with a 1024 x 1024 fp32 matmul for larger models' sake; what they buy:
``runtime.alignment_mismatches`` in each setting; and what they do not: whether the results of
``runtime.probe_cases`` keep their bits with another thread count, or with the code paths of
another CPU type (torch's ``ATEN_CPU_CAPABILITY``, MKL's branch), under the project's setting.

    .venv/bin/python bench/numerics.py --json            # make bench

Prints one JSON object: per step, the median step time in each setting (after each worker's
warm-up steps) and ``on_over_off``; the matmul's median GFLOP/s in each setting; the mode MKL
reports and the alignment check's mismatches in each setting; per variant, the operations whose
results are bit for bit those of this machine's default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.grpo_step import _default_inputs, _summary, alternate  # noqa: E402
from grpo_core.env import DEFAULTED, NUMERICS  # noqa: E402

HERE = Path(__file__).resolve().parent
CHECK = (
    "import grpo_core, json, sys, torch; from grpo_core.lm.runtime import alignment_mismatches, mkl_mode; "
    "torch.set_num_threads(int(sys.argv[1])); print(json.dumps({'mkl_mode': mkl_mode(), **alignment_mismatches()}))"
)
FINGERPRINT = (
    "import grpo_core, hashlib, json, sys, torch; from grpo_core.lm.runtime import probe_cases; "
    "torch.set_num_threads(int(sys.argv[1])); h = {}\n"
    "for name, op, inputs in probe_cases(): h.setdefault(name, "
    "hashlib.sha256()).update(op(*inputs).numpy().tobytes())\n"
    "print(json.dumps({name: d.hexdigest() for name, d in h.items()}))"
)
MATMUL = (
    "import grpo_core, sys; from bench.grpo_step import matmul_gflops; print(matmul_gflops(threads=int(sys.argv[1])))"
)


def _python(code: str, env: dict, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True, cwd=HERE.parent
    ).stdout


def settings() -> dict[str, dict]:
    """The environments compared: the project's (no user value: the stage applies its own) and off."""
    base = {k: v for k, v in os.environ.items() if k not in (*NUMERICS, DEFAULTED)}
    return {"project": base, "off": {**base, **{k: "" for k in NUMERICS}}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, as make bench)")
    p.add_argument("--steps", type=int, help="steps per worker run, 2 of them warm-up (default: 8 GRPO, 12 others)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")
    a = p.parse_args()
    from grpo_core.env import setup_environment

    setup_environment()
    import torch

    threads = str(a.threads or torch.get_num_threads())
    model, rl = _default_inputs(Path(tempfile.mkdtemp(prefix="numerics-bench-")))
    sft = str(Path(rl).with_name("sft.jsonl"))
    n = lambda default: str(a.steps or default)  # noqa: E731
    steps = {  # script, its worker's arguments, its warm-up steps
        "grpo": ("grpo_step.py", ["--model", model, "--prompts", rl, "--steps", n(8)], 2),
        "sft": ("sft_step.py", ["--model", model, "--data", sft, "--steps", n(12)], 2),
        "reward_model": ("reward_model_step.py", ["--model", model, "--data", sft, "--steps", n(12)], 2),
    }
    envs = settings()
    runs = {(name, s): [] for name in steps for s in envs}
    rates: dict[str, list[float]] = {s: [] for s in envs}
    for _ in range(a.rounds):  # every step in every setting in turn: a slow spell hits all alike
        for name, (script, args, _warmup) in steps.items():
            for s, env in envs.items():
                runs[name, s] += alternate(str(HERE / script), ["ours"], 1, [*args, "--threads", threads], env)["ours"]
        for s, env in envs.items():
            rates[s].append(float(_python(MATMUL, env, threads)))
    result: dict = {"rounds": a.rounds, "threads": int(threads)}
    for name, (_script, _args, warmup) in steps.items():
        medians = {s: _summary(runs[name, s], warmup)["median_step_s"] for s in envs}
        result[name] = {
            **{f"{s}_median_step_s": v for s, v in medians.items()},
            "on_over_off": round(medians["project"] / medians["off"], 3),
        }
    gflops = {s: statistics.median(r) for s, r in rates.items()}
    result["matmul_1024"] = {
        **{f"{s}_gflops": round(v, 1) for s, v in gflops.items()},
        "on_over_off_time": round(gflops["off"] / gflops["project"], 3),
    }
    result["alignment_mismatches"] = {s: json.loads(_python(CHECK, env, threads)) for s, env in envs.items()}
    result["same_bits_as_default"] = elsewhere(envs["project"], int(threads))
    print(json.dumps(result))


def elsewhere(env: dict, threads: int) -> dict[str, list[str]]:
    """Under the project's setting, the probe's operations whose bits survive: another thread
    count (also in MKL's strict mode); torch's kernels for another CPU capability; MKL's code path
    for any x86 CPU."""
    import torch

    other_capability = "avx2" if torch.backends.cpu.get_cpu_capability() != "AVX2" else "default"
    other_threads = 1 if threads > 1 else 2
    variants = {
        f"threads_{other_threads}": (env, other_threads),
        f"threads_{other_threads}_mkl_strict": ({**env, "MKL_CBWR": "AUTO,STRICT"}, other_threads),
        f"aten_{other_capability}": ({**env, "ATEN_CPU_CAPABILITY": other_capability}, threads),
        "mkl_compatible": ({**env, "MKL_CBWR": "COMPATIBLE"}, threads),
    }
    default = json.loads(_python(FINGERPRINT, env, str(threads)))
    out = {}
    for name, (variant_env, n) in variants.items():
        digests = json.loads(_python(FINGERPRINT, variant_env, str(n)))
        out[name] = [op for op, d in digests.items() if d == default[op]]
    return out


if __name__ == "__main__":
    main()

"""How fast the command answers before it starts anything: ``--help``, ``check`` on the demo's recipe
and on the real model's, and the two refusals (a CUDA recipe on a machine without a GPU, a run
folder another process holds), each the median of ``--repeat`` runs, beside a bare interpreter's
start-up measured in the same run (the ratio is what compares across machines). ``--imports``: the
slowest imports of ``check configs/demo.yaml`` (``python -X importtime``). Prints one JSON object.

    python bench/cli_startup.py --repeat 5 --imports 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "flows.cli"]
HOLD = """
import sys, time
from pathlib import Path
from tasks.run_lock import run_lock
with run_lock(Path(sys.argv[1]), "cli_startup bench"):
    print("held", flush=True)
    time.sleep(600)
"""


def seconds(cmd: list[str], repeat: int, expect: int) -> float:
    """The median wall seconds of ``cmd`` (its exit status must be ``expect``)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        if done.returncode != expect:
            raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}, expected {expect}: {done.stderr[-400:]}")
    return statistics.median(times)


def check_imports() -> list[dict]:
    """Every import of ``check configs/demo.yaml``, slowest first (cumulative seconds)."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flows.cli", "check", "configs/demo.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stderr
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append({"module": name.strip(), "cumulative_s": int(cumulative) / 1e6})
    return sorted(rows, key=lambda r: -r["cumulative_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--imports", type=int, default=0, help="list this many of check's slowest imports")
    a = ap.parse_args()
    out = {"python_s": seconds([sys.executable, "-c", "pass"], a.repeat, 0)}
    out["help_s"] = seconds(CLI + ["--help"], a.repeat, 0)
    out["check_demo_s"] = seconds(CLI + ["check", "configs/demo.yaml"], a.repeat, 0)
    real = ROOT / "models" / "smollm2-135m-instruct"
    if real.is_dir():  # a pretrained folder: its config and tokenizer are read through transformers
        out["check_smollm2_s"] = seconds(
            CLI + ["check", "configs/smollm2-cpu.yaml", "--set", "run_name=cli-startup-bench"], a.repeat, 0
        )
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:
        out["refuse_cuda_s"] = seconds(CLI + ["check", "configs/demo.yaml", "--set", "launch.device=cuda"], a.repeat, 2)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "held"
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            holder.stdout.readline()  # "held"
            recipe = ["configs/demo.yaml", "--set", f"output_dir={tmp}", "--set", "run_name=held"]
            out["refuse_in_use_s"] = seconds(CLI + ["run", *recipe], a.repeat, 2)
        finally:
            holder.kill()
    out |= {
        f"{k.removesuffix('_s')}_over_python": round(v / out["python_s"], 1) for k, v in out.items() if k != "python_s"
    }
    imports = check_imports()
    out["check_demo_imports"] = {
        m: any(r["module"] == m for r in imports) for m in ("torch", "transformers", "prefect", "mlflow")
    }
    if a.imports:
        out["check_demo_slowest_imports"] = imports[: a.imports]
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()

"""The demo pipeline killed at random points and restarted, against an uninterrupted run.

    .venv/bin/python bench/demo_kill_resume.py --json            # ~2 demo runs of CPU time

Runs ``configs/demo.yaml`` twice, in parallel, each in its own output folder, MLflow database and
Prefect home: once straight through, and once SIGKILLed (the whole process group: no handler, no
cleanup) ``--kills`` times after a random number of seconds (uniform in ``--window``), restarted
each time with the same command, then left to finish. Prints one JSON object: where each kill
landed (the last stage logged), the final metrics of both runs, and whether they are equal.

The demo's GRPO stops on a wall-time budget (``grpo.max_seconds``), which no two runs spend on
the same number of steps; both runs here use a step budget instead (``--grpo-steps`` per round),
so that equal final metrics are the expected outcome rather than luck, and one torch thread each
(``--threads``), as the two share the machine. Everything else is the demo.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _command(work: Path, name: str, grpo_steps: int, threads: int) -> list[str]:
    return [str(Path(sys.executable).parent / "grpo-pipeline"), "run", str(ROOT / "configs" / "demo.yaml"),
            "--set", f"output_dir={work / name}", "--set", f"tracking.tracking_uri=sqlite:///{work / name}.db",
            "--set", "grpo.max_seconds=null", "--set", f"grpo.steps={grpo_steps}", "--set", f"threads={threads}"]


def _env(work: Path, name: str) -> dict:
    env = {**os.environ, "PREFECT_HOME": str(work / f"prefect-{name}")}
    env.pop("PREFECT_API_URL", None)  # each process starts its own temporary server
    return env


def _start(work: Path, name: str, a: argparse.Namespace, log) -> subprocess.Popen:
    return subprocess.Popen(_command(work, name, a.grpo_steps, a.threads), env=_env(work, name), cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _last_stage(log_path: Path) -> str:
    """Where the log stood: the last task line (``Task run 'sft-399' - [sft] step 50: ...``), or
    the next stage when the last line is the previous stage finishing."""
    lines = [l for l in log_path.read_text(errors="replace").splitlines() if "Task run '" in l]
    if not lines:
        return "before the first stage"
    task = lines[-1].split("Task run '")[1].split("'")[0].rsplit("-", 1)[0]
    said = lines[-1].split(" - ", 1)[-1]
    return f"in the stage after {task}" if said.startswith("Finished in state") else f"{task}: {said[:100]}"


def _final(work: Path, name: str) -> dict:
    """The run's final metrics: evaluations, and each round's GRPO summary, reward-model held-out
    metrics and the digests of its policy and reward-model weights (equal digests: equal weights)."""
    manifest = json.loads((work / name / "demo" / "manifest.json").read_text())
    rounds = []
    for r in manifest["rounds"]:
        rounds.append({"round": r["round"], "test_accuracy": r["test_accuracy"], "val_accuracy": r["val_accuracy"],
                       "grpo": {k: r["grpo"][k] for k in ("steps", "best_step", "kl", "reward_mean", "accuracy")},
                       "policy_digest": r["policy_digest"],
                       **{kind: {"after": rm["after"], "digest": rm["digest"]}
                          for kind, rm in r["reward_models"].items()}})
    return {"eval": {k: v["accuracy"] for k, v in manifest["eval"].items()}, "rounds": rounds,
            "champion": manifest.get("champion")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--window", type=float, nargs=2, default=(150.0, 500.0), help="seconds before each kill")
    p.add_argument("--grpo-steps", type=int, default=40, help="GRPO steps per round (instead of the time budget)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run (the two share the machine)")
    p.add_argument("--seed", type=int, default=0, help="seeds the kill times")
    p.add_argument("--work", help="folder for both runs (default: a new temporary one)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")
    a = p.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="demo-kill-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    t0 = time.monotonic()

    straight: dict = {}

    def run_straight() -> None:
        with open(work / "straight.log", "w") as log:
            straight["rc"] = _start(work, "straight", a, log).wait()
        straight["s"] = round(time.monotonic() - t0)

    reference = threading.Thread(target=run_straight)
    reference.start()

    kills = []
    with open(work / "killed.log", "w") as log:
        for k in range(a.kills):
            proc = _start(work, "killed", a, log)
            wait = rng.uniform(*a.window)
            try:
                proc.wait(timeout=wait)
                kills.append({"kill": k + 1, "after_s": None, "note": "the run finished before the kill"})
                break
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                log.flush()
                kills.append({"kill": k + 1, "after_s": round(wait), "during": _last_stage(work / "killed.log")})
        rc = _start(work, "killed", a, log).wait()
    reference.join()
    result = {"work": str(work), "grpo_steps_per_round": a.grpo_steps, "kills": kills,
              "killed_run_rc": rc, "straight_run_rc": straight["rc"], "straight_run_s": straight.get("s"),
              "total_s": round(time.monotonic() - t0)}
    if rc == 0 and straight["rc"] == 0:
        result["straight"], result["killed"] = _final(work, "straight"), _final(work, "killed")
        result["same_final_metrics"] = result["straight"] == result["killed"]
    print(json.dumps(result, indent=None if a.json else 2))
    if not result.get("same_final_metrics"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""The demo pipeline, its tracking server and its Prefect server killed at random points, against an
uninterrupted run.

    .venv/bin/python checks/demo_kill_resume.py --json                      # ~2 demo runs of CPU time
    .venv/bin/python checks/demo_kill_resume.py --faults pipeline --json    # the pipeline alone, as before

Runs ``configs/demo.yaml`` twice, in parallel, each in its own output folder and Prefect home: once
straight through (sqlite tracking, Prefect's temporary server), and once against a real MLflow
server and a real Prefect server on 127.0.0.1, with ``--kills`` faults at random moments (after a
uniform draw from ``--window`` seconds each), each one of ``--faults`` drawn at random:
``pipeline`` SIGKILLs the run (its whole process group: no handler, no cleanup) and restarts the same
command; ``mlflow`` and ``prefect`` SIGKILL that server and start it again after ``--down`` seconds
(the run goes on, waits for it, or stops saying so; a run that stopped is started again with the
same command once its server is back). Prints one JSON object: where each fault landed (the last
stage logged), the final metrics of both runs, whether they are equal, and how many tracking
records the run still kept at its end (a fault near the end) and after ``grpo-pipeline sync``.

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
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _command(work: Path, name: str, grpo_steps: int, threads: int) -> list[str]:
    return [
        str(Path(sys.executable).parent / "grpo-pipeline"),
        "run",
        str(ROOT / "configs" / "demo.yaml"),
        "--set",
        f"output_dir={work / name}",
        "--set",
        f"tracking.tracking_uri=sqlite:///{work / name}.db",
        "--set",
        "grpo.max_seconds=null",
        "--set",
        f"grpo.max_steps={grpo_steps}",
        "--set",
        f"threads={threads}",
    ]


def _env(work: Path, name: str, servers: dict | None = None) -> dict:
    env = {**os.environ, "PREFECT_HOME": str(work / f"prefect-{name}")}
    env.pop("PREFECT_API_URL", None)  # without a Prefect server: each process starts its own temporary one
    if servers and "prefect" in servers:
        env["PREFECT_API_URL"] = servers["prefect"].url
    return env


def _start(work: Path, name: str, a: argparse.Namespace, log, servers: dict | None = None) -> subprocess.Popen:
    command = _command(work, name, a.grpo_steps, a.threads)
    if servers and "mlflow" in servers:
        command += ["--set", f"tracking.tracking_uri={servers['mlflow'].url}"]
    return subprocess.Popen(
        command, env=_env(work, name, servers), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real MLflow or Prefect server on 127.0.0.1 that the soak kills and starts again."""

    def __init__(self, kind: str, work: Path) -> None:
        port = _free_port()
        bin_dir = Path(sys.executable).parent
        if kind == "mlflow":
            self.url, health = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/health"
            self.command = [
                str(bin_dir / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{work / 'mlflow-server.db'}",
                "--default-artifact-root",
                str(work / "mlflow-artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ]
        else:
            self.url, health = f"http://127.0.0.1:{port}/api", f"http://127.0.0.1:{port}/api/health"
            self.command = [
                str(bin_dir / "prefect"),
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-ui",
            ]
        self.health, self.proc = health, None
        self.env = {**os.environ, "PREFECT_HOME": str(work / "prefect-server")}
        self.env.pop("PREFECT_API_URL", None)
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        for _ in range(360):
            try:
                return urllib.request.urlopen(self.health, timeout=2).close()
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"{self.command[:3]} did not start")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _last_stage(log_path: Path) -> str:
    """Where the log stood: the last task line (``Task run 'sft-399' - [sft] step 50: ...``), or
    the next stage when the last line is the previous stage finishing."""
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if "Task run '" in line]
    if not lines:
        return "before the first stage"
    task = lines[-1].split("Task run '")[1].split("'")[0].rsplit("-", 1)[0]
    said = lines[-1].split(" - ", 1)[-1]
    return f"in the stage after {task}" if said.startswith("Finished in state") else f"{task}: {said[:100]}"


def _unsent(work: Path) -> int:
    """Tracking records the killed run still keeps (its servers were down when it logged them)."""
    from grpo_core.tracking import unsent_count, unsent_dir

    return unsent_count(unsent_dir(work / "killed" / "demo"))


def _final(work: Path, name: str) -> dict:
    """The run's final metrics: evaluations, and each round's GRPO summary, reward-model held-out
    metrics and the digests of its policy and reward-model weights (equal digests: equal weights)."""
    manifest = json.loads((work / name / "demo" / "manifest.json").read_text())
    rounds = []
    for r in manifest["rounds"]:
        rounds.append(
            {
                "round": r["round"],
                "test_accuracy": r["test_accuracy"],
                "val_accuracy": r["val_accuracy"],
                "grpo": {k: r["grpo"][k] for k in ("steps", "best_step", "kl", "reward_mean", "accuracy")},
                "policy_digest": r["policy_digest"],
                **{kind: {"after": rm["after"], "digest": rm["digest"]} for kind, rm in r["reward_models"].items()},
            }
        )
    return {
        "eval": {k: v["accuracy"] for k, v in manifest["eval"].items()},
        "rounds": rounds,
        "champion": manifest.get("champion"),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--faults", default="pipeline,mlflow,prefect", help="what the kills may strike, comma-separated")
    p.add_argument("--down", type=float, nargs=2, default=(10.0, 120.0), help="seconds a killed server stays down")
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

    faults = a.faults.split(",")
    servers = {kind: Server(kind, work) for kind in ("mlflow", "prefect") if kind in faults}
    kills, restarts = [], 0
    with open(work / "killed.log", "w") as log:
        proc = _start(work, "killed", a, log, servers)
        for k in range(a.kills):
            deadline = time.monotonic() + rng.uniform(*a.window)
            while time.monotonic() < deadline and not (proc.poll() == 0):
                if proc.poll() is not None:  # stopped by a server fault: the same command again
                    restarts += 1
                    proc = _start(work, "killed", a, log, servers)
                time.sleep(1)
            if proc.poll() == 0:
                kills.append({"kill": k + 1, "note": "the run finished before this fault"})
                break
            target, started = rng.choice(faults), time.monotonic() - t0
            log.flush()
            fault = {
                "kill": k + 1,
                "target": target,
                "after_s": round(started),
                "during": _last_stage(work / "killed.log"),
            }
            if target == "pipeline":
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                proc = _start(work, "killed", a, log, servers)
            else:
                servers[target].kill()
                fault["down_s"] = round(rng.uniform(*a.down))
                time.sleep(fault["down_s"])
                servers[target].start()
            kills.append(fault)
        while (rc := proc.wait()) != 0 and restarts < 10:  # a run a server fault stopped: again, as a user would
            restarts += 1
            proc = _start(work, "killed", a, log, servers)
    unsent = {"at_end": _unsent(work)}
    if unsent["at_end"]:  # a fault near the end: what the run said to do, with the server back
        subprocess.run(
            [str(Path(sys.executable).parent / "grpo-pipeline"), "sync", str(work / "killed" / "demo")],
            env=_env(work, "killed"),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        unsent["after_sync"] = _unsent(work)
    for server in servers.values():
        server.kill()
    reference.join()
    result = {
        "work": str(work),
        "grpo_steps_per_round": a.grpo_steps,
        "kills": kills,
        "killed_run_rc": rc,
        "restarts_after_a_server_fault": restarts,
        "straight_run_rc": straight["rc"],
        "straight_run_s": straight.get("s"),
        "total_s": round(time.monotonic() - t0),
    }
    if rc == 0 and straight["rc"] == 0:
        result["straight"], result["killed"] = _final(work, "straight"), _final(work, "killed")
        result["same_final_metrics"] = result["straight"] == result["killed"]
        result["tracking_unsent"] = unsent
    print(json.dumps(result, indent=None if a.json else 2))
    if not result.get("same_final_metrics"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()

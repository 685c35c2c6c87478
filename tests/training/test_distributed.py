"""Data-parallel training: 2 processes (torchrun, gloo on CPU) with global batch B take the same steps
as 1 process with batch B, and only one MLflow run (the launcher's) receives the metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpo_core.config import LaunchConfig
from grpo_core.recipe import load_config
from grpo_core.tracking import stage_prefix

# Float sums over ranks run in another order than in one process; over a few Adam steps the
# losses agree to ~1e-6 relative. A wrong normalisation (a per-rank mean, a doubled gradient) or a
# rank drawing other rows is off by 1e-2 or more.
REL_TOL = 1e-4


def test_resolved_recipe_round_trips(tiny_cfg, tmp_path):
    from grpo_core.stages.inputs import write_resolved

    cfg = tiny_cfg(tmp_path, sft__max_steps=7)
    assert load_config(write_resolved(cfg, tmp_path / "resolved.yaml")) == cfg


def test_launch_commands():
    from tasks.launch import launch_command, runs_apart

    single_node = launch_command(LaunchConfig(nproc=2), "sft", ["--config", "r.yaml"])
    assert single_node[1:] == [
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        "-m",
        "grpo_core.stages",
        "--config",
        "r.yaml",
    ]
    multi = launch_command(LaunchConfig(nproc=8, nnodes=2, rdzv_endpoint="node0:29400"), "grpo", [])
    assert multi[-6:] == ["--rdzv_backend", "c10d", "--rdzv_endpoint", "node0:29400", "-m", "grpo_core.stages"]
    acc = launch_command(LaunchConfig(nproc=2, launcher="accelerate", accelerate_config="a.yaml"), "pretrain", [])
    assert acc[1:] == [
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        "a.yaml",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "-m",
        "grpo_core.stages",
    ]
    one = launch_command(LaunchConfig(own_process=True), "grpo", ["--out", "o"])  # a process of its own, no torchrun
    assert one == [sys.executable, "-m", "grpo_core.stages", "--out", "o"] and LaunchConfig(own_process=True).launched
    assert not LaunchConfig().launched
    # An evaluation is one process of its own, even where training stages are data-parallel.
    assert launch_command(LaunchConfig(nproc=2), "eval", ["--out", "o"]) == one
    assert runs_apart(LaunchConfig(own_process=True), "eval") and not runs_apart(LaunchConfig(nproc=2), "eval")
    assert runs_apart(LaunchConfig(nproc=2), "sft") and not runs_apart(LaunchConfig(), "sft")
    with pytest.raises(ValueError, match="reward_data"):
        launch_command(LaunchConfig(nproc=2), "reward_data", [])
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        LaunchConfig(nnodes=2)


def test_a_data_parallel_rank_exits_at_once_with_what_it_printed():
    """``exit_rank``: a rank of several (WORLD_SIZE > 1) ends without the interpreter's finalization,
    where gloo threads that PyTorch keeps alive abort it now and then; what it printed, unflushed,
    still arrives. A single process returns and finalizes as usual."""
    code = (
        "import atexit, sys; from grpo_core.training import distributed; "
        "atexit.register(lambda: print('finalized')); sys.stdout.write('manifest'); "
        "sys.stderr.write('warned'); distributed.exit_rank(); print(' returned')"
    )
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # unflushed text stays unflushed
    for world, printed in (("2", "manifest"), ("1", "manifest returned\nfinalized\n")):
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**buffered, "WORLD_SIZE": world},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, printed, "warned"), done.stderr[-2000:]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(
    cfg, inputs, out: Path, nproc: int, tmp_path: Path, name: str, machines: int = 1, strategy: str = "ddp"
) -> dict[str, list[float]]:
    """Run a stage's CLI on ``inputs`` in ``nproc`` processes into a fresh MLflow run; returns its
    metric histories by the names the stage logs (the run's carry the stage's prefix). ``machines``
    > 1: that many torchrun agents of ``nproc`` processes each, joined by a c10d rendezvous on
    127.0.0.1 as agents on several machines are (each runs the same command, as each machine would)."""
    from grpo_core.stages.inputs import write_inputs
    from grpo_core.stages.inputs import write_resolved
    from tasks.launch import launch_command

    from mlflow.tracking import MlflowClient

    uri = cfg.tracking.tracking_uri
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("dist") or client.get_experiment(client.create_experiment("dist"))
    run_id = client.create_run(exp.experiment_id, run_name=name).info.run_id
    # One process: the stage's own CLI, without torchrun (launch.own_process).
    launch = (
        LaunchConfig(nproc=nproc, nnodes=machines, rdzv_endpoint=f"127.0.0.1:{_free_port()}", strategy=strategy)
        if machines > 1
        else LaunchConfig(nproc=nproc, strategy=strategy)
        if nproc > 1
        else LaunchConfig()
    )
    resolved = write_resolved(cfg.model_copy(update={"launch": launch}), tmp_path / f"{name}.yaml")
    args = ["--inputs", str(write_inputs(inputs, tmp_path / f"{name}.json")), "--out", str(out)]
    cmd = launch_command(launch, inputs.stage, ["--config", str(resolved), *args])
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run_id, "OMP_NUM_THREADS": "1"}
    agents = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(machines)
    ]
    for agent in agents:
        stdout, stderr = agent.communicate(timeout=600)
        assert agent.returncode == 0, stdout[-3000:] + stderr[-3000:]
    keys = client.get_run(run_id).data.metrics
    prefix = stage_prefix(inputs.stage)
    assert all(k.startswith(prefix) for k in keys), keys
    return {
        k.removeprefix(prefix): [m.value for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
        for k in keys
    }


def _assert_same_curve(one: list[float], two: list[float]) -> None:
    assert len(one) == len(two) and len(one) > 1, (one, two)
    for a, b in zip(one, two):
        assert abs(a - b) <= REL_TOL * max(abs(a), 1e-3), (one, two)


def test_sft_on_two_processes_takes_the_steps_of_one(tiny_cfg, tiny_data_dir, tmp_path):
    from grpo_core.stages.inputs import Ref, SFTInputs

    cfg = tiny_cfg(tmp_path, sft__max_steps=4, sft__eval_every=4)
    inputs = SFTInputs(data=Ref(path=str(tiny_data_dir), digest="-"))
    one = _run(cfg, inputs, tmp_path / "one", 1, tmp_path, "sft-1")
    two = _run(cfg, inputs, tmp_path / "two", 2, tmp_path, "sft-2")
    _assert_same_curve(one["train/loss"], two["train/loss"])
    _assert_same_curve(one["train/grad_norm"], two["train/grad_norm"])
    # One writer: each step logged once (a second rank logging would double the history), and
    # the tokens counted are the global batch's.
    assert len(two["train/loss"]) == 4 and two["perf/tokens_per_s"]
    assert (tmp_path / "two" / "model").is_dir() and (tmp_path / "two" / "manifest.json").exists()


def test_sft_sharded_over_two_processes_takes_the_steps_of_one(tiny_cfg, tiny_data_dir, tmp_path):
    """``launch.strategy: fsdp`` (FSDP2 on gloo): the steps of one process; rank 0's validation and the
    saved models on gathered weights (the published model is the one-process run's)."""
    from grpo_core.lm.modeling import load_model
    from grpo_core.stages.inputs import Ref, SFTInputs

    cfg = tiny_cfg(tmp_path, sft__max_steps=4, sft__eval_every=2)
    inputs = SFTInputs(data=Ref(path=str(tiny_data_dir), digest="-"))
    one = _run(cfg, inputs, tmp_path / "one", 1, tmp_path, "sft-1")
    two = _run(cfg, inputs, tmp_path / "two", 2, tmp_path, "sft-fsdp", strategy="fsdp")
    for key in ("train/loss", "train/grad_norm", "val/loss", "val/accuracy"):
        _assert_same_curve(one[key], two[key])
    a, b = (load_model(tmp_path / run / "model")[0].state_dict() for run in ("one", "two"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)


@pytest.mark.slow
def test_sft_on_two_torchrun_agents_as_two_machines_takes_the_steps_of_one(tiny_cfg, tiny_data_dir, tmp_path):
    """The several-machine launch rehearsed on one: two torchrun agents started with ``--nnodes 2`` and
    a c10d rendezvous on 127.0.0.1 (``launch.nnodes: 2``, ``launch.rdzv_endpoint``), one process
    each, sharing the output folder as machines share a file system; rank 0 alone logs and writes."""
    from grpo_core.stages.inputs import Ref, SFTInputs

    cfg = tiny_cfg(tmp_path, sft__max_steps=4, sft__eval_every=4)
    inputs = SFTInputs(data=Ref(path=str(tiny_data_dir), digest="-"))
    one = _run(cfg, inputs, tmp_path / "one", 1, tmp_path, "sft-1")
    two = _run(cfg, inputs, tmp_path / "two", 1, tmp_path, "sft-2x1", machines=2)
    _assert_same_curve(one["train/loss"], two["train/loss"])
    _assert_same_curve(one["train/grad_norm"], two["train/grad_norm"])
    assert len(two["train/loss"]) == 4 and (tmp_path / "two" / "model").is_dir()


STRATEGIES = ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)]  # FSDP's fast check is the SFT test's


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_grpo_on_two_processes_takes_the_steps_of_one(strategy, tiny_cfg, tiny_data_dir, tiny_model_dir, tmp_path):
    import torch

    from grpo_core.rewards.heads import load_reward_model
    from grpo_core.stages.inputs import GRPOInputs, Ref

    # An (untrained, saved) ORM as the reward: the tiny policy never answers right, and the ORM's
    # scores spread within every group, so the steps have real advantages and gradients.
    torch.manual_seed(0)
    load_reward_model(tiny_model_dir, "orm").save_pretrained(tmp_path / "orm")
    cfg = tiny_cfg(
        tmp_path,
        "grpo.reward_weights={orm: 1.0}",
        orm__train=True,
        grpo__max_steps=3,
        grpo__questions_per_step=4,
        grpo__eval_every=3,
    )
    ref = lambda path: Ref(path=str(path), digest="-")  # noqa: E731
    inputs = GRPOInputs(data=ref(tiny_data_dir), init=ref(tiny_model_dir), reward_models={"orm": ref(tmp_path / "orm")})
    one = _run(cfg, inputs, tmp_path / "one", 1, tmp_path, "grpo-1")
    two = _run(cfg, inputs, tmp_path / "two", 2, tmp_path, "grpo-2", strategy=strategy)
    # Same rollouts (samples seeded by global row), same rewards, same updates.
    for key in (
        "train/reward_mean",
        "train/reward_std",
        "train/completion_len",
        "train/loss",
        "train/kl",
        "train/grad_norm",
    ):
        _assert_same_curve(one[key], two[key])
    assert len(two["train/loss"]) == 3 and min(one["train/grad_norm"]) > 0 and max(one["train/reward_std"]) > 0


@pytest.mark.slow
def test_dynamic_sampling_and_the_curriculum_on_two_processes_draw_what_one_draws(
    tiny_cfg, tiny_data_dir, tiny_model_dir, tmp_path
):
    """The answer checker on a policy that is never right: every group lacks spread, so every place
    redraws up to the bound, each process for its own places; the questions each redraw picks (by
    the curriculum) and its samples are those one process picks."""
    from grpo_core.data import read_split
    from grpo_core.stages.inputs import GRPOInputs, Ref

    rates = tmp_path / "pass_rates"
    rates.mkdir()
    (rates / "pass_rates.jsonl").write_text(
        "".join(
            json.dumps({"question": e.question, "right": i % 2, "samples": 4}) + "\n"
            for i, e in enumerate(read_split(tiny_data_dir, "rl"))
        )
    )
    cfg = tiny_cfg(
        tmp_path,
        grpo__max_steps=2,
        grpo__questions_per_step=4,
        grpo__eval_every=2,
        grpo__redraws=2,
        grpo__curriculum=0.5,
    )
    ref = lambda path: Ref(path=str(path), digest="-")  # noqa: E731
    inputs = GRPOInputs(data=ref(tiny_data_dir), init=ref(tiny_model_dir), pass_rates=ref(rates))
    one = _run(cfg, inputs, tmp_path / "one", 1, tmp_path, "sampled-1")
    two = _run(cfg, inputs, tmp_path / "two", 2, tmp_path, "sampled-2")
    assert one["sampling/groups_drawn"] == two["sampling/groups_drawn"] == [12.0, 12.0]  # 4 places x (1 + 2)
    for key in ("train/completion_len", "train/frac_truncated", "train/loss", "train/kl"):
        _assert_same_curve(one[key], two[key])


def test_join_starts_each_announced_launch_once_with_its_own_rendezvous(tmp_path):
    """What ``grpo-pipeline join`` picks up: an announced stage once (by its launch id, which is also
    the rendezvous id, so agents of different launches never meet), a relaunch again; and the
    stage's MLflow run for rank 0, unless the tracking URI holds credentials."""
    from tasks.launch import announce, launch_command, pending_launches

    launch = LaunchConfig(nproc=1, nnodes=2, rdzv_endpoint="node0:29400")
    tracking = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "MLFLOW_RUN_ID": "r1"}
    announce(tmp_path / "round-1" / "grpo", "a1", "grpo", launch, ["--out", "o"], tracking)
    [spec] = pending_launches(tmp_path, set())
    assert spec["stage"] == "grpo" and spec["args"] == ["--out", "o"] and LaunchConfig(**spec["launch"]) == launch
    assert spec["env"] == tracking and pending_launches(tmp_path, {"a1"}) == []
    assert launch_command(launch, "grpo", [], "a1")[-4:] == ["--rdzv_id", "a1", "-m", "grpo_core.stages"]
    secret = {"MLFLOW_TRACKING_URI": "https://user:pw@mlflow.example", "MLFLOW_RUN_ID": "r2"}
    announce(tmp_path / "round-1" / "grpo", "a2", "grpo", launch, ["--out", "o"], secret)  # the relaunch
    [relaunch] = pending_launches(tmp_path, {"a1"})
    assert relaunch["id"] == "a2" and relaunch["env"] == {"MLFLOW_RUN_ID": "r2"}
    with pytest.raises(ValueError, match="set launch.launcher to torchrun"):
        LaunchConfig(nproc=1, nnodes=2, rdzv_endpoint="node0:29400", launcher="accelerate")


def test_a_failing_launch_fails_with_the_processes_last_lines(tiny_cfg, tmp_path):
    """The launcher's error names the cause from a worker's own error in its first line (the line the
    CLI prints), then carries what the processes said: here that the data folder is missing."""
    from grpo_core.stages.inputs import Ref, SFTInputs
    from tasks.launch import run_launched

    cfg = tiny_cfg(tmp_path, "launch.nproc=2")
    missing = tmp_path / "no-such-data"
    with pytest.raises(RuntimeError, match=r"exited with \d+: (.|\n)*last lines:(.|\n)*no-such-data") as failed:
        run_launched(
            "sft",
            cfg,
            str(tmp_path / "sft"),
            SFTInputs(data=Ref(path=str(missing), digest="-")),
            cfg.tracking.tracking_uri,
            "no-such-run",
        )
    first = str(failed.value).splitlines()[0]
    assert first.startswith("sft: its processes exited with ") and "Error" in first and "no-such-data" in first, first
    assert not (tmp_path / "sft" / "manifest.json").exists()


def test_an_epoch_tail_shorter_than_the_batch_is_shared_unevenly():
    from grpo_core.training.distributed import Dist

    assert [Dist(r, 2).split(3) for r in range(2)] == [slice(0, 1), slice(1, 3)]
    assert [Dist(r, 3).split(8) for r in range(3)] == [slice(0, 2), slice(2, 5), slice(5, 8)]
    assert Dist().split(5) == slice(0, 5)


@pytest.mark.slow
def test_the_pipeline_launches_its_training_stages_as_two_processes(prefect_harness, tiny_cfg, tmp_path):
    """The same recipe with ``launch.nproc: 2``: SFT and GRPO run under torchrun from their Prefect
    tasks, their metrics land in the stage runs the pipeline created, and the run completes."""
    from mlflow.tracking import MlflowClient

    from flows.pipeline import pipeline

    cfg = tiny_cfg(tmp_path, "launch.nproc=2", run_name="ddp", sft__max_steps=2, grpo__max_steps=1)
    manifest = pipeline(cfg)
    client = MlflowClient(cfg.tracking.tracking_uri)
    for info, steps in ((manifest["stages"]["sft"], 2), (manifest["rounds"][0]["stages"]["grpo"], 1)):
        history = client.get_metric_history(info["mlflow_run_id"], stage_prefix(info["stage"]) + "train/loss")
        assert len(history) == steps, info["stage"]
    assert (tmp_path / "runs" / "ddp" / "sft" / "resolved.yaml").exists()
    assert set(manifest["eval"]) == {"sft", "policy"}


@pytest.mark.parametrize("head", ["linear", pytest.param("likelihood", marks=pytest.mark.slow)])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("kind", ["orm", "prm"])
def test_reward_models_on_two_processes_take_the_steps_of_one(kind, strategy, head, tiny_cfg, tiny_model_dir, tmp_path):
    """Rows of different lengths and step counts, so that a per-process mean would weigh them wrongly."""
    from datasets import Dataset, DatasetDict

    from grpo_core.data import prompt_text
    from grpo_core.digests import digest_dir
    from grpo_core.stages.inputs import INPUTS, Ref, reward_datasets

    sums = [(a, b) for a in range(2, 9) for b in range(1, 4)]

    def solution(a, b, right, steps):
        lines = [f"{a} + {b} = {a + b + (0 if right else 1)}"] + [f"{a + b} - 0 = {a + b}"] * (steps - 1)
        return "\n".join(lines + [f"#### {a + b + (0 if right else 1)}"])

    data = {
        "pairs": [
            {
                "prompt": prompt_text(f"What is {a} + {b}?"),
                "chosen": solution(a, b, True, 1 + i % 3),
                "rejected": solution(a, b, False, 1 + (i + 1) % 3),
            }
            for i, (a, b) in enumerate(sums)
        ],
        "solutions": [
            {
                "prompt": prompt_text(f"What is {a} + {b}?"),
                "completion": solution(a, b, i % 2 == 0, 2),
                "correct": i % 2 == 0,
            }
            for i, (a, b) in enumerate(sums)
        ],
        "steps": [
            {
                "prompt": prompt_text(f"What is {a} + {b}?"),
                "completion": text,
                "completions": text.split("\n"),
                "labels": labels,
                "soft_labels": [float(x) for x in labels],
                "exact_labels": labels,
            }
            for i, (a, b) in enumerate(sums)
            for text in [solution(a, b, i % 2 == 0, 1 + i % 3)]
            for labels in [[i % 2 == 0 or k == 0 for k in range(len(text.split("\n")))]]
        ],
    }
    reward_data = {}
    for name, rows in data.items():
        path = tmp_path / "rd" / name
        DatasetDict({"train": Dataset.from_list(rows[:16]), "test": Dataset.from_list(rows[16:])}).save_to_disk(
            str(path)
        )
        reward_data[f"{name}_dir"], reward_data[f"{name}_digest"] = str(path), digest_dir(path, "*.arrow")
    cfg = tiny_cfg(
        tmp_path, **{f"{kind}__batch_size": 6, f"{kind}__epochs": 1, f"{kind}__lr": 1e-3, f"{kind}__head": head}
    )
    inputs = INPUTS[kind](reward_data=reward_datasets(reward_data), init=Ref(path=str(tiny_model_dir), digest="-"))
    one = _run(cfg, inputs, tmp_path / "one", 1, tmp_path, f"{kind}-1")
    two = _run(cfg, inputs, tmp_path / "two", 2, tmp_path, f"{kind}-2", strategy=strategy)
    # 16 rows in batches of 6: 6, 6 and 4 (3 per process).
    assert len(one["train/loss"]) == 3
    _assert_same_curve(one["train/loss"], two["train/loss"])
    _assert_same_curve(one["train/grad_norm"], two["train/grad_norm"])


@pytest.mark.slow
def test_a_run_on_two_machines_rehearsed_with_join(prefect_harness, tiny_cfg, tmp_path):
    """docs/scaling.md's several-machine recipe on one machine: the pipeline flow with
    ``launch.nnodes: 2`` ("machine 0") and ``grpo-pipeline join RUN_DIR`` in another process
    ("machine 1") that starts each training stage's agent as the flow announces it. SFT and GRPO run
    as 2 ranks over the c10d rendezvous and take the steps of the one-machine run."""
    from mlflow.tracking import MlflowClient

    from flows.pipeline import pipeline

    alone = pipeline(tiny_cfg(tmp_path, run_name="alone", sft__max_steps=3, grpo__max_steps=2))
    cfg = tiny_cfg(
        tmp_path,
        "launch.nnodes=2",
        f"launch.rdzv_endpoint=127.0.0.1:{_free_port()}",
        run_name="two",
        sft__max_steps=3,
        grpo__max_steps=2,
    )
    run_dir = tmp_path / "runs" / "two"
    machine_1 = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "join", str(run_dir), "--timeout", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        two = pipeline(cfg)
        out, err = machine_1.communicate(timeout=120)
    finally:
        machine_1.kill()
    assert machine_1.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1])["joined"] == ["sft", "grpo"]
    assert not list(run_dir.rglob("launch.json"))  # each announcement removed when its launch ended
    client = MlflowClient(cfg.tracking.tracking_uri)

    def losses(manifest, stage):
        info = manifest["stages"]["sft"] if stage == "sft" else manifest["rounds"][0]["stages"]["grpo"]
        key = stage_prefix(stage) + "train/loss"
        return [m.value for m in sorted(client.get_metric_history(info["mlflow_run_id"], key), key=lambda m: m.step)]

    for stage in ("sft", "grpo"):
        _assert_same_curve(losses(alone, stage), losses(two, stage))
    assert two["eval"]["policy"]["n"] == alone["eval"]["policy"]["n"]


def _launch_and_kill_after(cmd: list[str], env: dict, checkpoints: Path, step: int) -> None:
    """Start ``cmd`` and SIGKILL its whole process tree (torchrun and its ranks, which torchrun puts in
    sessions of their own: no handler, no cleanup) once checkpoint ``step`` is complete."""

    import psutil  # accelerate's dependency

    from grpo_core.training.checkpoint import complete_checkpoints

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not any(p.name == f"step-{step:08d}" for p in complete_checkpoints(checkpoints)):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:] if proc.stderr else ""
        time.sleep(0.02)
    tree = psutil.Process(proc.pid)
    for p in [*tree.children(recursive=True), tree]:
        p.kill()
    psutil.wait_procs([*tree.children(recursive=True), tree], timeout=30)
    proc.wait()


@pytest.mark.slow
def test_a_sharded_run_killed_resumes_on_two_processes_and_on_one(tiny_cfg, tiny_data_dir, tmp_path):
    """FSDP's checkpoints hold the whole weights and optimizer state (gathered at each save), so a
    2-process FSDP run SIGKILLed after checkpoint 2 resumes from its last checkpoint, on 2 processes
    or on 1, to the weights of a straight run."""
    from grpo_core.lm.modeling import load_model
    from grpo_core.stages.inputs import Ref, SFTInputs, write_inputs
    from grpo_core.training.checkpoint import latest_checkpoint
    from grpo_core.stages.inputs import write_resolved
    from tasks.launch import launch_command

    # Batches of 2 rows: 8 steps stay within the first epoch (1 and 2 processes split an epoch's
    # short last batch differently, tests above).
    cfg = tiny_cfg(tmp_path, sft__max_steps=8, sft__batch_size=2, sft__checkpoint_every=1, sft__eval_every=8)
    inputs = SFTInputs(data=Ref(path=str(tiny_data_dir), digest="-"))
    _run(cfg, inputs, tmp_path / "straight", 2, tmp_path, "straight", strategy="fsdp")
    fsdp = cfg.model_copy(update={"launch": LaunchConfig(nproc=2, strategy="fsdp")})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for resumed_on in (2, 1):
        out = tmp_path / f"killed-{resumed_on}"
        args = [
            "--config",
            str(write_resolved(fsdp, tmp_path / "fsdp.yaml")),
            "--inputs",
            str(write_inputs(inputs, tmp_path / "inputs.json")),
            "--out",
            str(out),
        ]
        _launch_and_kill_after(launch_command(fsdp.launch, "sft", args), env, out / "checkpoints", 2)
        done = int(latest_checkpoint(out / "checkpoints").name.removeprefix("step-"))  # 2, or a little past it
        assert not (out / "manifest.json").exists() and done < 8
        resumed = _run(cfg, inputs, out, resumed_on, tmp_path, f"resumed-on-{resumed_on}", strategy="fsdp")
        assert len(resumed.get("train/loss", [])) == 8 - done, (done, resumed)  # it went on from its last checkpoint
        a, b = (load_model(p / "model")[0].state_dict() for p in (tmp_path / "straight", out))
        assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a), resumed_on


def test_a_launched_stage_s_lines_are_marked_with_its_name_once():
    """What a stage's processes print reaches the flow's log marked ``[stage]``; its own progress
    line (``[orm] step 11/92, ...``) is not marked twice."""
    import sys
    from types import SimpleNamespace

    from tasks.launch import stream

    lines = []
    log = SimpleNamespace(info=lambda fmt, *args: lines.append(fmt % args))
    code = "print('[orm] step 11/92, epoch 1/1'); print('loading weights')"
    rc, tail = stream([sys.executable, "-c", code], {}, log, "orm")
    assert rc == 0 and tail == ["[orm] step 11/92, epoch 1/1", "loading weights"]
    assert lines == ["[orm] step 11/92, epoch 1/1", "[orm] loading weights"]

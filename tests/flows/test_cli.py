"""``grpo-pipeline``: invalid input fails with exit code 2 and a message naming the culprit; ``eval``
prints one JSON object (the public contract, docs/architecture.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import main

QUESTIONS = [
    {"question": "What is 1 + 2?", "answer": "1 + 2 = 3\n#### 3"},
    {"question": "What is 7 - 5?", "answer": "#### 2"},
    {"question": "What is 4 + 4 - 1?", "answer": "4 + 4 = 8\n8 - 1 = 7\n#### 7"},
]


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- data checked before anything starts


def _jsonl_recipe(tmp_path: Path, **files: str) -> Path:
    """A recipe reading JSONL files (``files``: data keys -> paths), the good questions by default."""
    good = str(_jsonl(tmp_path / "good.jsonl", QUESTIONS * 4))
    rl, test = ([{"question": f"What is {i} + {n}?", "answer": f"#### {i + n}"} for i in range(12)] for n in (1, 2))
    data = {
        "sft_file": good,
        "rl_file": str(_jsonl(tmp_path / "rl.jsonl", rl)),
        "test_file": str(_jsonl(tmp_path / "test.jsonl", test)),
    } | files
    lines = "".join(f"  {k}: {v}\n" for k, v in data.items())
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'runs'}\ndata:\n  source: jsonl\n{lines}", encoding="utf-8")
    return recipe


def test_check_lists_every_problem_of_the_data_and_models_one_line_each(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{bad json\n', encoding="utf-8")
    _jsonl(tmp_path / "no_final.jsonl", [{"question": "q", "answer": "three"}])
    _jsonl(tmp_path / "no_answer.jsonl", [{"question": "q"}])
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    recipe = _jsonl_recipe(
        tmp_path,
        sft_file=tmp_path / "bad.jsonl",
        rl_file=tmp_path / "missing.jsonl",
        test_file=tmp_path / "no_final.jsonl",
        val_file=tmp_path / "empty.jsonl",
    )
    held_out = [
        "--set",
        f"data.held_out={{x: {{file: {tmp_path / 'no_answer.jsonl'}}}}}",
        "--set",
        "model.init=pretrained",
        "--set",
        f"model.path={tmp_path / 'no_model'}",
    ]
    assert _exit_code(["check", str(recipe), *held_out]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        (
            f"error: {tmp_path / 'bad.jsonl'}:2: malformed JSON: Expecting property name enclosed in double quotes "
            f"(data.sft_file)"
        ),
        f"error: {tmp_path / 'missing.jsonl'}: file not found (data.rl_file)",
        f"error: {tmp_path / 'empty.jsonl'}: no examples (data.val_file)",
        f"error: {tmp_path / 'no_final.jsonl'}:1: field 'answer' has no '#### <final answer>' (data.test_file)",
        f"error: {tmp_path / 'no_answer.jsonl'}:1: field 'answer' is missing or empty (data.held_out.x)",
        f"error: {tmp_path / 'no_model'}: model folder not found (model.path)",
    ]


def test_check_lists_every_bad_row_of_a_file_in_one_run(tmp_path, capsys):
    """Five different bad rows among good ones: all five, in file order, from one check."""
    good = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}
    rows = [
        json.dumps(good),
        "{not json",
        json.dumps({"question": "q", "answer": "#### two"}),
        json.dumps(good),
        json.dumps({"question": "", "answer": "#### 1"}),
        json.dumps({"question": "q", "answer": "no final"}),
        json.dumps({"question": "q", "answer": "#### 3", "idx": "7"}),
        json.dumps(good),
    ]
    (tmp_path / "five.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert _exit_code(["check", str(_jsonl_recipe(tmp_path, sft_file=tmp_path / "five.jsonl"))]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    five = str(tmp_path / "five.jsonl")
    assert [line.split(": ")[1] for line in lines] == [f"{five}:{n}" for n in (2, 3, 5, 6, 7)]
    assert "'two' is not a number" in lines[1] and all(line.endswith("(data.sft_file)") for line in lines)


def test_check_passes_a_good_recipe_in_seconds(tmp_path, capsys):
    recipe = _jsonl_recipe(tmp_path)
    main(["check", str(recipe)])
    said = json.loads(capsys.readouterr().out)
    assert said["ok"] is True and said["disk"]["free_mib"] > 0
    assert not (tmp_path / "runs").exists()  # nothing made


def test_check_estimates_the_disk_a_run_needs_and_refuses_too_little(tmp_path, capsys, monkeypatch):
    """The estimate follows the recipe's sizes (checkpoints kept, rounds, reward models), and a run
    whose checkpoints would not fit is refused before it starts, naming the output folder."""
    import shutil
    from types import SimpleNamespace

    from grpo_core.check import disk_needed
    from grpo_core.config import ModelConfig
    from grpo_core.lm.modeling import init_model, meta_parameter_count, save_model
    from grpo_core.lm.shapes import parameter_count
    from grpo_core.recipe import load_config

    minute = Path(__file__).resolve().parents[2] / "configs" / "minute.yaml"
    base = disk_needed(load_config(minute))
    model, tokenizer = init_model(load_config(minute).model, seed=0)
    # Counted without torch: the tiny model's from its shape, a folder's from its safetensors headers.
    numel = sum(p.numel() for p in model.parameters())
    assert parameter_count(load_config(minute).model) == meta_parameter_count(load_config(minute).model) == numel
    folder = ModelConfig(init="pretrained", path=str(save_model(model, tokenizer, tmp_path / "saved")))
    assert parameter_count(folder) == meta_parameter_count(folder) == numel
    weights = 4 * parameter_count(load_config(minute).model)  # fp32
    # SFT and one round's GRPO (2 checkpoints, best, model each), and a third checkpoint at the peak
    assert base == (3 * 2 + 2) * weights * 2 + 3 * weights
    assert disk_needed(load_config(minute, ["rounds.count=3"])) == (3 * 2 + 2) * weights * 4 + 3 * weights
    assert disk_needed(load_config(minute, ["sft.keep_checkpoints=1"])) == base - 3 * weights
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(free=1024, total=real(p).total))
    assert _exit_code(["check", str(minute), "--set", f"output_dir={tmp_path / 'runs'}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'runs'}: 0 MiB free, and the run's checkpoints and models need about ")
    assert "keep_checkpoints" in line


@pytest.mark.parametrize("bad", ["missing", "malformed", "no-final", "empty"])
def test_run_with_bad_data_stops_before_anything_starts(tmp_path, capsys, monkeypatch, bad):
    """Exit 2, one line naming the file, no traceback; no flow run, no tracking store touched, no run folder."""
    import flows.pipeline

    monkeypatch.setattr(flows.pipeline, "pipeline", lambda cfg: pytest.fail("the pipeline flow started"))
    monkeypatch.setattr("flows.cli.tracking_ready", lambda cfg: pytest.fail("the tracking store was asked"))
    path = tmp_path / "data.jsonl"
    if bad == "malformed":
        path.write_text('{"question": ', encoding="utf-8")
    elif bad == "no-final":
        _jsonl(path, [{"question": "q", "answer": "two"}])
    elif bad == "empty":
        path.write_text("\n", encoding="utf-8")
    assert _exit_code(["run", str(_jsonl_recipe(tmp_path, rl_file=path))]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_a_recipe_that_is_not_text_is_refused_in_one_line(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    assert _exit_code(["check", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {recipe}: not a text file") and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------- run: invalid recipes


@pytest.mark.parametrize(
    "text, field",
    [
        ("sft:\n  bogus_key: 1\n", "sft.bogus_key"),
        ("grpo:\n  group_size: 1\n", "grpo.group_size"),
        ("model:\n  hidden_size: 30\n  num_heads: 4\n", "model"),
    ],
    ids=["unknown-key", "group-of-one", "heads-not-dividing"],
)
def test_run_rejects_invalid_config(tmp_path, capsys, text, field):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    assert _exit_code(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert field in err and str(recipe) in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "override, field",
    [
        ("grpo.group_size=1", "grpo.group_size"),
        ("nosuch.key=3", "nosuch"),
        ("grpo.clip_eps=-1", "grpo.clip_eps"),
    ],
)
def test_run_rejects_invalid_override(tmp_path, capsys, override, field):
    recipe = tmp_path / "ok.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'runs'}\n")
    assert _exit_code(["run", str(recipe), "--set", override]) == 2
    err = capsys.readouterr().err
    assert field in err
    assert not (tmp_path / "runs").exists()


def test_run_missing_config_file(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert _exit_code(["run", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


# ---------------------------------------------------------------------------- eval


def test_eval_prints_one_json_object(tmp_path, capsys, tiny_model_dir):
    data = _jsonl(tmp_path / "test.jsonl", QUESTIONS)
    main(["eval", "--model", str(tiny_model_dir), "--data", str(data), "--samples", "2", "--max-new-tokens", "8"])
    out = capsys.readouterr().out.strip()
    metrics = json.loads(out)  # exactly one JSON document on stdout
    assert isinstance(metrics, dict)
    assert metrics["n"] == 3
    for key in ("accuracy", "maj@2", "pass@2"):
        assert 0.0 <= metrics[key] <= 1.0, key
    assert metrics["maj@2"] <= metrics["pass@2"]


def test_eval_greedy_only_without_samples(tmp_path, capsys, tiny_model_dir):
    data = _jsonl(tmp_path / "test.jsonl", QUESTIONS)
    main(
        [
            "eval",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(data),
            "--max-new-tokens",
            "4",
            "--n",
            "2",
            "--per-question",
            str(tmp_path / "pq.json"),
        ]
    )
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["n"] == 2 and "accuracy" in metrics
    assert not any(k.startswith(("maj@", "pass@")) for k in metrics)
    per_question = json.loads((tmp_path / "pq.json").read_text())  # one 0/1 per question, averaging to accuracy
    assert len(per_question) == 2 and set(per_question) <= {0, 1}
    assert sum(per_question) / 2 == metrics["accuracy"]


def test_eval_reads_another_benchmarks_form(tmp_path, capsys, tiny_model_dir):
    """``--format svamp``: SVAMP's Body / Question / Answer; a malformed row is named by file and line."""
    rows = [{"Body": "Sam has 2 apples.", "Question": "What is 2 + 1?", "Answer": 3.0}] * 2
    data = _jsonl(tmp_path / "svamp.jsonl", rows + [{"Body": "B.", "Question": "Q?"}])
    assert _exit_code(["eval", "--model", str(tiny_model_dir), "--data", str(data), "--format", "svamp"]) == 2
    assert f"{data}:3: field 'Answer' must be a finite number" in capsys.readouterr().err
    main(
        [
            "eval",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(data),
            "--format",
            "svamp",
            "--n",
            "2",
            "--max-new-tokens",
            "4",
        ]
    )
    assert json.loads(capsys.readouterr().out)["n"] == 2


def test_eval_missing_model_folder(tmp_path, capsys):
    data = _jsonl(tmp_path / "test.jsonl", QUESTIONS)
    missing = tmp_path / "no_such_model"
    assert _exit_code(["eval", "--model", str(missing), "--data", str(data)]) == 2
    captured = capsys.readouterr()
    assert str(missing) in captured.err and captured.out == ""


def test_eval_folder_without_model(tmp_path, capsys):
    data = _jsonl(tmp_path / "test.jsonl", QUESTIONS)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _exit_code(["eval", "--model", str(empty), "--data", str(data)]) == 2
    assert str(empty) in capsys.readouterr().err


def test_eval_malformed_jsonl_names_file_and_line(tmp_path, capsys, tiny_model_dir):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps(QUESTIONS[0]) + "\n" + '{"question": "What is 1 + 1?", "answer": \n')
    assert _exit_code(["eval", "--model", str(tiny_model_dir), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2" in err


def test_eval_missing_data_file(tmp_path, capsys, tiny_model_dir):
    missing = tmp_path / "absent.jsonl"
    assert _exit_code(["eval", "--model", str(tiny_model_dir), "--data", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_gpu_recipe_on_a_machine_without_one_is_refused_in_one_line(tmp_path, capsys, command):
    """``launch.device=cuda`` (and with 4 processes) where torch sees no CUDA device: exit 2 before
    anything starts, one line naming the key and what this machine's torch sees."""
    import time

    for sets in (["launch.device=cuda"], ["launch.device=cuda", "launch.nproc=4"]):
        started = time.monotonic()
        assert _exit_code([command, str(_jsonl_recipe(tmp_path)), *(x for s in sets for x in ("--set", s))]) == 2
        said = capsys.readouterr().err.strip().splitlines()
        assert (
            len(said) == 1
            and said[0].startswith("error: launch.device: cuda, but torch ")
            and "sees no CUDA device on this machine" in said[0]
        ), said
        assert time.monotonic() - started < 20
    assert not (tmp_path / "runs").exists()


def test_a_rendezvous_port_in_use_on_this_machine_is_refused(tmp_path, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sets = ["launch.nnodes=2", f"launch.rdzv_endpoint=127.0.0.1:{port}"]
        assert _exit_code(["check", str(_jsonl_recipe(tmp_path)), *(x for s in sets for x in ("--set", s))]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: launch.rdzv_endpoint: port {port} on this machine is in use; the rendezvous needs it free "
        "(another run, or pick another port)"
    ]


def test_a_run_folder_has_one_writer(prefect_harness, tiny_cfg, tmp_path, capsys):
    """A second run on a folder another process holds refuses at once, naming that process; once the
    holder is gone (SIGKILL: no cleanup) the next run takes the folder over and says whose lock it found."""
    import signal
    import time

    from tasks.run_lock import LOCK, RunInUse, run_lock

    run_dir = tmp_path / "runs" / "demo"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from tasks.run_lock import run_lock\n"
            f"with run_lock({str(run_dir)!r}, 'pipeline demo'):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            RunInUse, match=rf"{run_dir} is in use by process {holder.pid} on .* \(pipeline demo, since"
        ):
            with run_lock(run_dir, "pipeline demo"):
                pass
        # `grpo-pipeline run` on that folder says the same and exits 2 before any stage runs.
        import yaml

        recipe = tmp_path / "tiny.yaml"
        recipe.write_text(yaml.safe_dump(tiny_cfg(tmp_path, run_name="demo").model_dump(mode="json")))
        for command in ("check", "run"):  # refused in one line before Prefect's server starts
            started = time.monotonic()
            assert _exit_code([command, str(recipe)]) == 2
            said = capsys.readouterr().err.strip().splitlines()
            assert len(said) == 1 and f"is in use by process {holder.pid}" in said[0], said
            assert time.monotonic() - started < 10
        assert not (run_dir / "data").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with run_lock(run_dir, "pipeline demo") as note:
        assert f"taking over the lock left by process {holder.pid}" in note
        with run_lock(run_dir, "rl-rounds demo"):  # the same process again: re-entrant
            assert json.loads((run_dir / LOCK).read_text())["command"] == "pipeline demo"
    assert (run_dir / LOCK).read_text() == ""  # released cleanly: nothing to report next time
    start = time.time()
    with run_lock(run_dir, "pipeline demo"):
        assert time.time() - start < 1


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10"])
def test_ui_on_an_address_other_than_loopback_needs_expose(host, capsys):
    """The UIs have no login: serving them beyond loopback is refused unless asked for, saying why."""
    assert _exit_code(["ui", "--host", host]) == 2
    err = capsys.readouterr().err
    assert f"--host {host}" in err and "--expose" in err and "no login" in err


def test_ctrl_c_exits_130_saying_what_finished_and_where_the_same_command_resumes(tmp_path, capsys, monkeypatch):
    """One line: the stages this command finished (their manifests written since it started), and
    each unfinished stage's newest whole checkpoint, where the same command resumes."""
    import os

    run_dir = tmp_path / "runs" / "demo"  # the recipe's output_dir and run_name
    for stage in ("data", "sft"):  # finished before this command: not its news
        (run_dir / stage).mkdir(parents=True)
        (run_dir / stage / "manifest.json").write_text("{}")
        os.utime(run_dir / stage / "manifest.json", (1, 1))
    for step, whole in ((50, True), (100, True), (150, False)):  # step 150 was being written
        (run_dir / "round-1" / "grpo" / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        if whole:
            (run_dir / "round-1" / "grpo" / "checkpoints" / f"step-{step:08d}" / "COMPLETE").write_text("{}")

    def interrupted(a):
        (run_dir / "round-1" / "reward_data").mkdir(parents=True)
        (run_dir / "round-1" / "reward_data" / "manifest.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr("flows.cli.cmd_check", interrupted)
    assert _exit_code(["check", str(_jsonl_recipe(tmp_path))]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "interrupted: finished now: round-1/reward_data; finished before: data, sft; the same command takes the "
        "finished ones from the cache and resumes round-1/grpo from step 100"
    ]
    # A stage stopped before its first checkpoint resumes from its start, and the line says so.
    shutil.rmtree(run_dir / "round-1" / "grpo")

    def in_the_orm(a):
        (run_dir / "round-1" / "orm").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr("flows.cli.cmd_check", in_the_orm)
    assert _exit_code(["check", str(_jsonl_recipe(tmp_path))]) == 130
    assert (
        capsys.readouterr().err.strip().endswith("finished ones from the cache and resumes round-1/orm from its start")
    )
    # An experiment's seed, stopped after its step-20 checkpoint, is named where it resumes.
    seed = run_dir / "compare" / "steps-30-eval6" / "rule-outcome" / "seed-1"

    def in_an_experiment(a):
        (seed / "checkpoints" / "step-00000020").mkdir(parents=True)
        (seed / "checkpoints" / "step-00000020" / "COMPLETE").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr("flows.cli.cmd_check", in_an_experiment)
    assert _exit_code(["check", str(_jsonl_recipe(tmp_path))]) == 130
    assert capsys.readouterr().err.strip().endswith("resumes compare/steps-30-eval6/rule-outcome/seed-1 from step 20")


@pytest.mark.slow
@pytest.mark.parametrize(
    "command,how",
    [("run", "ctrl-c"), ("rounds", "ctrl-c"), ("run", "sigterm"), ("run", "sigterm-group")],
)
def test_a_stopped_run_leaves_no_process_says_where_it_stopped_and_the_same_command_resumes(tmp_path, command, how):
    """Ctrl-C as a terminal sends it (SIGINT to the command's whole process group, Prefect's
    temporary server included), SIGTERM to the command alone, or SIGTERM to its whole group (what
    ``timeout``, a scheduler or a container stop send), mid-run (``run``, or ``rounds`` adding a
    round to a finished run): exit 130 / 143 within seconds, one line naming the stage that resumes
    and its step and no word of a server, no process left, and the same command finishes from the
    cache and the checkpoint."""
    import os
    import signal
    import time

    import psutil

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_"))}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    run_dir = tmp_path / "runs" / "minute"
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        str(root / "configs" / "minute.yaml"),
        "--set",
        f"output_dir={tmp_path / 'runs'}",
        "--set",
        "grpo.max_steps=400",
        "--set",
        "grpo.checkpoint_every=5",
        "--json",
    ]
    stage = "round-1/grpo"
    if command == "rounds":  # a finished run first, then the round it adds is stopped
        subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=True)
        cmd, stage = (
            [sys.executable, "-m", "flows.cli", "rounds", str(run_dir), "--rounds", "1", "--json"],
            "round-2/grpo",
        )
    checkpoints = run_dir / stage / "checkpoints"
    with open(tmp_path / "first.log", "w") as log:
        run = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(960):  # until the stage has written a checkpoint
            time.sleep(0.25)
            if any(checkpoints.glob("step-*/COMPLETE")):
                break
        processes = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
        assert len(processes) > 1 and any(checkpoints.glob("step-*/COMPLETE")), "no server, or no checkpoint"
        stopped = time.monotonic()
        if how == "ctrl-c":
            os.killpg(run.pid, signal.SIGINT)
        elif how == "sigterm-group":
            os.killpg(run.pid, signal.SIGTERM)
        else:
            run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == (130 if how == "ctrl-c" else 143)
        assert time.monotonic() - stopped < 30
    said = (tmp_path / "first.log").read_text()
    last = said.strip().splitlines()[-1]
    assert last.startswith("interrupted: " if how == "ctrl-c" else "terminated: ")
    assert "server" not in said.lower().replace("temporary server on", ""), said[-2000:]
    assert f"resumes {stage} from step " in last and "from the cache" in last, last
    time.sleep(2)
    assert not [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    again = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "[grpo] resuming from step " in again.stdout + again.stderr
    done = json.loads(again.stdout)
    if command == "run":
        assert "sft" in done["cached_stages"]
    else:
        assert [r["round"] for r in done["rounds"]] == [1, 2] and "grpo" in done["rounds"][0]["cached_stages"]


@pytest.mark.parametrize("debug", [True])  # (without --debug: the next test, a real NaN)
def test_a_stage_that_fails_mid_run_is_one_line_naming_it(prefect_harness, tmp_path, capsys, monkeypatch, debug):
    """Exit 1 with the stage, its folder and the cause's first line (--debug: the error itself); the
    stage's MLflow run ends FAILED with the error as a tag."""
    from mlflow.tracking import MlflowClient

    import grpo_core.stages.sft as sft

    def nan(*args, **kwargs):
        raise FloatingPointError("the loss is NaN at step 3\n(a second line of detail)")

    monkeypatch.setattr(sft, "run_sft", nan)
    recipe = _jsonl_recipe(tmp_path)
    db = f"sqlite:///{tmp_path}/mlflow.db"
    argv = ["--debug"] * debug + ["run", str(recipe), "--set", f"tracking.tracking_uri={db}"]
    if debug:
        with pytest.raises(FloatingPointError, match="NaN at step 3"):
            main(argv)
    else:
        assert _exit_code(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("error: stage sft failed: FloatingPointError: the loss is NaN at step 3 (its folder: ")
        assert "run the same command to resume" in err and "second line" not in err
    client = MlflowClient(db)
    [sft_run] = client.search_runs(
        [client.get_experiment_by_name("grpo-pipeline").experiment_id], filter_string="attributes.run_name = 'sft'"
    )
    assert sft_run.info.status == "FAILED" and "NaN at step 3" in sft_run.data.tags["error"]


def test_a_loss_that_turns_nan_stops_the_run_and_the_same_command_resumes_to_the_same_model(
    prefect_harness, tmp_path, capsys, monkeypatch
):
    """NaN in SFT's loss at step 3: exit 1, one line naming the stage, the step and the checkpoint the
    same command resumes from (step 2); the stage's MLflow run FAILED, the Prefect flow run Failed.
    Run again: it resumes, and its models are those of a run that never failed."""
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client

    import grpo_core.stages.lm_step as lm_step

    db = f"sqlite:///{tmp_path}/mlflow.db"
    minute = Path(__file__).resolve().parents[2] / "configs" / "minute.yaml"

    def argv(out: str) -> list[str]:
        return [
            "run",
            str(minute),
            "--set",
            f"output_dir={tmp_path / out}",
            "--set",
            f"tracking.tracking_uri={db}",
            "--set",
            "sft.max_steps=4",
            "--set",
            "sft.checkpoint_every=2",
        ]

    real, calls = lm_step.lm_loss, []

    def poisoned(*args, **kwargs):
        loss, n_tokens = real(*args, **kwargs)
        calls.extend([1] * args[0].training)  # training steps only (validation computes a loss too)
        return (loss * float("nan") if args[0].training and len(calls) == 3 else loss), n_tokens

    monkeypatch.setattr(lm_step, "lm_loss", poisoned)
    assert _exit_code(argv("runs")) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: stage sft failed: FloatingPointError: sft step 3: the gradient is not finite"), err
    assert "its last checkpoint (step 2) is where the same command resumes" in err
    assert "(its folder: " in err and "run the same command to resume" in err
    client = MlflowClient(db)
    [failed] = client.search_runs(
        [client.get_experiment_by_name("grpo-pipeline").experiment_id], filter_string="attributes.run_name = 'sft'"
    )
    assert failed.info.status == "FAILED" and "not finite" in failed.data.tags["error"]
    with get_client(sync_client=True) as prefect:
        mine = [
            r
            for r in prefect.read_flow_runs()
            if r.parameters.get("config", {}).get("output_dir") == str(tmp_path / "runs")
        ]
    assert [r.state.type.value for r in mine] == ["FAILED"]

    monkeypatch.undo()
    main(argv("runs"))  # exit 0
    resumed = json.loads((tmp_path / "runs" / "minute" / "manifest.json").read_text())
    main(argv("clean"))
    clean = json.loads((tmp_path / "clean" / "minute" / "manifest.json").read_text())
    assert "sft" not in resumed["cached_stages"]
    for stage in ("sft", "round-1/grpo"):

        def node(m, stage=stage):
            return m["stages"][stage] if "/" not in stage else m["rounds"][0]["stages"][stage.split("/")[1]]

        assert node(resumed)["digest"] == node(clean)["digest"], stage


def test_check_runs_the_data_stage_logic_without_writing(tmp_path, capsys):
    """A training split left empty once the test questions are removed from it: found by `check`,
    as the data stage would find it minutes later."""
    same = str(_jsonl(tmp_path / "same.jsonl", QUESTIONS))
    assert _exit_code(["check", str(_jsonl_recipe(tmp_path, sft_file=same, test_file=same))]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: split 'sft' is empty after removing questions shared with val/test/held-out sets (data)"
    )

"""bench/grpo_step.py's contract: on any local causal-LM folder and a prompt file ({"prompt","gold"}
or GSM8K form) it prints one JSON object with the step time, token rate and peak memory; the PPO
worker (the memory comparison) runs the same step plus a value model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "grpo_step.py"
OUR_PARTS = {"rollout_s", "reward_s", "advantage_s", "logprob_s", "update_s", "other_s"}  # our step's timed phases


def _bench(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("form", ["prompt-gold", "gsm8k"])
def test_ours_on_a_model_folder_and_prompt_file(tmp_path, tiny_model_dir, form):
    rows = (
        [{"prompt": f"What is {i} + 1?\n", "gold": str(i + 1)} for i in range(8)]
        if form == "prompt-gold"
        else [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(8)]
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _bench(
        "--model",
        str(tiny_model_dir),
        "--prompts",
        str(prompts),
        "--steps",
        "2",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--json",
    )
    ours = out["ours"]
    assert ours["steps_timed"] == 1 and ours["median_step_s"] > 0
    assert ours["completion_tokens_per_s"] > 0 and ours["peak_rss_mib"] > 0
    assert set(ours["median_parts_s"]) == OUR_PARTS
    assert out["work"] == {"prompts": 8, "completions_per_prompt": 8, "max_new_tokens": 32, "beta": 0.04, "lr": 1e-6}


def test_the_ppo_worker_adds_a_value_model(tmp_path, tiny_model_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i}+1=", "gold": str(i + 1)}) + "\n" for i in range(8)))
    ppo = _bench(
        "--worker", "ppo", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--steps", "1", "--threads", "1"
    )
    assert len(ppo["step_s"]) == 1 and ppo["peak_rss_mib"] > ppo["rss_before_models_mib"] > 0


def test_the_checkpointing_worker_runs_our_step_with_each_layer_recomputed(tmp_path, tiny_model_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i}+1=", "gold": str(i + 1)}) + "\n" for i in range(8)))
    args = ("--model", str(tiny_model_dir), "--prompts", str(prompts), "--steps", "1", "--threads", "1")
    out = _bench("--worker", "ours-checkpointing", *args)
    assert len(out["step_s"]) == 1 and out["peak_rss_mib"] > 0


def test_saved_activations_fall_with_grouped_attention_and_with_the_shared_prompt_under_checkpointing():
    """bench/saved_activations.py at small sizes: keys and values not repeated save bytes; with each
    layer recomputed, computing each prompt once keeps fewer layer inputs than every row's."""
    done = subprocess.run(
        [sys.executable, str(BENCH.parent / "saved_activations.py"), "--prompt", "24", "--tokens", "6", "--group", "4"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["grouped"]["per_layer_mib"] < out["stored"]["per_layer_mib"]
    assert (
        out["checkpointed"]["per_layer_mib"]
        < out["checkpointed-plain"]["per_layer_mib"]
        < out["grouped"]["per_layer_mib"]
    )
    assert 0 < out["checkpointed_over_checkpointed-plain"] < 1


@pytest.mark.parametrize("forward_only", [False, True])
def test_grouped_attention_bench_times_both_attentions_on_the_same_rows(forward_only):
    """bench/grouped_attention.py at small sizes: each attention timed every round after its warm-up,
    and the ratio of their medians; the update's pass or the reference's forward alone."""
    cmd = [sys.executable, str(BENCH.parent / "grouped_attention.py"), "--layers", "1", "--prompts", "2"]
    cmd += ["--group", "2", "--prompt", "8", "--tokens", "4", "--rounds", "2", "--threads", "1"]
    cmd += ["--forward-only"] if forward_only else []
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["rows"] == 4 and all(len(out["seconds"][k]) == 2 for k in ("plain", "grouped"))
    assert out["pass"] == ("forward" if forward_only else "forward and backward")
    ratio = out["median_s"]["grouped"] / out["median_s"]["plain"]  # of the medians as printed (4 places)
    assert out["grouped_over_plain"] == pytest.approx(ratio, rel=0.02)


def test_sft_bench_prints_ours_against_the_limit():
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH.with_name("sft_step.py")),
            "--only",
            "ours",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--rounds",
            "1",
            "--threads",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ours"]["steps_timed"] == 1 and out["ours"]["input_tokens_per_step"] == 16 * 256
    assert out["arithmetic_limit_s"] > 0 and out["ours"]["over_arithmetic_limit"] > 0


def test_short_prompts_build_the_outside_checks_shape(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH.with_name("short_prompts.py")), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert 1_000_000 < out["parameters"] < 1_100_000 and out["prompt_tokens"]["max"] <= 27
    rows = [json.loads(line) for line in Path(out["prompts"]).read_text().splitlines()]
    assert all(r["prompt"].startswith("What is ") and r["gold"].lstrip("-").isdigit() for r in rows)


def test_cli_startup_bench_times_the_answers_and_lists_the_slowest_imports():
    done = subprocess.run(
        [sys.executable, str(BENCH.with_name("cli_startup.py")), "--repeat", "1", "--imports", "3"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("help", "check_demo", "refuse_in_use"):
        assert out[f"{key}_s"] > out["python_s"] > 0 and out[f"{key}_over_python"] > 1
    assert len(out["check_demo_slowest_imports"]) == 3
    # check on the demo's recipe imports neither torch nor transformers, Prefect nor MLflow
    assert out["check_demo_imports"] == {"torch": False, "transformers": False, "prefect": False, "mlflow": False}


def test_sampling_bench_times_ours_and_generate():
    done = subprocess.run(
        [sys.executable, str(BENCH.with_name("sampling.py")), "--repeat", "1", "--threads", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for case in ("greedy", "grouped"):
        assert out[case]["rows"] == 128 and out[case]["generate_over_ours"] > 0 and out[case]["arithmetic_limit_s"] > 0
        for name in ("ours", "generate", "generate_static_compiled"):
            assert out[case][name]["tokens_per_s"] > 0 and out[case][name]["over_arithmetic_limit"] > 1


CORPUS = BENCH.parents[2] / "shared" / "data" / "corpus" / "docs.jsonl.gz"


@pytest.mark.skipif(not CORPUS.exists(), reason=f"the shared labelled corpus is not at {CORPUS}")
def test_corpus_scoring_bench_times_bare_predict_and_score_pool():
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH.with_name("corpus_scoring.py")),
            "--pages",
            "2000",
            "--repeat",
            "1",
            "--bucket",
            "20000",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["pages"] == 2000 and out["bucket"] == 20000
    for name in ("bare_predict", "bare_huge_pages", "score_pool_1_worker", "score_pool"):
        assert out[f"{name}_pages_per_s"] > 0
    assert (
        out["score_pool_vs_bare"] > 0
        and 0 < out["score_pool_load_s"] <= out["score_pool_startup_s"] < out["score_pool_s"]
    )


def test_reward_model_bench_times_ours_and_a_plain_transformers_loop():
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH.with_name("reward_model_step.py")),
            "--steps",
            "2",
            "--warmup",
            "1",
            "--rounds",
            "1",
            "--threads",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("ours", "transformers"):
        assert (
            out[name]["steps_timed"] == 1 and out[name]["median_step_s"] > 0 and out[name]["over_arithmetic_limit"] > 0
        )
    # Equal work: the same rows, so the same tokens.
    assert out["ours"]["input_tokens_per_step"] == out["transformers"]["input_tokens_per_step"] > 0
    assert out["transformers_over_ours"] > 0 and out["arithmetic_limit_s"] > 0


def test_numerics_bench_times_the_steps_with_the_setting_and_without():
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH.with_name("numerics.py")),
            "--rounds",
            "1",
            "--steps",
            "3",
            "--threads",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for step in ("grpo", "sft", "reward_model"):
        assert out[step]["project_median_step_s"] > 0 and out[step]["off_median_step_s"] > 0
    assert out["matmul_1024"]["project_gflops"] > 0 and out["matmul_1024"]["off_gflops"] > 0
    project, off = out["alignment_mismatches"]["project"], out["alignment_mismatches"]["off"]
    mkl = project["mkl_mode"] is not None  # None: a torch without MKL
    assert project == {"mkl_mode": "AUTO" if mkl else None, "linear": 0, "causal_attention": 0, "log_softmax": 0}
    assert off["mkl_mode"] == ("OFF" if mkl else None) and set(off) == set(project)
    variants = set(out["same_bits_as_default"])  # another thread count, CPU capability, MKL path
    assert {"threads_2", "threads_2_mkl_strict", "mkl_compatible"} < variants and len(variants) == 4


def _tiny_prompts(tmp_path) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i}+1=", "gold": str(i + 1)}) + "\n" for i in range(8)))
    return prompts


def test_like_for_like_sets_each_implementation_against_the_others_at_every_length(tmp_path, tiny_model_dir):
    """bench/like_for_like.py: grpo_step --compare at each length on fresh weights; a row per length
    and implementation with its phases, the work as asked (2 prompts x 2 completions)."""
    args = ["--model", str(tiny_model_dir), "--prompts", str(_tiny_prompts(tmp_path)), "--threads", "1"]
    args += ["--steps", "2", "--warmup", "1", "--rounds", "1", "--prompts-per-step", "2", "--group", "2"]
    done = subprocess.run(
        [sys.executable, str(BENCH.with_name("like_for_like.py")), "--lengths", "3,6", "--only", "ours,ours-unshared"]
        + args,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(r["max_new_tokens"], r["implementation"]) for r in out["table"]] == [
        (3, "ours"),
        (3, "ours-unshared"),
        (6, "ours"),
        (6, "ours-unshared"),
    ]
    for row in out["table"]:
        assert 0 < row["completion_tokens_per_step"] <= 2 * 2 * row["max_new_tokens"]  # the rows' tokens
        assert row["time_over_trl"] is None and row["peak_rss_over_start_mib"] > 0
        assert set(row["median_parts_s"]) == OUR_PARTS
    six = out["by_length"]["6"]
    assert six["fresh_weights"] and six["work"]["max_new_tokens"] == 6 and six["work"]["prompts"] == 2
    assert "ours-unshared_over_ours" in six and "memory_ours-unshared_over_ours" in six


def test_like_for_like_refuses_the_settings_it_sets_itself():
    done = subprocess.run(
        [sys.executable, str(BENCH.with_name("like_for_like.py")), "--max-new", "64"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0 and "--max-new: set by like_for_like.py itself" in done.stderr


def test_the_unshared_worker_computes_every_rows_prompt(tmp_path, tiny_model_dir, monkeypatch):
    """``shared_prompt=False``: the log-prob passes never run a shared prompt pass (``PromptKV``),
    which ``ours`` does; sampling's prefill is unchanged (in this process: the module attributes the
    workers patch are restored)."""
    import importlib.util

    import torch

    import grpo_core.lm.policy
    import grpo_core.lm.prompt_cache
    import grpo_core.stages.rl_step

    for module, name in (
        (grpo_core.lm.policy, "distinct_prompts"),
        (grpo_core.stages.rl_step, "prompt_text"),
        (grpo_core.stages.rl_step, "generate"),
    ):
        monkeypatch.setattr(module, name, getattr(module, name))
    spec = importlib.util.spec_from_file_location("grpo_step_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclass looks its module up
    spec.loader.exec_module(bench)
    prompt_passes = []

    class CountedPromptKV(grpo_core.lm.prompt_cache.PromptKV):
        def __init__(self, *a, **k):
            prompt_passes.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(grpo_core.lm.prompt_cache, "PromptKV", CountedPromptKV)
    args = (str(tiny_model_dir), str(_tiny_prompts(tmp_path)), 1, torch.get_num_threads())
    assert len(bench.WORKERS["ours"](*args, work=bench.Work(2, 2, 3))["step_s"]) == 1
    shared = len(prompt_passes)
    assert shared > 0  # ours: the reference pass and the update each ran the prompts once
    assert len(bench.WORKERS["ours-unshared"](*args, work=bench.Work(2, 2, 3))["step_s"]) == 1
    assert len(prompt_passes) == shared  # unshared: every row's prompt in the one plain pass


def test_trl_worker_times_each_phase(tmp_path, tiny_model_dir):
    pytest.importorskip("trl", reason="TRL is the bench extra (make bench installs trl==1.16.0)")
    args = ["--model", str(tiny_model_dir), "--prompts", str(_tiny_prompts(tmp_path)), "--threads", "1"]
    out = _bench("--worker", "trl", *args, "--steps", "2", "--prompts-per-step", "2", "--group", "2", "--max-new", "4")
    assert len(out["step_s"]) == len(out["parts"]) == 2
    for part in out["parts"]:
        assert set(part) == {"rollout_s", "reward_s", "logprob_s", "update_s", "other_s"}
        assert min(part["rollout_s"], part["reward_s"], part["logprob_s"], part["update_s"]) > 0
        assert part["other_s"] >= 0  # the timed phases lie inside the preparation, counted once
    assert out["work"] == {"prompts": 2, "group": 2, "max_new": 4}


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="reads Linux's /proc/PID/smaps_rollup")
def test_tree_memory_sums_a_commands_processes_and_passes_its_exit_status():
    """bench/tree_memory.py: a command whose child holds 200 MiB beside its own 100 MiB peaks at their
    sum (both processes counted), and the command's exit status is its own."""
    hold = "import time; x = bytearray({} * 2**20); x[::4096] = b'1' * len(x[::4096]); time.sleep(3)"
    script = f"import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', {hold.format(200)!r}]); "
    script += hold.format(100) + "; c.wait(); sys.exit(3)"
    tool = Path(__file__).resolve().parents[2] / "bench" / "tree_memory.py"
    done = subprocess.run(
        [sys.executable, str(tool), "--", sys.executable, "-c", script], capture_output=True, text=True
    )
    assert done.returncode == 3, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["returncode"] == 3 and 300 <= out["peak_sum_of_pss"]["mib"] <= out["peak_sum_of_rss"]["mib"] < 400
    assert len(out["peak_sum_of_pss"]["processes"]) == 2

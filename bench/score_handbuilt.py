"""Reward models on hand-built solutions of questions the run never generated (JSON out).

For N questions drawn from the demo task's spec (2-4 operands 1..9) that appear in none of the run's
splits, it writes one right solution and one with a single wrong step (a result off by 1-3 at a
random step, carried on consistently, so only that step and the ones after it are wrong) and scores
them through ``grpo-pipeline score``'s code path. Reports the ORM's AUC (right vs wrong solutions),
the PRM's step AUC against the exact step labels, and how often the PRM's first step below 0.5 is
the planted wrong step.

    python bench/score_handbuilt.py runs/demo [--n 500] [--seed 1]
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from grpo_core.data import arithmetic_solution, load_jsonl, prompt_text
from grpo_core.reward_models import first_wrong_step, roc_auc
from grpo_core.scoring import score
from grpo_core.steps import exact_step_labels, step_texts


def unseen_questions(data_dir: Path, n: int, seed: int) -> list[tuple[list[int], list[str]]]:
    seen = {e.question for split in ("sft", "rl", "val", "test") for e in load_jsonl(str(data_dir / f"{split}.jsonl"))}
    rng, out, drawn = random.Random(seed), [], set()
    while len(out) < n:
        k = rng.choice([2, 3, 3, 4])
        operands, ops = [rng.randint(1, 9) for _ in range(k)], [rng.choice("+-") for _ in range(k - 1)]
        q = "What is " + " ".join([str(operands[0])] + [f"{o} {x}" for o, x in zip(ops, operands[1:])]) + "?"
        if q not in seen and q not in drawn:
            drawn.add(q)
            out.append((operands, ops))
    return out


def with_slip(operands: list[int], ops: list[str], at: int, delta: int) -> str:
    """The left-to-right chain with step ``at``'s result off by ``delta``, carried on."""
    value, lines = operands[0], []
    for i, (op, x) in enumerate(zip(ops, operands[1:])):
        new = (value + x if op == "+" else value - x) + (delta if i == at else 0)
        lines.append(f"{value} {op} {x} = {new}")
        value = new
    return "\n".join(lines + [f"#### {value}"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--orm", help="an ORM folder (default: the run's last round's)")
    p.add_argument("--prm", help="a PRM folder (default: the run's last round's)")
    a = p.parse_args()
    run = Path(a.run_dir)
    manifest = json.loads((run / "manifest.json").read_text())
    rng = random.Random(a.seed)
    rows, labels = [], []
    for operands, ops in unseen_questions(Path(manifest["data_dir"]), a.n, a.seed):
        question = "What is " + " ".join([str(operands[0])] + [f"{o} {x}" for o, x in zip(ops, operands[1:])]) + "?"
        right, gold = arithmetic_solution(operands, ops)
        wrong = with_slip(operands, ops, rng.randrange(len(ops)), rng.choice([-3, -2, -1, 1, 2, 3]))
        for text in (right, wrong):
            rows.append((prompt_text(question), text))
            labels.append(exact_step_labels(question, step_texts(text), str(gold)))
    out: dict = {"n_questions": a.n, "n_solutions": len(rows), "seed": a.seed}
    rms = {k: (v["path"] if isinstance(v, dict) else v) for k, v in manifest.get("reward_models", {}).items()}
    rms |= {k: v for k, v in (("orm", a.orm), ("prm", a.prm)) if v}
    if "orm" in rms:
        scores = [r["score"] for r in score(rms["orm"], rows)]
        out["orm_auc"] = roc_auc(scores, [all(x) for x in labels])
    if "prm" in rms:
        steps = [r["step_scores"] for r in score(rms["prm"], rows)]
        flat = [(p, y) for s, ys in zip(steps, labels) for p, y in zip(s, ys)]
        out["prm_step_auc_exact"] = roc_auc([p for p, _ in flat], [y for _, y in flat])
        wrong = [(s, ys) for s, ys in zip(steps, labels) if first_wrong_step(ys) is not None]
        out["prm_first_wrong_step_detected"] = sum(
            first_wrong_step([p >= 0.5 for p in s]) == first_wrong_step(ys) for s, ys in wrong) / len(wrong)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

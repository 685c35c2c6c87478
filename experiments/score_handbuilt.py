"""Reward models on hand-built solutions of questions the run never generated (JSON out).

For N questions of the demo task's spec that appear in none of the run's splits
(``unseen_questions.py``), it writes the right solution and one wrong solution of each kind:

  slip       one step's result off by 1-3, carried on (that step and the ones after it are wrong)
  final_off  every step right, the ``####`` answer off by one
  operand    one step copies an operand of the question off by 1-3 and computes correctly from it
  operator   one step applies the other operator (+ for -) and computes correctly from it

and scores them through ``grpo-pipeline score``'s code path. Reports the ORM's AUC of right against
each kind of wrong solution, the PRM's step AUC against the exact step labels, per kind how often
the PRM's first step below 0.5 is the first wrong one, and for both how often the right solution of
a question scores above its wrong one (the PRM by its lowest step), per kind and over all: what
GRPO's group-normalised reward sees. No kind is in the demo's training data (the reward models
learn from the policy's own samples only). ``--orm`` / ``--prm`` may name a causal LM (the
zero-training verifier: its own token probabilities).

    python experiments/score_handbuilt.py runs/demo [--n 500] [--seed 1] [--orm DIR] [--prm DIR]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from grpo_core.data import arithmetic_solution, prompt_text
from grpo_core.rewards.heads import first_wrong_step, roc_auc
from grpo_core.rewards.score_command import score
from grpo_core.rewards.steps import exact_step_labels, step_texts
from unseen_questions import question_text, unseen_questions  # experiments/ (run as a script)

WRONG_KINDS = ("slip", "final_off", "operand", "operator")


def wrong_chain(
    operands: list[int], ops: list[str], at: int, delta: int = 0, operand: int | None = None, op: str | None = None
) -> str:
    """The left-to-right chain with step ``at`` changed: its result off by ``delta``, or its operand
    read as ``operand``, or its operator ``op``; later steps carry its value on."""
    value, lines = operands[0], []
    for i, (o, x) in enumerate(zip(ops, operands[1:])):
        if i == at:
            o, x = op or o, x if operand is None else operand
        new = (value + x if o == "+" else value - x) + (delta if i == at else 0)
        lines.append(f"{value} {o} {x} = {new}")
        value = new
    return "\n".join(lines + [f"#### {value}"])


def wrong_solutions(operands: list[int], ops: list[str], right: str, gold: int, rng: random.Random) -> dict[str, str]:
    """One wrong solution of each kind (module docstring) for the question ``operands``/``ops``."""
    at, off = rng.randrange(len(ops)), rng.choice([-3, -2, -1, 1, 2, 3])
    copied = operands[at + 1] + off if operands[at + 1] + off > 0 else operands[at + 1] - off
    return {
        "slip": wrong_chain(operands, ops, at, delta=off),
        "final_off": right.rsplit("\n", 1)[0] + f"\n#### {gold + rng.choice([-1, 1])}",
        "operand": wrong_chain(operands, ops, at, operand=copied),
        "operator": wrong_chain(operands, ops, at, op="-" if ops[at] == "+" else "+"),
    }


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
    rows, labels, kinds = [], [], []
    for operands, ops in unseen_questions(run, a.n, a.seed):
        question = question_text(operands, ops)
        right, gold = arithmetic_solution(operands, ops)
        for kind, text in {"right": right, **wrong_solutions(operands, ops, right, gold, rng)}.items():
            rows.append((prompt_text(question), text))
            labels.append(exact_step_labels(question, step_texts(text), str(gold)))
            kinds.append(kind)
    out: dict = {"n_questions": a.n, "n_solutions": len(rows), "seed": a.seed}
    rms = {k: (v["path"] if isinstance(v, dict) else v) for k, v in manifest.get("reward_models", {}).items()}
    rms |= {k: v for k, v in (("orm", a.orm), ("prm", a.prm)) if v}
    per_question = 1 + len(WRONG_KINDS)  # rows come as (right, each wrong kind) per question

    def right_above_wrong(values: list[float], wrong_kind: str | None = None) -> float:
        wins = [
            values[i] > values[i + j]
            for i in range(0, len(values), per_question)
            for j, k in enumerate(WRONG_KINDS, 1)
            if wrong_kind in (None, k)
        ]
        return sum(wins) / len(wins)

    def report(name: str, values: list[float]) -> None:
        out[f"{name}_same_question_right_above_wrong"] = right_above_wrong(values)
        for k in WRONG_KINDS:
            out[f"{name}_same_question_right_above_wrong_{k}"] = right_above_wrong(values, k)

    if "orm" in rms:
        scores = [r["score"] for r in score(rms["orm"], rows)]
        report("orm", scores)
        for wrong_kind in WRONG_KINDS:  # right solutions against one kind of wrong ones
            pick = [i for i, k in enumerate(kinds) if k in ("right", wrong_kind)]
            out[f"orm_auc_{wrong_kind}"] = roc_auc([scores[i] for i in pick], [kinds[i] == "right" for i in pick])
    if "prm" in rms:
        steps = [r["step_scores"] for r in score(rms["prm"], rows)]
        report("prm", [min(s, default=float("nan")) for s in steps])
        flat = [(p, y) for s, ys in zip(steps, labels) for p, y in zip(s, ys)]
        out["prm_step_auc_exact"] = roc_auc([p for p, _ in flat], [y for _, y in flat])
        for wrong_kind in WRONG_KINDS:
            wrong = [(s, ys) for s, ys, k in zip(steps, labels, kinds) if k == wrong_kind]
            out[f"prm_first_wrong_step_detected_{wrong_kind}"] = sum(
                first_wrong_step([p >= 0.5 for p in s]) == first_wrong_step(ys) for s, ys in wrong
            ) / len(wrong)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

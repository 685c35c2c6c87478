"""Reward models on hand-built solutions of questions the run never generated (JSON out).

For N questions of the demo task's spec that appear in none of the run's splits
(``unseen_questions.py``), it writes three solutions: the right one, a ``slip`` (one step's result off
by 1-3, carried on, so that step and the ones after it are wrong) and a ``final_off`` (every step
right, the ``####`` answer off by one), and scores them through ``grpo-pipeline score``'s code path.
Reports the ORM's AUC of right against each kind of wrong solution, the PRM's step AUC against the
exact step labels, per kind how often the PRM's first step below 0.5 is the first wrong one, and
for both how often the right solution of a question scores above each of its wrong ones (the PRM by
its lowest step): what GRPO's group-normalised reward sees. ``--orm`` / ``--prm`` may name a causal
LM (the zero-training verifier: its own token probabilities).

    python bench/score_handbuilt.py runs/demo [--n 500] [--seed 1] [--orm DIR] [--prm DIR]
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
from unseen_questions import question_text, unseen_questions  # bench/ (run as a script)


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
    rows, labels, kinds = [], [], []
    for operands, ops in unseen_questions(run, a.n, a.seed):
        question = question_text(operands, ops)
        right, gold = arithmetic_solution(operands, ops)
        slip = with_slip(operands, ops, rng.randrange(len(ops)), rng.choice([-3, -2, -1, 1, 2, 3]))
        final_off = right.rsplit("\n", 1)[0] + f"\n#### {gold + rng.choice([-1, 1])}"  # every step right but the answer
        for kind, text in (("right", right), ("slip", slip), ("final_off", final_off)):
            rows.append((prompt_text(question), text))
            labels.append(exact_step_labels(question, step_texts(text), str(gold)))
            kinds.append(kind)
    out: dict = {"n_questions": a.n, "n_solutions": len(rows), "seed": a.seed}
    rms = {k: (v["path"] if isinstance(v, dict) else v) for k, v in manifest.get("reward_models", {}).items()}
    rms |= {k: v for k, v in (("orm", a.orm), ("prm", a.prm)) if v}

    def right_above_wrong(values: list[float]) -> float:  # rows come as (right, slip, final_off) per question
        wins = [values[i] > values[i + j] for i in range(0, len(values), 3) for j in (1, 2)]
        return sum(wins) / len(wins)

    if "orm" in rms:
        scores = [r["score"] for r in score(rms["orm"], rows)]
        out["orm_same_question_right_above_wrong"] = right_above_wrong(scores)
        for wrong_kind in ("slip", "final_off"):  # right solutions against one kind of wrong ones
            pick = [i for i, k in enumerate(kinds) if k in ("right", wrong_kind)]
            out[f"orm_auc_{wrong_kind}"] = roc_auc([scores[i] for i in pick], [kinds[i] == "right" for i in pick])
    if "prm" in rms:
        steps = [r["step_scores"] for r in score(rms["prm"], rows)]
        out["prm_same_question_right_above_wrong"] = right_above_wrong([min(s, default=float("nan")) for s in steps])
        flat = [(p, y) for s, ys in zip(steps, labels) for p, y in zip(s, ys)]
        out["prm_step_auc_exact"] = roc_auc([p for p, _ in flat], [y for _, y in flat])
        for wrong_kind in ("slip", "final_off"):
            wrong = [(s, ys) for s, ys, k in zip(steps, labels, kinds) if k == wrong_kind]
            out[f"prm_first_wrong_step_detected_{wrong_kind}"] = sum(
                first_wrong_step([p >= 0.5 for p in s]) == first_wrong_step(ys) for s, ys in wrong) / len(wrong)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""How a reward model is measured on held-out reward data: a row's solution and its steps as the
model reads them (``step_batch``, which the PRM's loss reads too), the ORM's and the PRM's
evaluations and their metrics: the ranking within a question (what GRPO's group-normalised reward
sees) beside the pooled AUC and, for a PRM, step accuracy and the first wrong step found."""

from __future__ import annotations

import torch

from grpo_core.lm.policy import encode
from grpo_core.rewards.heads import first_wrong_step, orm_logits, prm_step_logits, question_aucs, roc_auc
from grpo_core.stats import question_interval
from grpo_core.rewards.steps import rollout_step_ends


def solution_text(row: dict, separator: str) -> str:
    """A reward-data row's solution: the sample as generated when the dataset has it (ours does),
    else its steps joined (TRL's step form)."""
    return row.get("completion") or separator.join(row.get("completions", []))


def step_batch(tokenizer, rows: list[dict], separator: str, label: str):
    """Rollout of the solutions in ``rows`` and [B, K] step ends, labels and mask."""
    texts = [solution_text(r, separator) for r in rows]
    rollout = encode(tokenizer, [r["prompt"] for r in rows], texts)
    ends, mask = rollout_step_ends(tokenizer, rollout, separator)  # as GRPO finds them on its rollouts
    labels = torch.zeros(mask.shape)
    for i, (r, text) in enumerate(zip(rows, texts)):
        values = r["soft_labels"] if label == "soft" else [float(x) for x in r["labels"]]
        m = int(mask[i].sum())
        if m != len(values):
            raise ValueError(
                f"step data row {i} of the batch: {len(values)} labels for {m} steps of "
                f"{text!r} split on {separator!r}; was the data labelled with another separator?"
            )
        labels[i, :m] = torch.tensor(values, dtype=torch.float)
    return rollout, ends, labels, mask


def within_question(scores: list[float], labels: list[bool], questions: list) -> dict[str, float]:
    """What GRPO's group-normalised reward sees of a scorer: the AUC within each question with right
    and wrong solutions, averaged over those questions (``within_question_auc``), with a 95% t
    interval over them (``_low``, ``_high``: the questions are the sample; NaN with fewer than 2)."""
    aucs = list(question_aucs(scores, labels, questions).values())
    nan = dict.fromkeys(("mean", "low", "high"), float("nan"))
    spread = question_interval(aucs, [0.0] * len(aucs)) if aucs else nan
    return {
        "within_question_auc": spread["mean"],
        "within_question_auc_low": spread["low"],
        "within_question_auc_high": spread["high"],
        "mixed_questions": float(len(aucs)),
    }


def solution_metrics(scores: list[float], rows: list[dict]) -> dict[str, float]:
    """Held-out quality of solution scores against ``rows``' ``correct``: what GRPO's group-normalised
    reward sees (``within_question``) beside the AUC pooled across questions (where length and
    operands help)."""
    labels = [bool(r["correct"]) for r in rows]
    return {
        **within_question(scores, labels, [r["prompt"] for r in rows]),
        "auc": roc_auc(scores, labels),
        "n_solutions": float(len(rows)),
    }


def prm_step_metrics(probs: list[list[float]], rows: list[dict]) -> dict[str, float]:
    """Held-out quality of per-step probabilities against ``rows``' step labels: step accuracy and
    AUC (against the exact labels too where present), how often the first step scored < 0.5 is the
    first step labelled wrong, and within each question the AUC of the lowest step against a
    solution having no wrong step (what GRPO sees of a PRM whose lowest step is the reward)."""
    flat = [(x, y) for r, p in zip(rows, probs) for x, y in zip(p, r["labels"])]
    exact = [(x, y) for r, p in zip(rows, probs) if r["exact_labels"] for x, y in zip(p, r["exact_labels"])]
    with_error = [(r, p) for r, p in zip(rows, probs) if first_wrong_step(r["labels"]) is not None]
    found = sum(first_wrong_step([x >= 0.5 for x in p]) == first_wrong_step(r["labels"]) for r, p in with_error)
    scored = [
        (min(p), all(r["labels"]), r["prompt"]) for r, p in zip(rows, probs) if p
    ]  # a solution with no step: no verdict
    out = {
        **within_question(*map(list, zip(*scored)) if scored else ([], [], [])),
        "step_accuracy": sum((x >= 0.5) == y for x, y in flat) / max(1, len(flat)),
        "step_auc": roc_auc([x for x, _ in flat], [y for _, y in flat]),
        "first_wrong_step_detected": found / max(1, len(with_error)),
        "n_steps": float(len(flat)),
    }
    if exact:
        out["step_auc_exact"] = roc_auc([x for x, _ in exact], [y for _, y in exact])
    return out


@torch.no_grad()
def evaluate_orm(model, tokenizer, held_out: dict[str, list[dict]], separator: str, batch: int) -> dict[str, float]:
    """``solution_metrics`` of the ORM's scores of the held-out ``solutions``, and its accuracy on
    the held-out ``pairs`` (chosen above rejected)."""
    model.eval()
    pairs, solutions, wins, scores = held_out["pairs"], held_out["solutions"], 0, []
    for s in range(0, len(pairs), batch):
        rows = pairs[s : s + batch]
        both = orm_logits(
            model,
            encode(
                tokenizer, [r["prompt"] for r in rows] * 2, [r["chosen"] for r in rows] + [r["rejected"] for r in rows]
            ),
        )
        wins += int((both[: len(rows)] > both[len(rows) :]).sum())
    for s in range(0, len(solutions), batch):
        rows = solutions[s : s + batch]
        scores += orm_logits(
            model, encode(tokenizer, [r["prompt"] for r in rows], [r["completion"] for r in rows])
        ).tolist()
    model.train()
    return solution_metrics(scores, solutions) | ({"pairwise_accuracy": wins / len(pairs)} if pairs else {})


@torch.no_grad()
def evaluate_prm(model, tokenizer, held_out: dict[str, list[dict]], separator: str, batch: int) -> dict[str, float]:
    """``prm_step_metrics`` of the PRM's step probabilities on the held-out ``steps``."""
    model.eval()
    rows, probs = held_out["steps"], []
    for s in range(0, len(rows), batch):
        part = rows[s : s + batch]
        rollout, ends, _, mask = step_batch(tokenizer, part, separator, "hard")
        p = torch.sigmoid(prm_step_logits(model, rollout, ends))
        probs += [p[i, : int(mask[i].sum())].tolist() for i in range(len(part))]
    model.train()
    return prm_step_metrics(probs, rows)

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


Ranking = tuple[list[float], list[bool], list[str]]  # what is ranked within a question: scores, verdicts, questions


def solution_ranking(scores: list[float], rows: list[dict]) -> Ranking:
    """An ORM's reading: each solution's score against the checker's verdict."""
    return scores, [bool(r["correct"]) for r in rows], [r["prompt"] for r in rows]


def step_ranking(probs: list[list[float]], rows: list[dict]) -> Ranking:
    """A PRM's reading as GRPO's outcome reward takes it: each solution's lowest step score against
    its having no step labelled wrong (a solution with no step has no verdict and is left out)."""
    scored = [(min(p), all(r["labels"]), r["prompt"]) for r, p in zip(rows, probs) if p]
    return tuple(map(list, zip(*scored))) if scored else ([], [], [])


def over_questions(aucs: list[float]) -> dict[str, float]:
    """The mean of per-question AUCs with its 95% t interval over the questions (``mean``, ``low``,
    ``high``; NaN with none, the interval NaN with fewer than 2)."""
    if not aucs:
        return dict.fromkeys(("mean", "low", "high"), float("nan"))
    return question_interval(aucs, [0.0] * len(aucs))


def within_question(ranking: Ranking, baseline: dict[str, float] | None = None) -> dict[str, float]:
    """What GRPO's group-normalised reward sees of a scorer: the AUC within each question with right
    and wrong solutions, averaged over those questions (``within_question_auc``), with a 95% t
    interval over them (``_low``, ``_high``: the questions are the sample; NaN with fewer than 2).
    ``baseline``: another scorer's AUC by question on the same rows (``question_aucs``; the SFT
    model's likelihood): the mean difference over the questions both rank, with its paired interval
    (``within_question_auc_minus_baseline``, ``_low``, ``_high``)."""
    nan = dict.fromkeys(("mean", "low", "high"), float("nan"))
    by_question = question_aucs(*ranking)
    aucs = list(by_question.values())
    spread = over_questions(aucs)
    out = {
        "within_question_auc": spread["mean"],
        "within_question_auc_low": spread["low"],
        "within_question_auc_high": spread["high"],
        "mixed_questions": float(len(aucs)),
    }
    if baseline is not None:
        both = [q for q in by_question if q in baseline]
        gain = question_interval([by_question[q] for q in both], [baseline[q] for q in both]) if both else nan
        out |= {
            f"within_question_auc_minus_baseline{end}": gain[k]
            for end, k in (("", "mean"), ("_low", "low"), ("_high", "high"))
        }
    return out


def solution_metrics(
    scores: list[float], rows: list[dict], baseline: dict[str, float] | None = None
) -> dict[str, float]:
    """Held-out quality of solution scores against ``rows``' ``correct``: what GRPO's group-normalised
    reward sees (``within_question``, against ``baseline``) beside the AUC pooled across questions
    (where length and operands help)."""
    ranking = solution_ranking(scores, rows)
    return {
        **within_question(ranking, baseline),
        "auc": roc_auc(scores, ranking[1]),
        "n_solutions": float(len(rows)),
    }


def centred_step_auc(probs: list[list[float]], rows: list[dict]) -> dict[str, float]:
    """What the centred process credit reads of a PRM (``advantages.centred_process_advantages``: a
    step's score against the mean of the same step of the completions of its question and outcome
    class): the AUC of step scores against step labels among the steps at one position of one
    question's solutions with the same outcome (the last step's label: the checker's verdict under
    Monte-Carlo labels), for each group whose labels are mixed; averaged within each question, then
    over the questions, with a 95% t interval over them (the questions are the sample, as in
    ``within_question``): ``step_auc_centred``, ``_low``, ``_high``, ``centred_questions``."""
    groups: dict[tuple, tuple[list[float], list[bool]]] = {}
    for r, p in zip(rows, probs):
        for k, (x, y) in enumerate(zip(p, r["labels"])):
            scores, labels = groups.setdefault((r["prompt"], bool(r["labels"][-1]), k), ([], []))
            scores.append(x)
            labels.append(bool(y))
    by_question: dict[str, list[float]] = {}
    for (question, _, _), (x, y) in groups.items():
        if any(y) and not all(y):
            by_question.setdefault(question, []).append(roc_auc(x, y))
    aucs = [sum(a) / len(a) for a in by_question.values()]
    spread = over_questions(aucs)
    return {
        "step_auc_centred": spread["mean"],
        "step_auc_centred_low": spread["low"],
        "step_auc_centred_high": spread["high"],
        "centred_questions": float(len(aucs)),
    }


def prm_step_metrics(
    probs: list[list[float]], rows: list[dict], baseline: dict[str, float] | None = None
) -> dict[str, float]:
    """Held-out quality of per-step probabilities against ``rows``' step labels: step accuracy and
    AUC (against the exact labels too where present), how often the first step scored < 0.5 is the
    first step labelled wrong, and within each question the AUC of the lowest step against a
    solution having no wrong step (what GRPO sees of a PRM whose lowest step is the reward:
    ``step_ranking``; against ``baseline`` as ``within_question`` takes it), and what the centred
    process credit sees of its steps (``centred_step_auc``)."""
    flat = [(x, y) for r, p in zip(rows, probs) for x, y in zip(p, r["labels"])]
    exact = [(x, y) for r, p in zip(rows, probs) if r["exact_labels"] for x, y in zip(p, r["exact_labels"])]
    with_error = [(r, p) for r, p in zip(rows, probs) if first_wrong_step(r["labels"]) is not None]
    found = sum(first_wrong_step([x >= 0.5 for x in p]) == first_wrong_step(r["labels"]) for r, p in with_error)
    out = {
        **within_question(step_ranking(probs, rows), baseline),
        **centred_step_auc(probs, rows),
        "step_accuracy": sum((x >= 0.5) == y for x, y in flat) / max(1, len(flat)),
        "step_auc": roc_auc([x for x, _ in flat], [y for _, y in flat]),
        "first_wrong_step_detected": found / max(1, len(with_error)),
        "n_steps": float(len(flat)),
    }
    if exact:
        out["step_auc_exact"] = roc_auc([x for x, _ in exact], [y for _, y in exact])
    return out


@torch.no_grad()
def evaluate_orm(
    model, tokenizer, held_out: dict[str, list[dict]], separator: str, batch: int, baseline: dict | None = None
) -> dict[str, float]:
    """``solution_metrics`` of the ORM's scores of the held-out ``solutions`` (against ``baseline``),
    and its accuracy on the held-out ``pairs`` (chosen above rejected)."""
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
    return solution_metrics(scores, solutions, baseline) | ({"pairwise_accuracy": wins / len(pairs)} if pairs else {})


@torch.no_grad()
def evaluate_prm(
    model, tokenizer, held_out: dict[str, list[dict]], separator: str, batch: int, baseline: dict | None = None
) -> dict[str, float]:
    """``prm_step_metrics`` of the PRM's step probabilities on the held-out ``steps`` (against ``baseline``)."""
    model.eval()
    rows, probs = held_out["steps"], []
    for s in range(0, len(rows), batch):
        part = rows[s : s + batch]
        rollout, ends, _, mask = step_batch(tokenizer, part, separator, "hard")
        p = torch.sigmoid(prm_step_logits(model, rollout, ends))
        probs += [p[i, : int(mask[i].sum())].tolist() for i in range(len(part))]
    model.train()
    return prm_step_metrics(probs, rows, baseline)

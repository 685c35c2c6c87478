"""Reward-model training data from a policy's own samples (DeepSeekMath §4; Math-Shepherd labels).

Outcome data: per question, pairs (chosen = a correct sample, rejected = an incorrect one) in TRL's
``prompt`` / ``chosen`` / ``rejected`` form. Step data: every sample split into steps, each labelled
Math-Shepherd style by rolling out ``n`` completions from the prefix that ends with it (hard label:
some rollout reaches the gold answer; soft label: the fraction that do), in TRL's stepwise
``prompt`` / ``completions`` / ``labels`` form. ``Completer`` is any function from prompts to
completions (the policy, or a stub with known success probabilities in tests).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from grpo_core.data import Example, prompt_text
from grpo_core.rewards.steps import exact_step_labels, step_texts
from grpo_core.verify import is_correct

# prompts -> one completion each (sampled)
Completer = Callable[[list[str]], list[str]]


@dataclass
class Sampled:
    example: Example
    completions: list[str]
    correct: list[bool]


def sample_solutions(complete: Completer, examples: list[Example], k: int) -> list[Sampled]:
    """k samples per question, each checked against the gold answer."""
    prompts = [prompt_text(e.question) for e in examples for _ in range(k)]
    texts = complete(prompts)
    out = []
    for i, e in enumerate(examples):
        group = texts[i * k : (i + 1) * k]
        out.append(Sampled(e, group, [is_correct(t, e.gold) for t in group]))
    return out


def outcome_pairs(samples: list[Sampled], max_pairs: int, seed: int) -> list[dict]:
    """Up to ``max_pairs`` (chosen correct, rejected incorrect) pairs per question, drawn without
    repeating a pair; questions whose samples are all right or all wrong give none."""
    rng = random.Random(seed)
    rows = []
    for s in samples:
        good = sorted({t for t, ok in zip(s.completions, s.correct) if ok})
        bad = sorted({t for t, ok in zip(s.completions, s.correct) if not ok})
        pairs = [(g, b) for g in good for b in bad]
        for g, b in rng.sample(pairs, min(max_pairs, len(pairs))):
            rows.append({"prompt": prompt_text(s.example.question), "chosen": g, "rejected": b})
    return rows


def mc_step_labels(
    complete: Completer, prompt: str, steps: list[str], gold: str, n: int, separator: str = "\n"
) -> tuple[list[bool], list[float]]:
    """Math-Shepherd labels of one solution's steps: (hard, soft), each [K].

    For step k, ``n`` completions continue from ``prompt + steps[0..k] + separator``; hard = any
    reaches ``gold``, soft = the fraction that do. The last step needs no rollout: its label is
    whether the whole solution is correct.
    """
    return mc_step_labels_batch(complete, [(prompt, steps, gold)], n, separator)[0]


def mc_step_labels_batch(
    complete: Completer, items: list[tuple[str, list[str], str]], n: int, separator: str = "\n"
) -> list[tuple[list[bool], list[float]]]:
    """``mc_step_labels`` for many solutions with one call to ``complete`` (batched generation).
    Solutions of one question that begin alike share the rollouts of their common prefixes: a
    prefix is rolled out ``n`` times once, however many solutions it begins (the same estimate)."""
    owners: dict[str, list[tuple[int, int, str]]] = {}  # prompt + prefix -> the (solution, step)s it ends
    for i, (prompt, steps, _) in enumerate(items):
        for k in range(len(steps) - 1):
            prefix = separator.join(steps[: k + 1]) + separator
            owners.setdefault(prompt + prefix, []).append((i, k, prefix))
    texts = complete([start for start in owners for _ in range(n)]) if owners else []
    wins: dict[tuple[int, int], int] = {}
    for j, ends in enumerate(owners.values()):
        for text in texts[j * n : (j + 1) * n]:
            for i, k, prefix in ends:
                wins[(i, k)] = wins.get((i, k), 0) + is_correct(prefix + text, items[i][2])
    out = []
    for i, (_, steps, gold) in enumerate(items):
        soft = [wins.get((i, k), 0) / n for k in range(len(steps) - 1)]
        if steps:
            soft.append(float(is_correct(separator.join(steps), gold)))
        out.append(([x > 0 for x in soft], soft))
    return out


def step_rows(samples: list[Sampled], complete: Completer | None, n: int, separator: str) -> list[dict]:
    """TRL stepwise rows for every sample with at least one step.

    ``labels`` are the Monte-Carlo hard labels (or the exact ones when ``complete`` is None),
    ``soft_labels`` the Monte-Carlo fractions, ``exact_labels`` the arithmetic checker's verdicts
    (empty when the question is not arithmetic), ``completion`` the sample as generated: the PRM
    trains on it, so it sees the very text (whitespace included) it will score in GRPO.
    """
    items, metas, raws = [], [], []
    for s in samples:
        for text in sorted(set(s.completions)):
            steps = step_texts(text, separator)
            if steps:
                items.append((prompt_text(s.example.question), steps, s.example.gold))
                metas.append(s.example)
                raws.append(text)
    exact = [exact_step_labels(e.question, steps, e.gold) or [] for (_, steps, _), e in zip(items, metas)]
    if complete is None:
        if any(not x for x in exact):
            raise ValueError("labeler=exact works only for the arithmetic task; use labeler=mc")
        mc = [([bool(y) for y in x], [float(y) for y in x]) for x in exact]
    else:
        mc = mc_step_labels_batch(complete, items, n, separator)
    return [
        {"prompt": p, "completions": steps, "labels": hard, "soft_labels": soft, "exact_labels": ex, "completion": raw}
        for (p, steps, _), (hard, soft), ex, raw in zip(items, mc, exact, raws)
    ]


def label_agreement(rows: list[dict]) -> dict[str, float]:
    """How often the Monte-Carlo hard labels agree with the exact ones (over steps that have both)."""
    pairs = [(a, b) for r in rows if r["exact_labels"] for a, b in zip(r["labels"], r["exact_labels"])]
    if not pairs:
        return {}
    mc_true_exact_false = sum(a and not b for a, b in pairs)
    return {
        "mc_exact_agreement": sum(a == b for a, b in pairs) / len(pairs),
        "mc_true_exact_false": mc_true_exact_false / len(pairs),
        "mc_false_exact_true": sum(b and not a for a, b in pairs) / len(pairs),
        "steps_compared": float(len(pairs)),
    }

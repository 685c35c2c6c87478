"""The reward models' quality gate, from the verdict to what GRPO may use.

The reward-model stage measures its model on held-out samples and gives its verdict
(``quality_gate``: the within-question AUC that GRPO's group-normalised reward sees, against a
threshold and against the SFT model's own likelihood). ``gate_grpo`` decides from those verdicts and
``rounds.on_gate_failure`` what a round's GRPO optimises; the flow only carries it out and reports
the sentences.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_core.config import PipelineConfig


class Gated(NamedTuple):
    """The recipe GRPO runs with, the reward models kept out of its reward, and one sentence per
    reward model driving GRPO that failed its gate (used anyway under ``on_gate_failure: report``)."""

    cfg: PipelineConfig
    excluded: list[str]
    failures: list[str]


def quality_gate(
    metric: str, heldout: dict[str, float], threshold: float, baseline: dict[str, float] | None, min_questions: int = 0
) -> dict:
    """A trained reward model's verdict: its held-out ``metric`` at least ``threshold`` and, where the
    zero-training verifier was measured on the same rows (``baseline``), above it. NaN (one class
    only among the held-out rows) fails; so does a held-out set with fewer than ``min_questions``
    questions with right and wrong solutions (``mixed_questions``), whose verdict is undecided."""
    value = heldout.get(metric, float("nan"))
    gate = {"metric": metric, "value": value, "threshold": threshold, "passed": bool(value >= threshold)}
    if baseline is not None:
        gate["baseline"] = baseline.get(metric, float("nan"))
        gate["beats_baseline"] = bool(value > gate["baseline"])
        gate["passed"] = gate["passed"] and gate["beats_baseline"]
    if min_questions:
        mixed = heldout.get("mixed_questions", 0.0)
        gate |= {"mixed_questions": mixed, "min_questions": min_questions}
        if not mixed >= min_questions:
            gate |= {"passed": False, "undecided": True}
    return gate


def gate_failure(kind: str, gate: dict) -> str | None:
    """What is wrong with a reward model whose quality gate failed (None when it passed or had none)."""
    if not gate or gate["passed"]:
        return None
    undecided = (
        f"{kind.upper()} undecided: held-out too small ({gate['mixed_questions']:.0f} questions with right and "
        f"wrong solutions, fewer than {gate['min_questions']})"
        if gate.get("undecided")
        else ""
    )
    why = (
        [f"{gate['metric']} {gate['value']:.3f} < {gate['threshold']}"]
        if not gate["value"] >= gate["threshold"]
        else []
    )
    if not gate.get("beats_baseline", True):
        why.append(
            f"no better than the zero-training verifier (the SFT model's own likelihood: {gate['baseline']:.3f})"
        )
    if not why:
        return undecided
    failed = (
        f"{kind.upper()} held-out {' and '.join(why)}: GRPO's group-normalised reward ranks one question's "
        f"solutions by it"
    )
    return f"{undecided}; {failed}" if undecided else failed


def gate_grpo(cfg: PipelineConfig, gates: dict[str, dict]) -> Gated:
    """``cfg`` for the round's GRPO given each reward model's ``quality_gate`` (``gates``, by kind).
    A reward model that GRPO uses and that failed is reported; with ``rounds.on_gate_failure:
    exclude`` it also leaves GRPO's reward, and process supervision becomes outcome supervision
    without the PRM. An error when no reward source is left."""
    used = cfg.grpo.reward_models_used
    failures = {kind: sentence for kind in used if (sentence := gate_failure(kind, gates.get(kind) or {}))}
    excluded = list(failures) if cfg.rounds.on_gate_failure == "exclude" else []
    if not excluded:
        return Gated(cfg, [], list(failures.values()))
    weights = {k: w for k, w in cfg.grpo.reward_weights.items() if k not in excluded and w > 0}
    if not weights:
        raise ValueError(
            f"every reward source of grpo.reward_weights ({', '.join(excluded)}) failed its quality gate and "
            f"rounds.on_gate_failure is exclude: nothing is left to drive GRPO; add rule: 1.0 or set "
            f"rounds.on_gate_failure: report"
        )
    process = {} if "prm" in weights else {"supervision": "outcome", "process_credit": "centred"}
    grpo = cfg.grpo.model_validate({**cfg.grpo.model_dump(), "reward_weights": weights, **process})
    return Gated(cfg.model_copy(update={"grpo": grpo}), excluded, list(failures.values()))

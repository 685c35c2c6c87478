"""Outcome and process reward models: losses, scores on rollouts, and their metrics (pure functions).

The ORM is an ``AutoModelForSequenceClassification`` with one output, the PRM an
``AutoModelForTokenClassification`` with one output, both initialised from the SFT checkpoint.
Both are read through their own score head at chosen tokens of a ``Rollout`` (the ORM at the
solution's last token, the PRM at each step's last token) rather than through the library's
pooling: sequence classification finds "the last non-pad token", which is wrong when pad == eos
or rows are left-padded, as GRPO's rollouts are.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from grpo_core.lm import adapters
from grpo_core.lm.policy import Rollout, position_ids
from grpo_core.lm.runtime import model_device
from grpo_core.rewards.likelihood import VerifierHead, reward_head_kind


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """mean -log sigmoid(r_chosen - r_rejected); both [B] scores (logits)."""
    return -F.logsigmoid(r_chosen - r_rejected).mean()


def pointwise_bce_loss(logits: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Outcome reward model trained pointwise (Math-Shepherd's ORM, the paper's "correctness of
    sampled solutions"): mean binary cross-entropy of [B] logits against [B] correctness (0/1).
    Unlike Bradley-Terry pairs, every checked solution is an example and the score is calibrated
    across questions, which is what GRPO's group-normalised reward and an AUC compare."""
    return F.binary_cross_entropy_with_logits(logits, correct.to(logits.dtype))


def step_bce_loss(step_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy over real steps: step_logits, labels (hard 0/1 or soft in [0, 1]) and
    mask are [B, K]; the mean is over steps with mask 1 (0 when there are none)."""
    m = mask.to(step_logits.dtype)
    # Padding may hold anything (NaN included): zero it before the loss, or its gradient is NaN.
    labels = torch.where(m > 0, labels.to(step_logits.dtype), 0.0)
    per_step = F.binary_cross_entropy_with_logits(step_logits, labels, reduction="none")
    return torch.where(m > 0, per_step, 0.0).sum() / m.sum().clamp(min=1)


def roc_auc(scores: list[float], labels: list[bool]) -> float:
    """Area under the ROC curve = P(score of a random positive > a random negative), ties 1/2.

    Mann-Whitney form, O(n log n). NaN when one class is absent.
    """
    pos = sum(1 for y in labels if y)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    rank_sum, i = 0.0, 0
    while i < len(order):  # average ranks over ties
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        avg_rank = (i + j) / 2 + 1
        rank_sum += avg_rank * sum(1 for k in order[i : j + 1] if labels[k])
        i = j + 1
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def within_question_auc(scores: list[float], labels: list[bool], questions: list[str]) -> tuple[float, int]:
    """What GRPO's group-normalised reward sees: the mean over questions with both right and wrong
    solutions of ``roc_auc`` within the question, and how many such questions there are (NaN, 0 when
    none). Cues constant within a question (its length, its operands) score 0.5 here, however well
    they separate right from wrong across questions."""
    aucs = list(question_aucs(scores, labels, questions).values())
    return (sum(aucs) / len(aucs) if aucs else float("nan")), len(aucs)


def question_aucs(scores: list[float], labels: list[bool], questions: list) -> dict:
    """``roc_auc`` within each question that has both right and wrong solutions, by question (in
    order of first appearance): the per-question values ``within_question_auc`` averages."""
    by_question: dict = {}
    for i, q in enumerate(questions):
        by_question.setdefault(q, []).append(i)
    return {
        q: roc_auc([scores[i] for i in rows], [labels[i] for i in rows])
        for q, rows in by_question.items()
        if 0 < sum(bool(labels[i]) for i in rows) < len(rows)
    }


def group_auc(scores: torch.Tensor, correct: torch.Tensor, g: int) -> tuple[float, int]:
    """``within_question_auc`` of GRPO's groups: [N x G] scores of a batch's solutions (a group's G
    rows consecutive) against [N x G] checker verdicts (1 right, 0 wrong). Solutions without a
    finite score are left out. Returns the mean AUC over the groups with both right and wrong
    solutions and how many there are (NaN, 0 when none): the reward model's staleness on the
    samples the policy draws now, when measured on a training step's rollouts."""
    keep = torch.isfinite(scores)
    group = torch.arange(len(scores)) // g
    return within_question_auc(scores[keep].tolist(), correct[keep].bool().tolist(), group[keep].tolist())


def first_wrong_step(flags: list[bool]) -> int | None:
    """Index of the first False in per-step correctness flags, or None if all are True."""
    return next((k for k, ok in enumerate(flags) if not ok), None)


# ------------------------------------------------------------------------------- models


def load_reward_model(path: str | Path, kind: str, head: str = "linear", lm_tokens: tuple[str, str] = ("+", "-")):
    """An ORM (``kind="orm"``) or PRM (``"prm"``) from a causal-LM or RM folder: a trained
    ``VerifierHead`` where the folder holds one, else with ``head="likelihood"`` or ``"lm"`` a fresh
    one reading the folder's causal LM that way (``lm``: through ``lm_tokens``), else a
    classification model with one output (a fresh ``score`` head on a causal LM's body)."""
    import json

    # deferred: transformers, only to load a folder (the losses and readings here need torch alone)
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    from grpo_core.lm.modeling import ModelError, load_model

    if adapters.is_adapter(path):  # a LoRA adapter (sft.lora): its base with it merged, a fresh head on that
        lm, tokenizer = load_model(path)
        return reward_model_from(lm, kind, head, tokenizer, lm_tokens)
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if head != "linear" or reward_head_kind(config):
        return VerifierHead.from_folder(path, kind, "likelihood" if head == "linear" else head, lm_tokens)

    cls = AutoModelForSequenceClassification if kind == "orm" else AutoModelForTokenClassification
    try:
        model = cls.from_pretrained(str(path), num_labels=1)
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot load a {kind.upper()} from this folder: {e}") from None
    if not isinstance(getattr(model, "score", None), torch.nn.Linear):
        raise ModelError(
            f"{path}: {type(model).__name__} has no `score` head (Llama, Qwen, Mistral and "
            f"SmolLM2 have one); reward models are read through it"
        )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = model.config.eos_token_id
    return model


def reward_model_from(lm, kind: str, head: str = "linear", tokenizer=None, lm_tokens: tuple[str, str] = ("+", "-")):
    """An ORM / PRM on the causal LM ``lm`` (in memory; a fresh head). A ``VerifierHead`` needs the
    LM's ``tokenizer``."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        lm.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        return load_reward_model(tmp, kind, head, lm_tokens)


class ScoreHead(torch.nn.Module):
    """A reward model read through its score head at every token from ``start`` on: one module whose
    forward is the whole computation, which is what DDP must wrap to average the gradients."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int) -> torch.Tensor:
        """[B, L] ids and mask -> [B, L - start] score-head logits, on the inputs' device (the
        model may sit on a GPU: the hidden states stay there)."""
        device = model_device(self.model)
        mask = attention_mask.to(device)
        hidden = self.model.base_model(
            input_ids=input_ids.to(device), attention_mask=mask, position_ids=position_ids(mask)
        ).last_hidden_state[:, start:]
        return self.model.score(hidden).squeeze(-1).float().to(input_ids.device)


def token_scores(model, rollout: Rollout) -> torch.Tensor:
    """[B, T] score-head logit at every completion token of ``rollout``. ``model``: a reward model,
    or its ``ScoreHead`` (DDP-wrapped in training)."""
    head = ScoreHead(model) if hasattr(model, "base_model") else model
    # DDP moves a module's inputs to its GPU before forward: bring the scores back explicitly.
    return head(rollout.input_ids, rollout.attention_mask, rollout.prompt_len).to(rollout.input_ids.device)


def state_values(model, rollout: Rollout) -> torch.Tensor:
    """[B, T] a value model's estimate of the state in which each completion token was chosen: the
    score head read at the position before the token (the last prompt token for the first)."""
    return ScoreHead(model)(rollout.input_ids, rollout.attention_mask, rollout.prompt_len - 1)[:, :-1]


def last_token_index(completion_mask: torch.Tensor) -> torch.Tensor:
    """[B] index of the last real completion token (0 for an empty row)."""
    return (completion_mask.sum(dim=1).long() - 1).clamp(min=0)


def is_verifier_head(model) -> bool:
    """A ``VerifierHead`` (also inside a DDP wrapper)."""
    return isinstance(getattr(model, "module", model), VerifierHead)


def orm_logits(orm, rollout: Rollout) -> torch.Tensor:
    """[B] ORM logit of each whole solution, read at its last token (EOS when it finished); a
    ``VerifierHead`` reads its causal LM (``rewards.likelihood``)."""
    if is_verifier_head(orm):
        return orm(rollout.input_ids, rollout.attention_mask, rollout.prompt_len, rollout.completion_mask).to(
            rollout.input_ids.device
        )
    scores = token_scores(orm, rollout)
    return scores.gather(1, last_token_index(rollout.completion_mask)[:, None]).squeeze(1)


def prm_step_logits(prm, rollout: Rollout, step_ends: torch.Tensor) -> torch.Tensor:
    """[B, K] PRM logit at each step's last token; step_ends [B, K] long (padding: any index). A
    ``VerifierHead`` reads its causal LM (``rewards.likelihood``)."""
    if is_verifier_head(prm):
        return prm(
            rollout.input_ids, rollout.attention_mask, rollout.prompt_len, rollout.completion_mask, step_ends
        ).to(rollout.input_ids.device)
    scores = token_scores(prm, rollout)
    return scores.gather(1, step_ends.clamp(0, scores.shape[1] - 1))

"""``grpo-pipeline score``: a reward model's scores of given solutions (a public contract).

An ORM folder gives ``{"score": p}`` per row, P(the solution is right); a PRM folder gives
``{"step_scores": [p1, ...]}``, P(step k is right) for each step, the steps split exactly as the
pipeline splits them (``steps.split_steps`` on the separator saved with the model, the final
``#### answer`` line included). Both are read at the same tokens as in GRPO (``reward_models``).
A causal-LM folder is the zero-training verifier (``likelihood``): each step's score is the lowest
probability the model gives a token of it or of a step before it, the solution's the lowest over all
its tokens; it gives
both fields. A trained ``VerifierHead`` (a causal-LM folder whose config holds ``reward_head``) is
an ORM or PRM like the others. Solutions are untrusted text: they are only tokenized.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from grpo_core.data import json_lines, prompt_text
from grpo_core.lm.policy import encode
from grpo_core.rewards.heads import load_reward_model, orm_logits, prm_step_logits
from grpo_core.rewards.likelihood import likelihood_scores, reward_head_kind
from grpo_core.rewards.steps import rollout_step_ends


class ScoreInputError(ValueError):
    """A malformed input row or model folder; the message names the file and line."""


def reward_model_kind(model_dir: str | Path) -> str:
    """``orm``, ``prm`` or ``lm`` (the zero-training verifier), from the folder's architecture
    (sequence classification, token classification, causal LM)."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
        arch = (config.get("architectures") or [""])[0]
    except (OSError, json.JSONDecodeError) as e:
        raise ScoreInputError(f"{path}: cannot read the model's config: {e}") from None
    if arch.endswith("ForSequenceClassification"):
        return "orm"
    if arch.endswith("ForTokenClassification"):
        return "prm"
    if arch.endswith("ForCausalLM"):  # a trained VerifierHead says which it is
        return reward_head_kind(config) or "lm"
    raise ScoreInputError(
        f"{model_dir}: a {arch or 'model of unknown architecture'} is not a reward model; pass an "
        f"ORM or PRM folder (runs/<run>/round-<k>/orm/model or .../prm/model) or a causal LM"
    )


def read_rows(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, completion) of every row: ``prompt`` as given, or ``question`` in the pipeline's
    prompt template; ``completion`` a string. A bad row stops here, named by file and line."""
    path = Path(path)
    if not path.is_file():
        raise ScoreInputError(f"{path}: file not found")
    out = []
    for n, row in json_lines(path, ScoreInputError):
        if not isinstance(row, dict):
            raise ScoreInputError(f"{path}:{n}: expected an object with question (or prompt) and completion")
        if isinstance(row.get("prompt"), str):
            prompt = row["prompt"]
        elif isinstance(row.get("question"), str):
            prompt = prompt_text(row["question"])
        else:
            raise ScoreInputError(f"{path}:{n}: field question (or prompt) missing or not a string")
        if not isinstance(row.get("completion"), str):
            raise ScoreInputError(f"{path}:{n}: field completion missing or not a string")
        out.append((prompt, row["completion"]))
    return out


@torch.no_grad()
def score(model_dir: str | Path, rows: list[tuple[str, str]], batch_size: int = 64) -> list[dict]:
    """One result per (prompt, completion), in order (see the module docstring)."""
    # deferred: transformers, so that reward_model_kind refuses a wrong folder before it is imported
    from grpo_core.lm.modeling import load_model, load_tokenizer

    kind = reward_model_kind(model_dir)
    if kind == "lm":
        model = load_model(model_dir)[0].eval()
    else:
        model = load_reward_model(model_dir, kind).eval()
    tokenizer = load_tokenizer(model_dir)
    separator = getattr(model.config, "step_separator", None) or "\n"
    out: list[dict] = []
    for s in range(0, len(rows), batch_size):
        part = rows[s : s + batch_size]
        rollout = encode(tokenizer, [p for p, _ in part], [c for _, c in part])
        if kind == "lm":
            whole, steps, mask = likelihood_scores(model, tokenizer, rollout, separator)
            out += [
                {"score": whole[i].item(), "step_scores": steps[i, : int(mask[i].sum())].tolist()}
                for i in range(len(part))
            ]
            continue
        if kind == "orm":
            out += [{"score": p} for p in torch.sigmoid(orm_logits(model, rollout)).tolist()]
            continue
        ends, mask = rollout_step_ends(tokenizer, rollout, separator)
        probs = torch.sigmoid(prm_step_logits(model, rollout, ends))
        out += [{"step_scores": probs[i, : int(mask[i].sum())].tolist()} for i in range(len(part))]
    return out

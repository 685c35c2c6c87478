"""Not a timing: reward-model designs that read the SFT model's own token probabilities, measured as
GRPO uses them, on a finished run's round-1 reward data.

    .venv/bin/python experiments/verifier_designs.py runs/demo [--round 1]

Each design scores the held-out solutions (the run's policy's own samples of held-out questions):
``zero_training`` (``rewards.likelihood``: a step's lowest token probability, a solution's lowest over
all its tokens) and ``calibrated`` (logistic regressions over likelihood features of the same frozen
model, fit on the training split: per step its lowest and mean token log-probability and the lowest
so far; per solution its lowest, mean and last-step lowest), beside the run's trained ORM and PRM.
Prints one JSON object: per design, the ORM-style ``within_question_auc`` of solution scores against
correctness and the PRM-style one of the lowest step against a solution with no wrong step (both over
held-out questions with right and wrong samples), the pooled AUCs, and ``first_wrong_step_detected``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import grpo_core  # noqa: F401  (first: the numerics settings)
from grpo_core.lm.modeling import load_model
from grpo_core.lm.policy import encode, token_logprobs
from grpo_core.rewards.steps import rollout_step_ends
from grpo_core.rewards.score_command import score
from grpo_core.stages.reward_model import solution_metrics, solution_text, prm_step_metrics


@torch.no_grad()
def likelihood_features(lm, tok, rows: list[dict], sep: str, batch: int = 64):
    """Per row: [K, 3] step features (lowest, mean, lowest so far of the step's token log-probs) and
    [3] solution features (lowest over all tokens, mean, the last step's lowest)."""
    steps, sols = [], []
    for s in range(0, len(rows), batch):
        part = rows[s : s + batch]
        texts = [solution_text(r, sep) for r in part]
        rollout = encode(tok, [r["prompt"] for r in part], texts)
        logp = token_logprobs(lm, rollout).float()
        ends, mask = rollout_step_ends(tok, rollout, sep)
        for i in range(len(part)):
            n = int(rollout.completion_mask[i].sum())
            lp = logp[i, :n]
            feats, start, so_far = [], 0, 0.0
            for k in range(int(mask[i].sum())):
                end = int(ends[i, k])
                span = lp[start : end + 1] if end >= start else lp[end : end + 1]
                so_far = min(so_far, float(span.min()))
                feats.append([float(span.min()), float(span.mean()), so_far])
                start = end + 1
            steps.append(torch.tensor(feats).reshape(-1, 3))
            last = feats[-1][0] if feats else 0.0
            sols.append(torch.tensor([float(lp.min()) if n else 0.0, float(lp.mean()) if n else 0.0, last]))
    return steps, sols


def fit_logistic(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardised logistic regression (weights, mean, std), L2 1e-3, LBFGS to convergence."""
    mu, sd = x.mean(0), x.std(0).clamp(min=1e-6)
    z = (x - mu) / sd
    w = torch.zeros(z.shape[1] + 1, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z @ w[1:] + w[0], y) + 1e-3 * w[1:].pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), mu, sd


def apply(w, mu, sd, x: torch.Tensor) -> list[float]:
    return torch.sigmoid(((x - mu) / sd) @ w[1:] + w[0]).tolist()


def heldout(lm, tok, steps: dict, sols: dict, sep: str) -> dict:
    """The likelihood reading of ``lm`` on the held-out rows (as ``zero_training``)."""
    lm.eval()
    step_f, _ = likelihood_features(lm, tok, steps["test"], sep)
    sol_f = likelihood_features(lm, tok, sols["test"], sep)[1]
    lm.train()
    return {
        "orm": solution_metrics([float(f[0].exp()) for f in sol_f], sols["test"]),
        "prm": prm_step_metrics([f[:, 0].exp().tolist() for f in step_f], steps["test"]),
    }


def finetuned(sft_dir: Path, steps: dict, sols: dict, sep: str, a) -> list[dict]:
    """The SFT model fine-tuned as a likelihood verifier: a step's logit is scale * (the lowest
    log-probability of its tokens) + bias, trained with step BCE on the training split's labels, the
    gradient flowing into the model's token probabilities (no new head). Held-out metrics after
    every epoch (epoch 0: the zero-training verifier)."""
    import random

    from grpo_core.rewards.heads import step_bce_loss
    from grpo_core.rewards.likelihood import step_lowest_logprobs
    from grpo_core.stages.reward_model import step_batch

    torch.manual_seed(0)
    lm, tok = load_model(sft_dir)
    scale, bias = torch.nn.Parameter(torch.tensor(1.0)), torch.nn.Parameter(torch.tensor(2.0))
    opt = torch.optim.AdamW(
        [{"params": lm.parameters(), "lr": a.lr}, {"params": [scale, bias], "lr": 1e-2, "weight_decay": 0.0}],
        betas=(0.9, 0.95),
    )
    curve = [{"epoch": 0, **heldout(lm, tok, steps, sols, sep)}]
    train = steps["train"]
    for epoch in range(1, a.finetune_epochs + 1):
        order = list(range(len(train)))
        random.Random(epoch).shuffle(order)
        lm.train()
        for s in range(0, len(order), a.batch):
            rows = [train[i] for i in order[s : s + a.batch]]
            rollout, ends, labels, mask = step_batch(tok, rows, sep, "hard")
            logits = scale * step_lowest_logprobs(token_logprobs(lm, rollout).float(), ends, mask) + bias
            loss = step_bce_loss(logits, labels, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
            opt.step()
        curve.append({"epoch": epoch, "scale": float(scale), "bias": float(bias), **heldout(lm, tok, steps, sols, sep)})
        print(
            json.dumps(
                {
                    "epoch": epoch,
                    "orm_within": curve[-1]["orm"]["within_question_auc"],
                    "prm_within": curve[-1]["prm"]["within_question_auc"],
                }
            ),
            file=sys.stderr,
        )
    return curve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--round", type=int, default=1)
    p.add_argument(
        "--finetune-epochs", type=int, default=0, help="also fine-tune the SFT model as a likelihood verifier"
    )
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    from datasets import load_from_disk

    run = Path(a.run_dir)
    rd = run / f"round-{a.round}" / "reward_data"
    sols = {split: load_from_disk(str(rd / "solutions"))[split].to_list() for split in ("train", "test")}
    steps = {split: load_from_disk(str(rd / "steps"))[split].to_list() for split in ("train", "test")}
    lm, tok = load_model(run / "sft" / "model")  # the SFT model (the run's sft_model)
    lm.eval()
    sep = "\n"
    out: dict = {
        "run": str(run),
        "round": a.round,
        "heldout_solutions": len(sols["test"]),
        "heldout_step_rows": len(steps["test"]),
    }
    feats = {split: likelihood_features(lm, tok, steps[split], sep) for split in ("train", "test")}
    sol_feats = {split: likelihood_features(lm, tok, sols[split], sep)[1] for split in ("train", "test")}
    # zero-training: step = exp(lowest log-prob of its tokens); solution = exp(lowest over all tokens)
    zt_steps = [f[:, 0].exp().tolist() for f in feats["test"][0]]
    zt_sols = [float(f[0].exp()) for f in sol_feats["test"]]
    out["zero_training"] = {
        "orm": solution_metrics(zt_sols, sols["test"]),
        "prm": prm_step_metrics(zt_steps, steps["test"]),
    }
    # calibrated: logistic regressions on the training split's features (the frozen SFT model)
    x = torch.cat(feats["train"][0])
    y = torch.tensor([float(v) for r in steps["train"] for v in r["labels"]])
    w = fit_logistic(x, y)
    cal_steps = [apply(*w, f) if len(f) else [] for f in feats["test"][0]]
    ws = fit_logistic(torch.stack(sol_feats["train"]), torch.tensor([float(r["correct"]) for r in sols["train"]]))
    cal_sols = apply(*ws, torch.stack(sol_feats["test"]))
    out["calibrated"] = {
        "orm": solution_metrics(cal_sols, sols["test"]),
        "prm": prm_step_metrics(cal_steps, steps["test"]),
        "step_weights": w[0].tolist(),
        "solution_weights": ws[0].tolist(),
    }
    if a.finetune_epochs:
        out["finetuned"] = finetuned(run / "sft" / "model", steps, sols, sep, a)
    # the run's trained reward models of that round, on the same rows
    trained = {}
    for kind in ("orm", "prm"):
        model_dir = run / f"round-{a.round}" / kind / "model"
        if model_dir.is_dir():
            rows = sols["test"] if kind == "orm" else steps["test"]
            texts = [(r["prompt"], solution_text(r, sep)) for r in rows]
            scored = score(model_dir, texts)
            trained[kind] = (
                solution_metrics([s["score"] for s in scored], rows)
                if kind == "orm"
                else prm_step_metrics([s["step_scores"] for s in scored], rows)
            )
    out["trained"] = trained
    print(json.dumps(out))


if __name__ == "__main__":
    main()

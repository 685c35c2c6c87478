"""One ORM training step, ours against a plain transformers loop at equal work: the demo's model
body with a one-output score head (``AutoModelForSequenceClassification``), 32 checked solutions of
the demo's questions per step (half with a wrong final answer), pointwise BCE on correctness,
AdamW(0.9, 0.95) at lr 1e-4, gradient clipping at 1.0, fp32 on the CPU.

    .venv/bin/python bench/reward_model_step.py --json

Ours is the reward-model stage's step (``stages.reward_model.orm_loss_terms`` through ``ScoreHead``,
left-padded prompts, the score read at each solution's last token, and
``training.trainer.optimizer_step``); the plain loop tokenizes prompt + solution right-padded and
takes ``model(...).logits`` (transformers reads the score at the last non-pad token). Each runs in
its own process, alternating, ``--rounds`` times, ``--steps`` steps each; medians over the steps
after ``--warmup``. Prints one JSON object: per implementation the median step time, tokens per
step and per second, peak RSS; plain over ours; the matmul rate and the step's arithmetic limit
(6 FLOPs per weight and token, forward + backward).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.grpo_step import matmul_gflops  # noqa: E402
from grpo_core.lm.runtime import peak_rss_mib  # noqa: E402
from bench.sft_step import _summary, step_bench  # noqa: E402

ROWS, LR = 32, 1e-4


def solutions(data: str, tok) -> list[dict]:
    """Checked solutions: each worked solution of the demo's questions, and a copy whose final answer
    is off by one (wrong)."""
    from grpo_core.data import load_jsonl, prompt_text

    rows = []
    for e in load_jsonl(data):
        head, _, answer = e.solution.rpartition(" ")
        wrong = f"{head} {int(answer) + 1}" if answer.lstrip("-").isdigit() else e.solution + "0"
        rows += [
            {"prompt": prompt_text(e.question), "completion": e.solution + tok.eos_token, "correct": True},
            {"prompt": prompt_text(e.question), "completion": wrong + tok.eos_token, "correct": False},
        ]
    random.Random(0).shuffle(rows)
    return rows


def _setup(model_dir: str, threads: int):
    import torch

    from grpo_core.lm.modeling import load_tokenizer
    from grpo_core.rewards.heads import load_reward_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, tok = load_reward_model(model_dir, "orm"), load_tokenizer(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    return model, tok, opt


def run_ours(model_dir: str, data: str, steps: int, threads: int) -> dict:
    from grpo_core.rewards.heads import ScoreHead
    from grpo_core.stages.reward_model import orm_loss_terms
    from grpo_core.training.trainer import optimizer_step

    model, tok, opt = _setup(model_dir, threads)
    rows, head = solutions(data, tok), ScoreHead(model)
    times, tokens = [], []
    for s in range(steps):
        batch = rows[(s * ROWS) % (len(rows) - ROWS) :][:ROWS]
        t0 = time.perf_counter()
        [(loss, _), _] = orm_loss_terms(head, tok, {"solutions": batch}, None)  # (reads no setting)
        optimizer_step(model, opt, loss, 1.0, 1.0)
        times.append(time.perf_counter() - t0)
        tokens.append(float(sum(len(tok(r["prompt"] + r["completion"]).input_ids) for r in batch)))
    return {"step_s": times, "tokens": tokens, "peak_rss_mib": peak_rss_mib(), "threads": threads}


def run_transformers(model_dir: str, data: str, steps: int, threads: int) -> dict:
    import torch
    import torch.nn.functional as F

    model, tok, opt = _setup(model_dir, threads)
    rows = solutions(data, tok)
    times, tokens = [], []
    for s in range(steps):
        batch = rows[(s * ROWS) % (len(rows) - ROWS) :][:ROWS]
        t0 = time.perf_counter()
        enc = tok(
            [r["prompt"] + r["completion"] for r in batch], return_tensors="pt", padding=True, padding_side="right"
        )
        logits = model(**enc).logits.squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, torch.tensor([float(r["correct"]) for r in batch]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        tokens.append(float(enc.attention_mask.sum()))
    return {"step_s": times, "tokens": tokens, "peak_rss_mib": peak_rss_mib(), "threads": threads}


WORKERS = {"ours": run_ours, "transformers": run_transformers}


def main() -> None:
    a, runs, model, threads = step_bench(__file__, WORKERS, "rm-bench-")
    result = {"work": {"rows": ROWS, "lr": LR, "loss": "pointwise BCE"}}
    result |= {name: _summary(r, a.warmup) for name, r in runs.items()}
    from grpo_core.rewards.heads import load_reward_model

    m = load_reward_model(model, "orm")
    weights = sum(p.numel() for p in m.parameters()) - m.get_input_embeddings().weight.numel()
    rate = matmul_gflops(threads=threads)
    limit = 6 * weights * result["ours"]["input_tokens_per_step"] / (rate * 1e9)
    result |= {
        "matmul_gflops": round(rate, 1),
        "arithmetic_limit_s": round(limit, 5),
        "transformers_over_ours": round(result["transformers"]["median_step_s"] / result["ours"]["median_step_s"], 3),
    }
    for name in WORKERS:
        result[name]["over_arithmetic_limit"] = round(result[name]["median_step_s"] / limit, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

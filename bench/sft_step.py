"""One SFT optimizer step, ours against TRL's ``SFTTrainer`` at equal work: the demo's model (a
freshly initialised 0.87M-parameter Llama, character tokenizer), its 500 worked solutions with the
loss on the solution only, rows of 256 packed tokens, 16 rows per step, AdamW(0.9, 0.95) at a
constant lr 2e-3, gradient clipping at 1.0, fp32 on the CPU.

    .venv/bin/python bench/sft_step.py --json            # make bench-sft (installs trl)

Each implementation runs in its own process, alternating, ``--rounds`` times, ``--steps`` steps
each; the medians are over the steps after ``--warmup``. Ours is the SFT stage's step
(``stages.lm_step.lm_loss`` on packed rows + ``training.trainer.optimizer_step``). TRL runs twice:
``trl_wrapped`` packs as we do (the examples concatenated and cut into full rows: equal work, the
headline ratio) and ``trl`` with its default best-fit packing, which flattens each batch into one
padding-free sequence (meant for FlashAttention; on the CPU attention then spans the whole batch).
Prints one JSON object: per implementation the median step time, input tokens per step and per second
(TRL's ``num_tokens``; ours: the non-padding tokens of the rows) and peak RSS; TRL over ours; the
machine's matmul rate and the step's arithmetic limit (6 FLOPs per weight and trained token, forward +
backward, at that rate).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.grpo_step import _default_inputs, alternate, matmul_gflops, step_clock  # noqa: E402
from grpo_core.lm.runtime import peak_rss_mib  # noqa: E402

ROWS, LENGTH, LR = 16, 256, 2e-3


def run_ours(model_dir: str, data: str, steps: int, threads: int) -> dict:
    import random

    import torch

    from grpo_core.data import load_jsonl
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.packing import encode_examples, pack
    from grpo_core.stages.lm_step import lm_loss
    from grpo_core.training.trainer import optimizer_step

    torch.set_num_threads(threads)
    model, tok = load_model(model_dir)
    ids, labels = pack(encode_examples(load_jsonl(data), tok, False), LENGTH, tok.pad_token_id, random.Random(0))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    times, tokens = [], []
    for s in range(steps):
        rows = slice((s * ROWS) % (len(ids) - ROWS), (s * ROWS) % (len(ids) - ROWS) + ROWS)
        t0 = time.perf_counter()
        loss_sum, n_tokens = lm_loss(model, ids[rows], labels[rows])
        optimizer_step(model, opt, loss_sum, 1 / n_tokens, 1.0)
        times.append(time.perf_counter() - t0)
        tokens.append(float((ids[rows] != tok.pad_token_id).sum()))  # input tokens, as TRL counts them
    return {"step_s": times, "tokens": tokens, "peak_rss_mib": peak_rss_mib(), "threads": threads}


def run_trl(model_dir: str, data: str, steps: int, threads: int, strategy: str = "bfd") -> dict:
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from grpo_core.data import load_jsonl, prompt_text
    from grpo_core.lm.modeling import load_model

    torch.set_num_threads(threads)
    model, tok = load_model(model_dir)
    rows = [{"prompt": prompt_text(e.question), "completion": e.solution + tok.eos_token} for e in load_jsonl(data)]

    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out,
            packing=True,
            packing_strategy=strategy,
            max_length=LENGTH,
            per_device_train_batch_size=ROWS,
            gradient_accumulation_steps=1,
            learning_rate=LR,
            adam_beta1=0.9,
            adam_beta2=0.95,
            weight_decay=0.0,
            max_grad_norm=1.0,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_steps=steps,
            use_cpu=True,
            bf16=False,
            fp16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            seed=0,
            dataloader_num_workers=0,
            completion_only_loss=True,
        )
        clock = step_clock()
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[clock]
        )
        trainer.train()
        tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    per_step = [b - a for a, b in zip([0.0] + tokens, tokens)]  # num_tokens is cumulative (input tokens)
    return {"step_s": clock.times, "tokens": per_step, "peak_rss_mib": peak_rss_mib(), "threads": threads}


def run_trl_wrapped(model_dir: str, data: str, steps: int, threads: int) -> dict:
    """TRL packing as ours does: the examples concatenated and cut into full rows (equal work)."""
    return run_trl(model_dir, data, steps, threads, strategy="wrapped")


WORKERS = {"ours": run_ours, "trl_wrapped": run_trl_wrapped, "trl": run_trl}


def _summary(runs: list[dict], warmup: int) -> dict:
    steps = [t for r in runs for t in r["step_s"][warmup:]]
    tokens = [t for r in runs for t in r["tokens"][warmup:]]
    return {
        "median_step_s": round(statistics.median(steps), 4),
        "steps_timed": len(steps),
        "input_tokens_per_step": round(statistics.median(tokens), 1),
        "input_tokens_per_s": round(sum(tokens) / sum(steps), 1),
        "peak_rss_mib": round(max(r["peak_rss_mib"] for r in runs), 1),
        "threads": runs[0]["threads"],
    }


def step_bench(script: str, workers: dict, prefix: str, with_only: bool = False):
    """The command line of a step benchmark on the demo's inputs. In a ``--worker`` process: run that
    implementation, print its JSON and exit. Otherwise: each implementation (or ``--only`` one) in
    its own process, alternating; returns (arguments, runs by name, model folder, threads)."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12, help="steps per run, warm-up included")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, help="torch threads of every implementation (default: torch's)")
    if with_only:
        p.add_argument("--only", choices=sorted(workers), help="one implementation (no TRL needed for ours)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")
    p.add_argument("--worker", choices=sorted(workers), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(workers[a.worker](a.model, a.data, a.steps, a.threads)))
        raise SystemExit(0)
    import torch

    from grpo_core.env import setup_environment

    setup_environment()
    model, rl = _default_inputs(Path(tempfile.mkdtemp(prefix=prefix)))
    data = str(Path(rl).with_name("sft.jsonl"))  # the demo's worked solutions
    threads = a.threads or torch.get_num_threads()
    names = [a.only] if getattr(a, "only", None) else list(workers)
    runs = alternate(
        script, names, a.rounds, ["--model", model, "--data", data, "--steps", str(a.steps), "--threads", str(threads)]
    )
    return a, runs, model, threads


def main() -> None:
    a, runs, model, threads = step_bench(__file__, WORKERS, "sft-bench-", with_only=True)
    names = list(runs)
    result = {"work": {"rows": ROWS, "length": LENGTH, "lr": LR, "loss_on": "solution"}}
    result |= {name: _summary(r, a.warmup) for name, r in runs.items()}
    rate = matmul_gflops(threads=threads)
    from grpo_core.lm.modeling import load_model

    m, _ = load_model(model)
    weights = (
        sum(p.numel() for p in m.parameters())
        - m.get_input_embeddings().weight.numel()
        + m.get_output_embeddings().weight.numel()
    )
    limit = 6 * weights * ROWS * LENGTH / (rate * 1e9)  # every row position goes forward and backward
    result |= {"matmul_gflops": round(rate, 1), "arithmetic_limit_s": round(limit, 4)}
    for name in names:
        result[name]["over_arithmetic_limit"] = round(result[name]["median_step_s"] / limit, 2)
    for peer in ("trl_wrapped", "trl"):
        if peer in result and "ours" in result:
            result[f"{peer}_over_ours"] = round(result[peer]["median_step_s"] / result["ours"]["median_step_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

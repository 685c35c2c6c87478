"""One GRPO optimizer step, measured: 8 prompts x 8 completions x at most 32 new tokens, the paper's
loss settings (beta 0.04, clip 0.2, one update per exploration stage, lr 1e-6).

    .venv/bin/python bench/grpo_step.py --model DIR --prompts FILE.jsonl --json     # ours only
    .venv/bin/python bench/grpo_step.py --compare --json                            # make bench

``--model``: any local Hugging Face causal-LM folder (default: the demo's tiny model, freshly
initialised). ``--prompts``: JSONL of ``{"prompt": ..., "gold": ...}`` or GSM8K form (default: the
arithmetic task's RL questions). ``--compare`` also runs TRL's ``GRPOTrainer`` on the same work
(``pip install trl``: the ``bench`` extra): ``trl`` with GRPOConfig's default gradient checkpointing
(each layer recomputed in backward, as ``ours-checkpointing`` does: ``launch.gradient_checkpointing``),
``trl-no-checkpointing`` keeping every activation as ``ours`` does;
bare ``generate`` + forward/backward + reference forward; for memory the PPO setting GRPO replaces
(our step plus a value model of the policy's size with its own update: ``_ValueModel``) and LoRA
(``--only ours,lora``: a rank-16 adapter on every linear layer, ``grpo.lora``, against full
fine-tuning). Each implementation runs in its own process (so that peak RSS is its own),
alternating, ``--rounds`` times. Prints one JSON object: median step time after ``--warmup`` steps,
completion tokens per second, peak RSS and the peak over the RSS before the models were loaded, and
for ``--compare`` the ratios of time and memory to ours, the machine's matmul rate and the step's
arithmetic limit (its useful matmul FLOPs at that rate; ``step_flops``). Our step k samples with
``seeds.step_seed(0, k)``, as a run's step k does (before 2026-11-27: the seed k itself, so
rollouts, not their cost, differ from earlier figures).

``--device cuda --precision bf16``: the same on a GPU, the forward passes under bf16 autocast (the
stages' ``launch.precision: bf16``); each run then also reports its peak CUDA allocation and its MFU
(the step's useful FLOPs per second over the GPU's bf16 matmul rate, measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import grpo_core  # noqa: F401  (first: the numerics settings, env.NUMERICS, before torch computes)
from grpo_core.lm.runtime import peak_rss_mib  # a worker's own peak, not its parent's

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, GROUP, MAX_NEW, BETA, LR = 8, 8, 32, 0.04, 1e-6


def _questions(path: str):
    """(prompt text, gold) pairs: ``prompt`` / ``gold`` rows as given, GSM8K rows through our prompt."""
    from grpo_core.data import prompt_text
    from grpo_core.verify import extract_answer

    out = []
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        if "prompt" in row:
            out.append((row["prompt"], str(row["gold"])))
        else:
            out.append((prompt_text(row["question"]), extract_answer(row["answer"]) or row["answer"]))
    return out


def _batches(questions, steps: int):
    """The same prompts for every implementation: step s takes questions [8s, 8s + 8) (cycling)."""
    n = len(questions)
    return [[questions[(s * PROMPTS + i) % n] for i in range(PROMPTS)] for s in range(steps)]


def _rss_mib() -> float:
    """Current resident set size (the baseline the models' memory is measured from)."""
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() / 2**20


def _device_memory(device: str) -> dict:
    """The run's peak CUDA allocation (MiB) when it ran on a GPU."""
    import torch

    return {"peak_cuda_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)} if device == "cuda" else {}


def _amp(device: str, precision: str):
    """The forward passes' precision context, as the stages build it (``runtime.autocast``)."""
    import functools

    import torch

    from grpo_core.config import LaunchConfig
    from grpo_core.lm.runtime import autocast

    return functools.partial(autocast, LaunchConfig(precision=precision), torch.device(device))


def run_ours(
    model_dir: str,
    prompts: str,
    steps: int,
    threads: int,
    device: str = "cpu",
    precision: str = "fp32",
    value_model: bool = False,
    lora_rank: int = 0,
    gradient_checkpointing: bool = False,
) -> dict:
    import torch

    from grpo_core.config import GRPOConfig, LaunchConfig, LoraSettings
    from grpo_core.data import Example
    from grpo_core.lm.modeling import load_model, load_trainable
    from grpo_core.lm.runtime import place, set_compute
    from grpo_core.rewards.scorer import RewardScorer
    from grpo_core.stages.rl_step import Learner, rl_step
    from grpo_core.stages.rl_types import Models

    set_compute(threads)  # as every stage computes: its threads, torch's deterministic algorithms
    before_models = _rss_mib()
    # Placed as the GRPO stage places them (``launch.gradient_checkpointing``: each layer recomputed).
    launch = LaunchConfig(device=device, precision=precision, gradient_checkpointing=gradient_checkpointing)
    if lora_rank:  # the reference is the policy with its adapter off: one copy of the weights
        policy, tok = load_trainable(model_dir, LoraSettings(rank=lora_rank, alpha=2 * lora_rank), seed=0)
        ref = place(policy, launch, train=True)
    else:
        policy, tok = load_model(model_dir)
        ref, _ = load_model(model_dir)
        place(policy, launch, train=True)
        place(ref, launch).eval().requires_grad_(False)
    policy.train()  # as the stage trains it (activation checkpointing acts in training mode only)
    opt = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad], lr=LR, betas=(0.9, 0.95), weight_decay=0.0
    )
    amp = _amp(device, precision)
    value = _ValueModel(model_dir, device, amp) if value_model else None
    gc = GRPOConfig(questions_per_step=PROMPTS, group_size=GROUP, max_new_tokens=MAX_NEW, beta=BETA, lr=LR)
    scorer = RewardScorer.for_recipe(gc, tok)  # the answer checker
    times, tokens, parts = [], [], []
    # Our step formats questions itself, so the prompt text is passed as a question whose prompt
    # wrapper is the identity: Example(question=prompt) with prompt_text patched out.
    import grpo_core.stages.rl_step as g  # where the step samples and formats its prompts

    g.prompt_text = lambda q: q
    rollouts = []  # the step's rollout, for the value model of the PPO setting
    sample = g.generate
    g.generate = lambda *a, **k: rollouts.append(sample(*a, **k)) or rollouts[-1]
    for s, batch in enumerate(_batches(_questions(prompts), steps)):
        questions = [Example(question=p, gold=gold) for p, gold in batch]
        t0 = time.perf_counter()
        m = rl_step(Learner(Models(policy, ref), tok, opt, gc, scorer, 0, amp=amp), questions, s)
        if value is not None:
            value.step(rollouts[-1], [gold for _, gold in batch for _ in range(GROUP)])
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(m["train/completion_len"] * PROMPTS * GROUP)
        parts.append({k.removeprefix("time/"): m[k] for k in m if k.startswith("time/")})
    return {
        "step_s": times,
        "tokens": tokens,
        "parts": parts,
        "peak_rss_mib": peak_rss_mib(),
        "threads": threads,
        "rss_before_models_mib": before_models,
        **_device_memory(device),
    }


class _ValueModel:
    """What PPO adds to a GRPO step, for its memory: a value model of the policy's size initialised
    from it (a per-token scalar head), its no-grad pass for the old values, and its own
    forward/backward and AdamW step on the squared error to the returns (here the outcome reward at
    every token, undiscounted: gamma = lambda = 1, as in DeepSeekMath's PPO baseline)."""

    def __init__(self, model_dir: str, device: str, amp) -> None:
        import torch

        from grpo_core.rewards.heads import ScoreHead, load_reward_model

        self.model = load_reward_model(model_dir, "prm").to(device)
        self.head = ScoreHead(self.model)
        self.amp = amp
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)

    def step(self, rollout, golds: list[str]) -> None:
        import torch

        from grpo_core.rewards.scorer import rule_reward

        args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len - 1)
        with torch.no_grad(), self.amp():
            old_values = self.head(*args)[:, :-1].float()  # [B, T]: the advantage baseline PPO subtracts
        returns = rule_reward(rollout.texts, golds).float().to(old_values.device)[:, None].expand_as(old_values)
        with self.amp():
            values = self.head(*args)[:, :-1].float()
        mask = rollout.completion_mask
        clipped = old_values + (values - old_values).clamp(-0.2, 0.2)  # PPO's clipped value loss
        error = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
        loss = (error * mask).sum() / mask.sum().clamp(min=1)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def run_trl(
    model_dir: str,
    prompts: str,
    steps: int,
    threads: int,
    device: str = "cpu",
    precision: str = "fp32",
    gradient_checkpointing: bool = True,
) -> dict:
    """TRL's ``GRPOTrainer`` on the same work; ``gradient_checkpointing`` on is GRPOConfig's default
    (TRL recomputes each layer in backward, ours keeps its activations: off, the two keep the same)."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpo_core.lm.modeling import load_model
    from grpo_core.rewards.scorer import rule_reward

    torch.set_num_threads(threads)
    before_models = _rss_mib()
    model, tok = load_model(model_dir)
    rows = [p for batch in _batches(_questions(prompts), steps) for p in batch]
    data = Dataset.from_list([{"prompt": p, "gold": gold} for p, gold in rows])

    def reward(completions, gold, **_):
        return rule_reward(completions, gold).tolist()

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=PROMPTS * GROUP,
            num_generations=GROUP,
            gradient_accumulation_steps=1,
            max_completion_length=MAX_NEW,
            temperature=1.0,
            loss_type="grpo",
            beta=BETA,
            num_iterations=1,
            learning_rate=LR,
            max_steps=steps,
            use_cpu=device == "cpu",
            bf16=precision == "bf16",
            fp16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            shuffle_dataset=False,
            seed=0,
            dataloader_num_workers=0,
            lr_scheduler_type="constant",
            gradient_checkpointing=gradient_checkpointing,
        )
        clock = step_clock()
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, callbacks=[clock]
        )
        trainer.train()
        lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {
        "step_s": clock.times,
        "tokens": [x * PROMPTS * GROUP for x in lengths],
        "peak_rss_mib": peak_rss_mib(),
        "threads": threads,
        "gradient_checkpointing": gradient_checkpointing,
        "rss_before_models_mib": before_models,
        **_device_memory(device),
    }


def run_bare(
    model_dir: str, prompts: str, steps: int, threads: int, device: str = "cpu", precision: str = "fp32"
) -> dict:
    """The same work without a framework: sample 64 completions, one forward/backward of the policy,
    one no-grad reference forward, an AdamW step."""
    import torch

    from grpo_core.lm.modeling import load_model

    torch.set_num_threads(threads)
    policy, tok = load_model(model_dir)
    ref, _ = load_model(model_dir)
    policy.to(device)
    ref.to(device)
    opt = torch.optim.AdamW(policy.parameters(), lr=LR)
    amp = _amp(device, precision)
    times, tokens = [], []
    for batch in _batches(_questions(prompts), steps):
        enc = tok.pad(
            {"input_ids": [tok(p, add_special_tokens=False).input_ids for p, _ in batch for _ in range(GROUP)]},
            return_tensors="pt",
            padding_side="left",
        ).to(device)
        t0 = time.perf_counter()
        with torch.no_grad(), amp():
            out = policy.generate(
                **enc,
                max_new_tokens=MAX_NEW,
                do_sample=True,
                top_k=0,
                top_p=1.0,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            ref(out).logits.sum()
        with amp():
            loss = policy(out).logits.float().logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(float((out[:, enc.input_ids.shape[1] :] != tok.pad_token_id).sum()))
    return {
        "step_s": times,
        "tokens": tokens,
        "peak_rss_mib": peak_rss_mib(),
        "threads": threads,
        **_device_memory(device),
    }


def run_ppo(
    model_dir: str, prompts: str, steps: int, threads: int, device: str = "cpu", precision: str = "fp32"
) -> dict:
    """Our step plus the value model PPO needs (``_ValueModel``): the memory GRPO saves."""
    return run_ours(model_dir, prompts, steps, threads, device, precision, value_model=True)


def run_lora(
    model_dir: str, prompts: str, steps: int, threads: int, device: str = "cpu", precision: str = "fp32"
) -> dict:
    """Our step with a rank-16 LoRA adapter on every linear layer (``grpo.lora``): the memory and time
    of training the adapter alone, the reference the policy with its adapter off."""
    return run_ours(model_dir, prompts, steps, threads, device, precision, lora_rank=16)


WORKERS = {
    "ours": run_ours,
    "ours-checkpointing": partial(run_ours, gradient_checkpointing=True),
    "trl": run_trl,
    "trl-no-checkpointing": partial(run_trl, gradient_checkpointing=False),
    "bare": run_bare,
    "ppo": run_ppo,
    "lora": run_lora,
}


def matmul_gflops(n: int = 1024, threads: int = 1, device: str = "cpu") -> float:
    """The machine's matmul rate: fp32 n x n products on the CPU, bf16 8192 x 8192 on a GPU (the
    rate MFU is taken against, measured rather than read off a data sheet)."""
    import torch

    torch.set_num_threads(threads)
    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (n, torch.float32)
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync()
    return 10 * 2 * n**3 / (time.perf_counter() - t0) / 1e9


def step_flops(model_dir: str, prompts: str, completion_tokens: float, shared_prompts: bool = False) -> float:
    """The useful arithmetic of one step (no padding), as matmul FLOPs: 2 per weight and token for
    a forward pass, 6 for forward + backward. Sampling runs the policy forward over the prompt and
    every completion token; the reference forward and the update's forward/backward run over
    prompt + completion. ``completion_tokens``: a step's total. ``shared_prompts``: each distinct
    prompt counted once (the least work: causal attention makes a prompt's states independent of
    its completions), else once per row (the work as posed). Attention's own FLOPs are left out
    (under 5% at these lengths and widths)."""
    from grpo_core.lm.modeling import load_model

    model, tok = load_model(model_dir)
    embed = model.get_input_embeddings().weight
    # Every weight is a matmul operand except the embedding lookup; a tied output layer still is one.
    weights = sum(p.numel() for p in model.parameters()) - embed.numel() + model.get_output_embeddings().weight.numel()
    prompt_tokens = sum(
        len(tok(p, add_special_tokens=False).input_ids) for batch in _batches(_questions(prompts), 1) for p, _ in batch
    ) * (1 if shared_prompts else GROUP)
    tokens = prompt_tokens + completion_tokens
    return 2 * weights * tokens + 2 * weights * tokens + 6 * weights * tokens  # sample, reference, update


def step_clock():
    """A ``TrainerCallback`` that times each optimizer step of a TRL trainer (``.times``)."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    return Clock()


def alternate(
    script: str, names: list[str], rounds: int, args: list[str], env: dict | None = None
) -> dict[str, list[dict]]:
    """Each implementation's worker in its own process (so that peak RSS is its own), alternating,
    ``rounds`` times, in ``env`` (default: this process's): {name: [the JSON each run printed]}."""
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(rounds):
        for name in names:
            done = subprocess.run(
                [sys.executable, script, "--worker", name, *args], capture_output=True, text=True, env=env
            )
            if done.returncode != 0:
                raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            # Each run as it ends, so that a caller who stops the bench keeps what finished (experiments/gpu_run.py).
            print(json.dumps({"worker": name, **runs[name][-1]}), file=sys.stderr, flush=True)
    return runs


def _default_inputs(work: Path) -> tuple[str, str]:
    from grpo_core.lm.modeling import init_model, save_model
    from grpo_core.recipe import load_config
    from grpo_core.stages.prepare import run_prepare

    cfg = load_config(ROOT / "configs" / "demo.yaml")
    model, tok = init_model(cfg.model, cfg.seed)
    save_model(model, tok, work / "model")
    run_prepare(cfg, work / "data")
    return str(work / "model"), str(work / "data" / "rl.jsonl")


def _summary(runs: list[dict], warmup: int) -> dict:
    steps = [t for r in runs for t in r["step_s"][warmup:]]
    tokens = [t for r in runs for t in r["tokens"][warmup:]]
    out = {
        "median_step_s": round(statistics.median(steps), 4),
        "steps_timed": len(steps),
        "completion_tokens_per_s": round(sum(tokens) / sum(steps), 1),
        "peak_rss_mib": round(max(r["peak_rss_mib"] for r in runs), 1),
        "threads": runs[0]["threads"],
    }
    if "rss_before_models_mib" in runs[0]:  # what the models, optimizers and activations added
        out["peak_rss_over_start_mib"] = round(max(r["peak_rss_mib"] - r["rss_before_models_mib"] for r in runs), 1)
    if "peak_cuda_mib" in runs[0]:
        out["peak_cuda_mib"] = max(r["peak_cuda_mib"] for r in runs)
    if runs[0].get("parts"):
        parts = [p for r in runs for p in r["parts"][warmup:]]
        out["median_parts_s"] = {k: round(statistics.median(p[k] for p in parts), 4) for k in parts[0]}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--prompts")
    p.add_argument("--steps", type=int, default=8, help="steps per run, warm-up included")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="--compare: alternating runs per implementation")
    p.add_argument(
        "--threads", type=int, help="torch threads of every implementation (default: torch's, what a TRL user gets)"
    )
    p.add_argument("--compare", action="store_true")
    p.add_argument(
        "--only", help="--compare: a comma-separated subset of ours,trl,bare,ppo,lora (e.g. where TRL is absent)"
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast forward passes")
    p.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(WORKERS[a.worker](a.model, a.prompts, a.steps, a.threads, a.device, a.precision)))
        return
    from grpo_core.env import setup_environment

    setup_environment()
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    model, prompts = (a.model, a.prompts) if a.model and a.prompts else _default_inputs(work)
    import torch

    default_threads = a.threads or torch.get_num_threads()
    names = (a.only.split(",") if a.only else ["ours", "trl", "bare", "ppo"]) if a.compare else ["ours"]
    if unknown := set(names) - set(WORKERS):
        raise SystemExit(f"--only: unknown {sorted(unknown)}; choose from {sorted(WORKERS)}")
    runs = alternate(
        __file__,
        names,
        a.rounds if a.compare else 1,
        [
            "--model",
            model,
            "--prompts",
            prompts,
            "--steps",
            str(a.steps),
            "--threads",
            str(default_threads),
            "--device",
            a.device,
            "--precision",
            a.precision,
        ],
    )
    result = {
        "work": {
            "prompts": PROMPTS,
            "completions_per_prompt": GROUP,
            "max_new_tokens": MAX_NEW,
            "beta": BETA,
            "lr": LR,
        },
        "model": model,
        "prompts": prompts,
        "device": a.device,
        "precision": a.precision,
    }
    if a.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    result.update({name: _summary(r, a.warmup) for name, r in runs.items()})
    if a.compare:
        memory = "peak_cuda_mib" if a.device == "cuda" else "peak_rss_over_start_mib"
        # TRL's default recomputes each layer in backward, as ours-checkpointing does; like against like too.
        for name, base in (
            *((n, "ours") for n in ("trl", "trl-no-checkpointing", "bare")),
            ("trl", "ours-checkpointing"),
        ):
            if name in names and base in names:
                result[f"{name}_over_{base}"] = round(result[name]["median_step_s"] / result[base]["median_step_s"], 3)
            if name.startswith("trl") and name in names and base in names and memory in result[name]:
                result[f"memory_{name}_over_{base}"] = round(result[name][memory] / result[base][memory], 3)
        if "lora" in names and "ours" in names:  # LoRA against full fine-tuning: time and memory
            result["lora_over_ours"] = round(result["lora"]["median_step_s"] / result["ours"]["median_step_s"], 3)
            result["memory_lora_over_ours"] = round(result["lora"][memory] / result["ours"][memory], 3)
        if "ppo" in names and "ours" in names:
            # Memory: GRPO (policy + reference) against the PPO setting it replaces (+ a value model).
            result["memory_ppo_over_grpo"] = round(result["ppo"][memory] / result["ours"][memory], 3)
        if a.device == "cpu":
            result["matmul_gflops_1_thread"] = round(matmul_gflops(threads=1), 1)
        rate = matmul_gflops(threads=default_threads, device=a.device)
        result["matmul_gflops_bf16_gpu" if a.device == "cuda" else "matmul_gflops_default_threads"] = round(rate, 1)
        tokens = statistics.median(t for r in runs[names[0]] for t in r["tokens"][a.warmup :])
        flops = step_flops(model, prompts, tokens)
        limit = flops / (rate * 1e9)
        result["arithmetic_limit_s"] = round(limit, 4)
        result["arithmetic_limit_shared_prompts_s"] = round(step_flops(model, prompts, tokens, True) / (rate * 1e9), 4)
        for name in names:
            result[name]["over_arithmetic_limit"] = round(result[name]["median_step_s"] / limit, 2)
            result[name]["mfu"] = round(limit / result[name]["median_step_s"], 5)  # useful FLOPs / s over the rate
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""One GRPO optimizer step, measured: 8 prompts x 8 completions x at most 32 new tokens, the paper's
loss settings (beta 0.04, clip 0.2, one update per exploration stage, lr 1e-6).

    .venv/bin/python bench/grpo_step.py --model DIR --prompts FILE.jsonl --json     # ours only
    .venv/bin/python bench/grpo_step.py --compare --json                            # make bench

``--prompts-per-step``, ``--group``, ``--max-new`` change the work (the defaults above) on every
side. ``--model``: any local Hugging Face causal-LM folder (default: the demo's tiny model, freshly
initialised; ``--fresh``: the folder's architecture with fresh weights, which next to never stop, so
that every side's completions run to ``--max-new``: ``like_for_like.py``). ``--prompts``: JSONL of
``{"prompt": ..., "gold": ...}`` or GSM8K form (default: the arithmetic task's RL questions).
``--compare`` also runs TRL's ``GRPOTrainer`` on the same work (``pip install trl``: the ``bench``
extra): ``trl`` with GRPOConfig's default gradient checkpointing (each layer recomputed in backward,
as ``ours-checkpointing`` does: ``launch.gradient_checkpointing``), ``trl-no-checkpointing`` keeping
every activation as ``ours`` does; ``ours-unshared`` (and ``ours-unshared-checkpointing``) computing
every row's prompt in the log-prob passes, as TRL does; bare ``generate`` + forward/backward +
reference forward; for memory the PPO setting GRPO replaces (our step plus a value model of the
policy's size with its own update: ``_ValueModel``) and LoRA (``--only ours,lora``: a rank-16
adapter on every linear layer, ``grpo.lora``, against full fine-tuning). Each implementation runs in
its own process (so that peak RSS is its own), alternating, ``--rounds`` times. Prints one JSON
object: median step time after ``--warmup`` steps, completion tokens per second, peak RSS and the
peak over the RSS before the models were loaded, and for ``--compare`` the ratios of time and memory
to ours, the machine's matmul rate and the step's arithmetic limit (its useful matmul FLOPs at that
rate; ``step_flops``). Our step k samples with ``seeds.step_seed(0, k)``, as a run's step k does.

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
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import grpo_core  # noqa: F401  (first: the numerics settings, env.NUMERICS, before torch computes)
from grpo_core.lm.runtime import peak_rss_mib  # a worker's own peak, not its parent's

ROOT = Path(__file__).resolve().parents[1]
BETA, LR = 0.04, 1e-6


@dataclass(frozen=True)
class Work:
    """What one step does, the same on every side: ``prompts`` questions x ``group`` completions of
    at most ``max_new`` tokens."""

    prompts: int = 8
    group: int = 8
    max_new: int = 32


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


def _batches(questions, steps: int, work: Work):
    """The same prompts for every implementation: step s takes questions [ks, ks + k) (cycling),
    k = ``work.prompts``."""
    n, k = len(questions), work.prompts
    return [[questions[(s * k + i) % n] for i in range(k)] for s in range(steps)]


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
    work: Work = Work(),
    value_model: bool = False,
    lora_rank: int = 0,
    gradient_checkpointing: bool = False,
    shared_prompt: bool = True,
) -> dict:
    """Our step (``stages.rl_step.rl_step``); ``shared_prompt`` False: the log-prob passes compute
    every row's prompt (``lm.policy.CompletionLogprobs`` without its shared-prompt pass)."""
    import torch

    from grpo_core.config import GRPOConfig, LaunchConfig, LoraSettings
    from grpo_core.data import Example
    from grpo_core.lm.modeling import load_model, load_trainable
    from grpo_core.lm.runtime import place, set_compute
    from grpo_core.rewards.scorer import RewardScorer
    from grpo_core.stages.rl_step import Learner, rl_step
    from grpo_core.stages.rl_types import Models

    set_compute(threads)  # as every stage computes: its threads, torch's deterministic algorithms
    if not shared_prompt:
        import grpo_core.lm.policy

        grpo_core.lm.policy.distinct_prompts = lambda *_: None  # no distinct prompts found: every row's computed
    before_models = _rss_mib()
    # Placed as the GRPO stage places them (``launch.gradient_checkpointing``: each layer recomputed).
    launch = LaunchConfig(device=device, precision=precision, gradient_checkpointing=gradient_checkpointing)
    if lora_rank:  # the reference is the policy with its adapter off: one copy of the weights
        policy, tok = load_trainable(model_dir, LoraSettings(rank=lora_rank, alpha=2 * lora_rank), seed=0)
        ref = place(policy, launch, train="grpo")
    else:
        policy, tok = load_model(model_dir)
        ref, _ = load_model(model_dir)
        place(policy, launch, train="grpo")
        place(ref, launch).eval().requires_grad_(False)
    policy.train()  # as the stage trains it (activation checkpointing acts in training mode only)
    opt = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad], lr=LR, betas=(0.9, 0.95), weight_decay=0.0
    )
    amp = _amp(device, precision)
    value = _ValueModel(model_dir, device, amp) if value_model else None
    gc = GRPOConfig(
        questions_per_step=work.prompts, group_size=work.group, max_new_tokens=work.max_new, beta=BETA, lr=LR
    )
    scorer = RewardScorer.for_recipe(gc, tok)  # the answer checker
    times, tokens, parts = [], [], []
    # Our step formats questions itself, so the prompt text is passed as a question whose prompt
    # wrapper is the identity: Example(question=prompt) with prompt_text patched out.
    import grpo_core.stages.rl_step as g  # where the step samples and formats its prompts

    g.prompt_text = lambda q: q
    rollouts = []  # the step's rollout, for the value model of the PPO setting
    sample = g.generate
    g.generate = lambda *a, **k: rollouts.append(sample(*a, **k)) or rollouts[-1]
    for s, batch in enumerate(_batches(_questions(prompts), steps, work)):
        questions = [Example(question=p, gold=gold) for p, gold in batch]
        t0 = time.perf_counter()
        m = rl_step(Learner(Models(policy, ref), tok, opt, gc, scorer, 0, amp=amp), questions, s)
        if value is not None:
            value.step(rollouts[-1], [gold for _, gold in batch for _ in range(work.group)])
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(m["train/completion_len"] * work.prompts * work.group)
        part = {k.removeprefix("time/"): m[k] for k in m if k.startswith("time/")}
        # What the four phases TRL's clock also names leave of the step (advantages, metrics): other_s.
        part["other_s"] = times[-1] - sum(part[k] for k in ("rollout_s", "reward_s", "logprob_s", "update_s"))
        parts.append(part)
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
    work: Work = Work(),
    gradient_checkpointing: bool = True,
) -> dict:
    """TRL's ``GRPOTrainer`` on the same work; ``gradient_checkpointing`` on is GRPOConfig's default
    (TRL recomputes each layer in backward, ours keeps its activations: off, the two keep the same).
    The same passes as ours: sampling, one no-grad reference pass (beta > 0), one forward/backward
    (one update per generation: no pi_old pass on either side)."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpo_core.lm.modeling import load_model
    from grpo_core.rewards.scorer import rule_reward

    torch.set_num_threads(threads)
    before_models = _rss_mib()
    model, tok = load_model(model_dir)
    rows = [p for batch in _batches(_questions(prompts), steps, work) for p in batch]
    data = Dataset.from_list([{"prompt": p, "gold": gold} for p, gold in rows])

    def reward(completions, gold, **_):
        return rule_reward(completions, gold).tolist()

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=work.prompts * work.group,
            num_generations=work.group,
            gradient_accumulation_steps=1,
            max_completion_length=work.max_new,
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
        clock.time_phases(trainer)
        trainer.train()
        lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {
        "step_s": clock.times,
        "tokens": [x * work.prompts * work.group for x in lengths],
        "parts": clock.parts,
        "peak_rss_mib": peak_rss_mib(),
        "threads": threads,
        "gradient_checkpointing": gradient_checkpointing,
        "rss_before_models_mib": before_models,
        **_device_memory(device),
    }


def run_bare(
    model_dir: str,
    prompts: str,
    steps: int,
    threads: int,
    device: str = "cpu",
    precision: str = "fp32",
    work: Work = Work(),
) -> dict:
    """The same work without a framework: sample the completions, one forward/backward of the
    policy, one no-grad reference forward, an AdamW step."""
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
    for batch in _batches(_questions(prompts), steps, work):
        enc = tok.pad(
            {"input_ids": [tok(p, add_special_tokens=False).input_ids for p, _ in batch for _ in range(work.group)]},
            return_tensors="pt",
            padding_side="left",
        ).to(device)
        t0 = time.perf_counter()
        with torch.no_grad(), amp():
            out = policy.generate(
                **enc,
                max_new_tokens=work.max_new,
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


# Each worker: (model folder, prompt file, steps, threads, device, precision, Work) -> its JSON.
# ``ppo``: our step plus the value model PPO needs (``_ValueModel``), the memory GRPO saves.
# ``lora``: a rank-16 adapter on every linear layer (``grpo.lora``), the reference the policy with
# its adapter off. ``-unshared``: every row's prompt computed in the log-prob passes.
WORKERS = {
    "ours": run_ours,
    "ours-checkpointing": partial(run_ours, gradient_checkpointing=True),
    "ours-unshared": partial(run_ours, shared_prompt=False),
    "ours-unshared-checkpointing": partial(run_ours, shared_prompt=False, gradient_checkpointing=True),
    "trl": run_trl,
    "trl-no-checkpointing": partial(run_trl, gradient_checkpointing=False),
    "bare": run_bare,
    "ppo": partial(run_ours, value_model=True),
    "lora": partial(run_ours, lora_rank=16),
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


def step_flops(
    model_dir: str, prompts: str, completion_tokens: float, work: Work, shared_prompts: bool = False
) -> float:
    """The useful arithmetic of one step (no padding), as matmul FLOPs: 2 per weight and token for
    a forward pass, 6 for forward + backward. Sampling runs the policy forward over the prompt and
    every completion token; the reference forward and the update's forward/backward run over
    prompt + completion. ``completion_tokens``: a step's total. ``shared_prompts``: each distinct
    prompt counted once (the least work: causal attention makes a prompt's states independent of
    its completions), else once per row (the work as posed). Attention's own FLOPs are left out:
    they grow with the context (a few percent of SmolLM2-135M's matmuls at 32 new tokens, several
    at 512, where the limit is that much low)."""
    from grpo_core.lm.modeling import load_model

    model, tok = load_model(model_dir)
    embed = model.get_input_embeddings().weight
    # Every weight is a matmul operand except the embedding lookup; a tied output layer still is one.
    weights = sum(p.numel() for p in model.parameters()) - embed.numel() + model.get_output_embeddings().weight.numel()
    prompt_tokens = sum(
        len(tok(p, add_special_tokens=False).input_ids)
        for batch in _batches(_questions(prompts), 1, work)
        for p, _ in batch
    ) * (1 if shared_prompts else work.group)
    tokens = prompt_tokens + completion_tokens
    return 2 * weights * tokens + 2 * weights * tokens + 6 * weights * tokens  # sample, reference, update


def step_clock():
    """A ``TrainerCallback`` that times each optimizer step of a TRL trainer (``.times``) and, once
    ``time_phases(trainer)`` wrapped its methods, each step's phases (``.parts``) under our step's
    names: sampling with its tokenising (``rollout_s``), the reward (``reward_s``), the no-grad
    reference pass (``logprob_s``), the update's forward, backward and optimizer step (``update_s``:
    the step less its input preparation) and the rest of the preparation (``other_s``: padding, the
    advantages, metrics). On a GPU every clock reading waits for the device, as ours does."""
    import torch
    from transformers import TrainerCallback

    def now() -> float:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return time.perf_counter()

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.parts: list[dict[str, float]] = []

        def on_step_begin(self, args, state, control, **kw):
            self.parts.append(dict.fromkeys(("rollout_s", "reward_s", "logprob_s", "prepare_s"), 0.0))
            self.t0 = now()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(now() - self.t0)
            part = self.parts[-1]
            prepare = part.pop("prepare_s")
            part["update_s"] = self.times[-1] - prepare
            part["other_s"] = prepare - part["rollout_s"] - part["reward_s"] - part["logprob_s"]

        def _timed(self, method, name: str, no_grad_only: bool = False):
            def timed(*a, **k):
                if no_grad_only and torch.is_grad_enabled():
                    return method(*a, **k)
                t0 = now()
                try:
                    return method(*a, **k)
                finally:
                    if self.parts:
                        self.parts[-1][name] += now() - t0

            return timed

        def time_phases(self, trainer) -> None:
            """Wrap the trainer's phase methods (TRL 1.16's names) on the instance."""
            for attr, name, no_grad_only in (
                ("_prepare_inputs", "prepare_s", False),
                ("_generate", "rollout_s", False),
                ("_calculate_rewards", "reward_s", False),
                ("_get_per_token_logps_and_entropies", "logprob_s", True),
            ):
                setattr(trainer, attr, self._timed(getattr(trainer, attr), name, no_grad_only))

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
        "median_completion_tokens": statistics.median(tokens),  # a step's, over its rows
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


def _fresh_weights(model_dir: str, out: Path) -> str:
    """``model_dir``'s architecture and tokenizer with freshly initialised weights (seed 0): a model
    that next to never writes its end token, so that every completion on every side runs to
    ``--max-new`` tokens (like-for-like lengths at 256 and 512, where a trained model stops early)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_core.lm.modeling import load_tokenizer, save_model

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return str(save_model(model, load_tokenizer(model_dir), out))


# Ratios reported by --compare (time and, for TRL, memory): (implementation, the one it is set against).
# Like against like: TRL keeps every row's prompt (our -unshared), and TRL's default recomputes each
# layer in backward as our -checkpointing does.
RATIOS = (
    ("trl", "ours"),
    ("trl-no-checkpointing", "ours"),
    ("bare", "ours"),
    ("trl", "ours-checkpointing"),
    ("trl", "ours-unshared-checkpointing"),
    ("trl-no-checkpointing", "ours-unshared"),
    ("ours-unshared", "ours"),
    ("ours-unshared-checkpointing", "ours-checkpointing"),
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--prompts")
    p.add_argument("--fresh", action="store_true", help="--model's architecture with freshly initialised weights")
    p.add_argument("--steps", type=int, default=8, help="steps per run, warm-up included")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="--compare: alternating runs per implementation")
    p.add_argument("--prompts-per-step", type=int, default=Work.prompts)
    p.add_argument("--group", type=int, default=Work.group, help="completions per prompt")
    p.add_argument("--max-new", type=int, default=Work.max_new, help="completion tokens at most")
    p.add_argument(
        "--threads", type=int, help="torch threads of every implementation (default: torch's, what a TRL user gets)"
    )
    p.add_argument("--compare", action="store_true")
    p.add_argument("--only", help=f"--compare: a comma-separated subset of {','.join(WORKERS)}")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast forward passes")
    p.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    a = p.parse_args()
    work = Work(a.prompts_per_step, a.group, a.max_new)
    if a.worker:
        out = WORKERS[a.worker](a.model, a.prompts, a.steps, a.threads, a.device, a.precision, work)
        print(json.dumps(out | {"work": asdict(work)}))  # each run's line names its work
        return
    from grpo_core.env import setup_environment

    setup_environment()
    tmp = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    model, prompts = (a.model, a.prompts) if a.model and a.prompts else _default_inputs(tmp)
    if a.fresh:
        model = _fresh_weights(model, tmp / "fresh")
    import torch

    default_threads = a.threads or torch.get_num_threads()
    names = (a.only.split(",") if a.only else ["ours", "trl", "bare", "ppo"]) if a.compare else ["ours"]
    if unknown := set(names) - set(WORKERS):
        raise SystemExit(f"--only: unknown {sorted(unknown)}; choose from {sorted(WORKERS)}")
    common = ["--model", model, "--prompts", prompts, "--steps", str(a.steps), "--threads", str(default_threads)]
    common += ["--device", a.device, "--precision", a.precision]
    common += ["--prompts-per-step", str(work.prompts), "--group", str(work.group), "--max-new", str(work.max_new)]
    runs = alternate(__file__, names, a.rounds if a.compare else 1, common)
    result = {
        "work": {
            "prompts": work.prompts,
            "completions_per_prompt": work.group,
            "max_new_tokens": work.max_new,
            "beta": BETA,
            "lr": LR,
        },
        "model": model,
        "fresh_weights": a.fresh,
        "prompts": prompts,
        "device": a.device,
        "precision": a.precision,
    }
    if a.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    result.update({name: _summary(r, a.warmup) for name, r in runs.items()})
    if a.compare:
        result.update(_compare(result, names, a, model, prompts, work, runs, default_threads))
    print(json.dumps(result))


def _compare(result: dict, names, a, model: str, prompts: str, work: Work, runs, threads: int) -> dict:
    """--compare's ratios, the machine's matmul rate and the step's arithmetic limit."""
    out: dict = {}
    memory = "peak_cuda_mib" if a.device == "cuda" else "peak_rss_over_start_mib"
    for name, base in RATIOS:
        if name in names and base in names:
            out[f"{name}_over_{base}"] = round(result[name]["median_step_s"] / result[base]["median_step_s"], 3)
            if memory in result[name] and memory in result[base]:
                out[f"memory_{name}_over_{base}"] = round(result[name][memory] / result[base][memory], 3)
    if "lora" in names and "ours" in names:  # LoRA against full fine-tuning: time and memory
        out["lora_over_ours"] = round(result["lora"]["median_step_s"] / result["ours"]["median_step_s"], 3)
        out["memory_lora_over_ours"] = round(result["lora"][memory] / result["ours"][memory], 3)
    if "ppo" in names and "ours" in names:
        # Memory: GRPO (policy + reference) against the PPO setting it replaces (+ a value model).
        out["memory_ppo_over_grpo"] = round(result["ppo"][memory] / result["ours"][memory], 3)
    if a.device == "cpu":
        out["matmul_gflops_1_thread"] = round(matmul_gflops(threads=1), 1)
    rate = matmul_gflops(threads=threads, device=a.device)
    out["matmul_gflops_bf16_gpu" if a.device == "cuda" else "matmul_gflops_default_threads"] = round(rate, 1)
    tokens = statistics.median(t for r in runs[names[0]] for t in r["tokens"][a.warmup :])
    limit = step_flops(model, prompts, tokens, work) / (rate * 1e9)
    out["arithmetic_limit_s"] = round(limit, 4)
    out["arithmetic_limit_shared_prompts_s"] = round(step_flops(model, prompts, tokens, work, True) / (rate * 1e9), 4)
    for name in names:
        result[name]["over_arithmetic_limit"] = round(result[name]["median_step_s"] / limit, 2)
        result[name]["mfu"] = round(limit / result[name]["median_step_s"], 5)  # useful FLOPs / s over the rate
    return out


if __name__ == "__main__":
    main()

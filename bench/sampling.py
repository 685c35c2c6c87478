"""Sampling throughput, ours against ``transformers``' ``generate``: what evaluation (greedy), the
reward-data stage and GRPO's rollouts (sampled, G rows per prompt) spend their time on. The demo's
model (freshly initialised, or ``--model DIR``) on the demo's test questions, 64 new tokens per row
(a ban on the end token makes every row generate all 64, in every implementation).

    .venv/bin/python bench/sampling.py --json

Cases: ``greedy`` (128 distinct questions, one row each: evaluation) and ``grouped`` (16 questions
x 8 samples at temperature 1: reward data and rollouts, where our prefill runs once per distinct
prompt). Implementations: ours (``policy.generate``), ``generate`` (its default dynamic cache) and
``generate_static_compiled`` (a static cache and ``torch.compile`` of the decode step, the
strongest path ``transformers`` offers; its compile, on the first call, is reported apart). Each is
timed ``--repeat`` times, alternating, in one process. Prints one JSON object: per case and
implementation the median seconds and tokens/s, ratios to ours, and the arithmetic limit (2 FLOPs
per matmul weight and token: each distinct prompt's tokens once, every generated token; attention's
own FLOPs left out) at the fp32 matmul rate measured in the same run.
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

from bench.grpo_step import _default_inputs, _questions, matmul_gflops  # noqa: E402

NEW = 64


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int)
    p.add_argument("--model", help="a model folder (default: the demo's model, freshly initialised)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")
    a = p.parse_args()
    import torch
    from transformers import CompileConfig, GenerationConfig, LogitsProcessorList

    from grpo_core.env import setup_environment
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.policy import GumbelSampler, encode_prompts, generate
    from grpo_core.seeds import row_seed

    setup_environment()
    if a.threads:
        torch.set_num_threads(a.threads)
    model_dir, prompts_file = _default_inputs(Path(tempfile.mkdtemp(prefix="sampling-bench-")))
    model, tok = load_model(a.model or model_dir)
    model.eval()
    questions = [q for q, _ in _questions(prompts_file)]
    no_eos = torch.zeros(len(tok))
    no_eos[tok.eos_token_id] = -float("inf")  # every row generates NEW tokens, in both implementations
    cases = {"greedy": (questions[:128], None), "grouped": ([q for q in questions[:16] for _ in range(8)], 1.0)}
    threads = torch.get_num_threads()
    rate = matmul_gflops(threads=threads)
    torch.set_num_threads(threads)
    # Every weight is a matmul operand except the embedding lookup (a tied output layer still is one).
    weights = (
        sum(p.numel() for p in model.parameters())
        - model.get_input_embeddings().weight.numel()
        + model.get_output_embeddings().weight.numel()
    )
    result: dict = {"new_tokens": NEW, "threads": threads, "matmul_gflops": round(rate, 1)}
    for case, (prompts, temperature) in cases.items():
        temps = None if temperature is None else [temperature] * len(prompts)

        class NoEos:
            def __call__(self, input_ids, scores):
                return scores + no_eos

        def ours():
            original = model.lm_head.forward
            model.lm_head.forward = lambda h: original(h) + no_eos  # the same ban inside our loop
            try:
                return generate(model, tok, prompts, max_new_tokens=NEW, temperatures=temps, seed=0)
            finally:
                model.lm_head.forward = original

        def theirs(static: bool = False):
            enc = encode_prompts(tok, prompts)
            processors = LogitsProcessorList([NoEos()])
            if temps is not None:
                processors.append(GumbelSampler(temps, [row_seed(0, i) for i in range(len(prompts))], NEW))
            config = GenerationConfig(
                max_new_tokens=NEW, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
            )
            if static:  # CPU compile is opt-in in transformers (``_compile_all_devices``)
                config.cache_implementation = "static"
                config.compile_config = CompileConfig()  # transformers' defaults (fullgraph off, reduce-overhead)
                config.compile_config._compile_all_devices = True
            with torch.no_grad():
                return model.generate(**enc, generation_config=config, logits_processor=processors)

        impls = {"ours": ours, "generate": theirs, "generate_static_compiled": lambda: theirs(static=True)}
        times: dict[str, list[float]] = {name: [] for name in impls}
        for _ in range(a.repeat + 1):  # the first round warms up (and compiles)
            for name, fn in impls.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        tokens = len(prompts) * NEW
        enc = encode_prompts(tok, prompts)
        distinct_prompt_tokens = sum(int(m.sum()) for m in torch.unique(enc.input_ids * enc.attention_mask, dim=0) != 0)
        limit = 2 * weights * (distinct_prompt_tokens + tokens) / (rate * 1e9)
        out = {
            "rows": len(prompts),
            "arithmetic_limit_s": round(limit, 4),
            **{
                name: {
                    "median_s": round(statistics.median(t[1:]), 4),
                    "tokens_per_s": round(tokens / statistics.median(t[1:]), 1),
                }
                for name, t in times.items()
            },
        }
        out["generate_static_compiled"]["first_call_s"] = round(times["generate_static_compiled"][0], 2)
        for name in impls:
            out[name]["over_arithmetic_limit"] = round(out[name]["median_s"] / limit, 2)
            if name != "ours":
                out[f"{name}_over_ours"] = round(out[name]["median_s"] / out["ours"]["median_s"], 3)
        result[case] = out
    print(json.dumps(result))


if __name__ == "__main__":
    main()

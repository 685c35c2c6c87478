"""Sampling throughput, ours against ``transformers``' ``generate``: what evaluation (greedy), the
reward-data stage and GRPO's rollouts (sampled, G rows per prompt) spend their time on. The demo's
model (freshly initialised) on the demo's test questions, at most 64 new tokens, with a minimum of
64 tokens forced by a ban on the end token for fair comparison (every row generates the full 64).

    .venv/bin/python bench/sampling.py --json

Cases: ``greedy`` (128 distinct questions, one row each: evaluation) and ``grouped`` (16 questions
x 8 samples at temperature 1: reward data and rollouts, where our prefill runs once per distinct
prompt). Each is timed ``--repeat`` times per implementation, alternating, in one process; prints one
JSON object: median seconds and generated tokens per second for each, and the ratio
``generate_over_ours``.
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

from bench.grpo_step import _default_inputs, _questions  # noqa: E402

NEW = 64


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int)
    p.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")
    a = p.parse_args()
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    from grpo_core.env import setup_environment
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.policy import GumbelSampler, encode_prompts, generate, row_seed

    setup_environment()
    if a.threads:
        torch.set_num_threads(a.threads)
    model_dir, prompts_file = _default_inputs(Path(tempfile.mkdtemp(prefix="sampling-bench-")))
    model, tok = load_model(model_dir)
    model.eval()
    questions = [q for q, _ in _questions(prompts_file)]
    no_eos = torch.zeros(len(tok))
    no_eos[tok.eos_token_id] = -float("inf")  # every row generates NEW tokens, in both implementations
    cases = {"greedy": (questions[:128], None), "grouped": ([q for q in questions[:16] for _ in range(8)], 1.0)}
    result: dict = {"new_tokens": NEW, "threads": torch.get_num_threads()}
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

        def theirs():
            enc = encode_prompts(tok, prompts)
            processors = LogitsProcessorList([NoEos()])
            if temps is not None:
                processors.append(GumbelSampler(temps, [row_seed(0, i) for i in range(len(prompts))], NEW))
            config = GenerationConfig(max_new_tokens=NEW, do_sample=False, pad_token_id=tok.pad_token_id,
                                      eos_token_id=tok.eos_token_id)
            with torch.no_grad():
                return model.generate(**enc, generation_config=config, logits_processor=processors)

        times: dict[str, list[float]] = {"ours": [], "generate": []}
        for _ in range(a.repeat + 1):  # the first round warms up
            for name, fn in (("ours", ours), ("generate", theirs)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        tokens = len(prompts) * NEW
        result[case] = {"rows": len(prompts), **{name: {"median_s": round(statistics.median(t[1:]), 4),
                                                         "tokens_per_s": round(tokens / statistics.median(t[1:]), 1)}
                                                  for name, t in times.items()}}
        result[case]["generate_over_ours"] = round(result[case]["generate"]["median_s"] / result[case]["ours"]["median_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

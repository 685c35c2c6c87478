"""Every training stage on a shrunken demo recipe (step budgets only, so the run is deterministic),
fingerprinted: each stage's logged metrics (timings aside), manifest (wall time and paths aside) and
a digest of its published weights. A refactor that claims "behaviour unchanged" fingerprints before
and after and compares:

    python checks/stage_fingerprint.py --init runs/demo/sft/model --out before.json
    ... change the code ...
    python checks/stage_fingerprint.py --init runs/demo/sft/model --out after.json --compare before.json

``--init``: a trained SFT model (runs/demo/sft/model), so that accuracies, rewards and AUCs are not
all zero; SFT continues from it, the reward data, reward models and GRPO start from it. The last
line printed is JSON: per stage, whether weights, metrics and manifest match the other file.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_core.recipe import load_config  # noqa: E402
from grpo_core.stages.grpo import run_grpo  # noqa: E402
from grpo_core.stages.inputs import reward_datasets  # noqa: E402
from grpo_core.stages.prepare import run_prepare  # noqa: E402
from grpo_core.stages.pretrain import run_pretrain  # noqa: E402
from grpo_core.stages.reward_data import run_reward_data  # noqa: E402
from grpo_core.stages.reward_model import run_reward_model  # noqa: E402
from grpo_core.stages.sft import run_sft  # noqa: E402
from grpo_core.tracking import NullLogger  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
SMALL = [
    "data.arithmetic.n_sft=120",
    "data.arithmetic.n_rl=400",
    "data.arithmetic.n_val=40",
    "data.arithmetic.n_test=40",
    "sft.max_steps=60",
    "sft.lr=3e-4",
    "sft.eval_every=10",
    "sft.checkpoint_every=25",
    "sft.decay_patience=1",
    "sft.patience=4",
    "sft.log_every=1",
    "pretrain.max_steps=8",
    "pretrain.warmup_steps=2",
    "pretrain.batch_size=4",
    "pretrain.context_length=64",
    "pretrain.log_every=1",
    "reward_data.questions=64",
    "reward_data.samples_per_question=4",
    "reward_data.rollouts=64",
    "orm.epochs=2",
    "prm.epochs=2",
    "orm.batch_size=16",
    "prm.batch_size=16",
    "orm.checkpoint_every=3",
    "grpo.max_steps=4",
    "grpo.max_seconds=null",
    "grpo.questions_per_step=4",
    "grpo.group_size=4",
    "grpo.eval_every=2",
    "grpo.warmup_steps=2",
    "grpo.save_rollouts=true",
    "eval.max_new_tokens=40",
]
RULE = ["grpo.reward_weights={rule: 1.0}", "grpo.supervision=outcome"]


def weights(model_dir: str) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(model_dir).glob("*.safetensors")))).hexdigest()


def timeless(value):
    """``value`` without wall-time entries (``wall_s``, ``train_s``, ``elapsed_s``, ``time/...``,
    ``perf/...``), at any depth."""
    if isinstance(value, dict):
        return {
            k: timeless(v)
            for k, v in value.items()
            if k not in ("wall_s", "train_s", "elapsed_s") and not k.startswith(("time/", "perf/"))
        }
    return [timeless(v) for v in value] if isinstance(value, list) else value


def fingerprint(log: NullLogger, manifest: dict | None, root: Path) -> dict:
    metrics = [[step, timeless(m)] for step, m in log.history]
    out = {
        "metrics": metrics,
        "manifest": json.loads(json.dumps(timeless(manifest or {}), default=str).replace(str(root), "<root>")),
    }
    return out | ({"weights": weights(manifest["model"])} if manifest and "model" in manifest else {})


def run_all(init: str, root: Path) -> dict:
    cfg = load_config(RECIPE, SMALL)
    data = Path(run_prepare(cfg, root / "data")["dir"])
    (root / "corpus").mkdir(parents=True)
    with gzip.open(root / "corpus" / "part-00000.jsonl.gz", "wt") as f:
        for i in range(40):
            f.write(json.dumps({"url": f"u{i}", "text": f"{i % 7} + {i % 5} = {i % 7 + i % 5}"}) + "\n")
    out, logs = {}, {}

    def stage(name: str, fn) -> dict:
        logs[name] = NullLogger()
        manifest = fn(logs[name])
        out[name] = fingerprint(logs[name], manifest, root)
        return manifest

    stage("sft", lambda log: run_sft(cfg, data, root / "sft", log, init_from=init))
    stage("pretrain", lambda log: run_pretrain(cfg, root / "corpus", root / "pretrain", log))
    rd = stage("reward_data", lambda log: run_reward_data(cfg, data, init, root / "reward_data", log))
    prm = None
    for kind in ("orm", "prm"):
        m = stage(kind, lambda log: run_reward_model(cfg, kind, reward_datasets(rd), init, root / kind, log))
        prm = m["model"] if kind == "prm" else prm
    stage(
        "grpo_rule",
        lambda log: run_grpo(
            load_config(RECIPE, SMALL + RULE), data, init, root / "grpo_rule", log, pass_rates=rd["pass_rates"]
        ),
    )
    stage(
        "grpo_rule_prm",
        lambda log: run_grpo(
            cfg, data, init, root / "grpo_prm", log, reward_models={"prm": prm}, pass_rates=rd["pass_rates"]
        ),
    )
    for algorithm in ("online_rft", "rft", "ppo"):  # the paper's §5 algorithms on the rule reward
        no_kl = ["grpo.beta=0"] if algorithm != "ppo" else []  # RFT has no KL term: beta is refused
        acfg = load_config(RECIPE, SMALL + RULE + [f"grpo.algorithm={algorithm}"] + no_kl)
        stage(algorithm, lambda log: run_grpo(acfg, data, init, root / algorithm, log, pass_rates=rd["pass_rates"]))
    # Dynamic sampling (a slot without reward spread draws again) and a LoRA policy (its reference: the adapter off).
    for name, extra in (
        ("grpo_redraws", ["grpo.redraws=2", "grpo.curriculum=0.0"]),
        ("grpo_lora", ["grpo.lora={rank: 4, alpha: 8}", "grpo.lr=1e-3"]),
    ):
        xcfg = load_config(RECIPE, SMALL + RULE + extra)
        stage(name, lambda log: run_grpo(xcfg, data, init, root / name, log, pass_rates=rd["pass_rates"]))
    return out


def differences(a, b, path: str = "") -> list[str]:
    """Where two fingerprints differ: a path per differing leaf (``stage/metrics/3/train/lr``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}/{i}")]
    same = a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)  # NaN is NaN here
    return [] if same else [f"{path}: {a!r} -> {b!r}"[:160]]


def compare(a: dict, b: dict) -> dict:
    """Per stage and part, True when identical, else the first differing leaves and their count."""
    out = {}
    for name in a:
        for part in a[name]:
            diff = differences(a[name][part], b.get(name, {}).get(part))
            out[f"{name}/{part}"] = True if not diff else {"differences": len(diff), "first": diff[:3]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init", required=True, help="a trained SFT model folder, e.g. runs/demo/sft/model")
    p.add_argument("--out", required=True, help="the fingerprint (JSON)")
    p.add_argument("--compare", help="an earlier fingerprint to compare with")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_all(str(Path(a.init).resolve()), Path(tmp))
    Path(a.out).write_text(json.dumps(result, indent=1, sort_keys=True))
    summary = {"out": a.out}
    if a.compare:
        summary["same"] = compare(json.loads(Path(a.compare).read_text()), json.loads(Path(a.out).read_text()))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

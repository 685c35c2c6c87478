"""The position metric of a finished GRPO stage under every process credit, on its own batches.

Replays the stage's recorded rollouts (``rollouts.jsonl``: what each step trained on, in order, a
group's G completions together), scores them again with the stage's PRM and the checker, and gives
the mean advantage by step place in checker-silent groups (``advantages.position_profile``) that
each ``grpo.process_credit`` form would have given them: the before (the paper's ``sum``) and after
(``centred``) of the same samples. The form the stage trained with should match its own manifest's
``position_bias``, which the output carries beside the replay.

    python experiments/position_replay.py runs/demo/round-1 --json

The last line printed is JSON: per form, each place's mean over the steps (as the manifest's) and
over every silent step pooled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_core.advantages import PROCESS_CREDIT, position_profile, rollout_advantages  # noqa: E402
from grpo_core.data import prompt_text  # noqa: E402
from grpo_core.lm.modeling import load_tokenizer  # noqa: E402
from grpo_core.recipe import load_config  # noqa: E402
from grpo_core.rewards.score_command import encode  # noqa: E402
from grpo_core.rewards.scorer import RewardScorer  # noqa: E402

PLACES = ("first", "middle", "last", "answer")


def replay(round_dir: Path, config: Path) -> dict:
    run_cfg = load_config(config, [], migrate=True)
    cfg = run_cfg.grpo
    if cfg.supervision != "process":
        raise SystemExit(f"{round_dir}: its GRPO trained under outcome supervision: no process credit to replay")
    grpo = json.loads((round_dir / "grpo" / "manifest.json").read_text())
    rows = [json.loads(line) for line in (round_dir / "grpo" / "rollouts.jsonl").open()]
    tokenizer = load_tokenizer(grpo["init"])
    paths = {kind: round_dir / kind / "model" for kind in cfg.reward_models_used}  # the round's own
    scorer = RewardScorer.for_recipe(cfg, tokenizer, run_cfg.reward_data.step_separator, paths)
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    per_step = {c: {p: [] for p in PLACES} for c in PROCESS_CREDIT}
    pooled = {c: {p: [0.0, 0.0] for p in PLACES} for c in PROCESS_CREDIT}
    g = cfg.group_size
    for step in sorted(by_step):
        batch = by_step[step]
        rollout = encode(tokenizer, [prompt_text(r["question"]) for r in batch], [r["completion"] for r in batch])
        scored = scorer(rollout, [r["gold"] for r in batch], [r["question"] for r in batch])
        verdicts = scored.correct.reshape(-1, g)
        silent = (verdicts == verdicts[:, :1]).all(dim=1).repeat_interleave(g).nonzero().squeeze(1)
        for credit in PROCESS_CREDIT:
            adv = rollout_advantages(scored, len(batch) // g, g, rollout.completion_mask.shape[1], credit)
            profile = position_profile(adv[silent], scored.step_ends[silent], scored.step_mask[silent])
            for place, (total, count) in profile.items():
                if count:
                    per_step[credit][place].append(total / count)
                    pooled[credit][place][0] += total
                    pooled[credit][place][1] += count
    mean = lambda v: round(sum(v) / len(v), 4) if v else None  # noqa: E731
    return {
        "round_dir": str(round_dir),
        "steps": len(by_step),
        "trained_with": cfg.process_credit,
        "manifest_position_bias": {k: round(v, 4) for k, v in grpo.get("position_bias", {}).items()},
        "replayed": {
            c: {
                "mean_over_steps": {p: mean(per_step[c][p]) for p in PLACES},
                "pooled": {p: round(t / n, 4) if n else None for p, (t, n) in pooled[c].items()},
            }
            for c in PROCESS_CREDIT
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("round_dir", help="a finished round's folder, e.g. runs/demo/round-1 (grpo/, prm/)")
    p.add_argument("--config", help="the run's recipe (default: the run folder's config.yaml)")
    p.add_argument("--json", action="store_true", help="only the JSON line")
    a = p.parse_args()
    torch.set_num_threads(1)
    round_dir = Path(a.round_dir)
    out = replay(round_dir, Path(a.config or round_dir.parent / "config.yaml"))
    if not a.json:
        for credit, r in out["replayed"].items():
            print(credit, r["mean_over_steps"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""What passing a group's repeated solutions once saves (``Rollout.distinct``): the GRPO step of a
finished run's recipe from its SFT model, scored by its round-1 reward models, once as the stage
runs it and once with every row passed (``distinct`` replaced by the identity), alternating.

    .venv/bin/python bench/repeated_rollouts.py runs/demo [--config configs/demo.yaml] [--steps 6] [--rounds 2]

Prints one JSON object: per mode the median seconds of each part of a step (rollout, reward,
log-probs, update; the first step of each round is warm-up), the share of distinct rows, and the
training loss of the steps (the same in both modes: the repeats are weighted, not dropped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("time/rollout_s", "time/reward_s", "time/redraw_s", "time/advantage_s", "time/logprob_s", "time/update_s")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run", help="a finished run folder (runs/demo)")
    p.add_argument("--config", default="configs/demo.yaml", help="the run's recipe")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    import torch

    from grpo_core.data import read_split
    from grpo_core.env import setup_environment
    from grpo_core.lm import policy
    from grpo_core.lm.modeling import load_model
    from grpo_core.lm.runtime import set_compute
    from grpo_core.recipe import load_config
    from grpo_core.rewards.scorer import RewardScorer
    from grpo_core.stages.rl_step import Learner, rl_step
    from grpo_core.stages.questions import QuestionSampler, read_pass_rates
    from grpo_core.stages.rl_types import Models

    setup_environment()
    run = Path(a.run)
    cfg = load_config(a.config)
    set_compute(cfg.threads)
    gc = cfg.grpo
    pool = read_split(run / "data", "rl")
    rates = (
        read_pass_rates(run / "round-1" / "reward_data" / "pass_rates" / "pass_rates.jsonl") if gc.curriculum else None
    )
    sampler = QuestionSampler(pool, cfg.seed, rates, gc.curriculum)  # the run's own draw of questions
    distinct = policy.Rollout.distinct
    seen: list[float] = []

    def counted(self, *keys):
        rows = distinct(self, *keys)
        seen.append(len(rows.index) / len(rows.inverse))
        return rows

    def every_row(self, *keys):
        b = len(self.input_ids)
        return policy.Distinct(torch.arange(b), torch.arange(b), torch.ones(b, dtype=torch.long))

    models = {k: run / "round-1" / k / "model" for k in gc.reward_models_used}
    out: dict[str, dict[str, list[float]]] = {"distinct": {}, "every_row": {}}
    for _ in range(a.rounds):
        for mode in out:
            policy.Rollout.distinct = counted if mode == "distinct" else every_row
            model, tok = load_model(run / "sft" / "model")
            ref, _ = load_model(run / "sft" / "model")
            ref.eval().requires_grad_(False)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=gc.lr, betas=(0.9, 0.95), weight_decay=0.0)
            scorer = RewardScorer.for_recipe(gc, tok, cfg.reward_data.step_separator, models)
            for step in range(a.steps):
                learner = Learner(Models(model, ref), tok, opt, gc, scorer, cfg.seed, sampler)
                m = rl_step(learner, sampler.step(step, gc.questions_per_step), step)
                if step:
                    for k in (*PARTS, "train/loss"):
                        out[mode].setdefault(k, []).append(m.get(k, 0.0))  # redraw_s: with dynamic sampling
    policy.Rollout.distinct = distinct
    result = {mode: {k.split("/")[-1]: round(statistics.median(v), 4) for k, v in d.items()} for mode, d in out.items()}
    for mode in result:
        result[mode]["step_s"] = round(sum(result[mode][k.split("/")[-1]] for k in PARTS), 4)
    result["distinct_row_share"] = round(statistics.mean(seen), 3)
    result["every_row_over_distinct"] = round(result["every_row"]["step_s"] / result["distinct"]["step_s"], 3)
    result["work"] = {
        "questions": gc.questions_per_step,
        "group": gc.group_size,
        "rewards": gc.reward_weights,
        "supervision": gc.supervision,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

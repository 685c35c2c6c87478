"""What the RL stage keeps of its steps, for its manifest and for the reports that read it
(``flows/experiment_table.py``, ``figures.py``): the metrics recorded at every step (the manifest's
``rewards`` rows), those averaged over the last steps for the stage's summary, and the reward
models' staleness pooled over a span of steps."""

from __future__ import annotations

POSITION_METRICS = tuple(f"adv/silent_{place}" for place in ("first", "middle", "last", "answer"))
# Training metrics averaged over the last steps for the stage's summary (a round's report).
SUMMARY_METRICS = (
    "train/reward_mean",
    "train/kl",
    "train/accuracy",
    "train/frac_reward_zero_std",
    "train/frac_batch_zero_std",
)
SUMMARY_WINDOW = 10
# Kept at every step (the manifest's ``rewards``): the answer checker's accuracy on the rollouts beside
# the learned rewards' means (a gap that widens is the policy hacking a reward model); the study draws it.
# With them each learned reward model's within-question AUC on the policy's current samples (its
# staleness) and how many groups it was measured on.
RECORDED = (
    "train/accuracy",
    "train/reward_mean",
    "train/kl",
    "reward/orm_mean",
    "reward/prm_lowest_mean",
    "train/frac_reward_zero_std",
    "train/frac_batch_zero_std",
    "sampling/groups_drawn",
    "reward/orm_within_auc",
    "reward/orm_mixed_groups",
    "reward/prm_within_auc",
    "reward/prm_mixed_groups",
    # the mean advantage by step place in checker-silent groups (``grpo.position_metrics``): 0 unless biased
    *POSITION_METRICS,
)
LEARNED = {"orm": "orm_mean", "prm": "prm_lowest_mean"}  # each model's mean score of the step's solutions


def recorded(metrics: dict) -> dict:
    """A step's recorded metrics by their short names (``train/accuracy`` -> ``accuracy``): the
    manifest's ``rewards`` rows."""
    return {k.split("/")[-1]: v for k, v in metrics.items()}


def staleness(steps: list[dict]) -> dict[str, float]:
    """What the reward models in use are worth on the policy's samples of ``steps`` (their
    ``recorded`` metrics): per learned model, its within-question AUC against the answer checker
    pooled over the steps (the mean over every mixed group, so a step counts by its groups) and its
    mean score; the checker's accuracy beside them (the reward-hacking curve: a learned reward that
    rises while the checker's accuracy does not). Empty where no step had a learned reward with a
    mixed group."""
    out = {}
    for name, mean in LEARNED.items():
        mixed = sum(p.get(f"{name}_mixed_groups", 0.0) for p in steps)
        if mixed:
            out[f"staleness/{name}_within_auc"] = (
                sum(p[f"{name}_within_auc"] * p[f"{name}_mixed_groups"] for p in steps if p.get(f"{name}_mixed_groups"))
                / mixed
            )
            out[f"staleness/{name}_mean"] = sum(p[mean] for p in steps) / len(steps)
    if out:
        out["staleness/checker_accuracy"] = sum(p["accuracy"] for p in steps) / len(steps)
    return out

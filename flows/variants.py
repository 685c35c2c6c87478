"""The experiments' table: the variants an experiment preset can run (``VARIANTS``),
what each of those commands runs by default (``PRESETS``), and the budget every variant gets
(``Budget``). Data only, so that the CLI builds its flags and help from it without loading the flow
(``flows/experiment.py``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator


class Variant(BaseModel):
    """One arm from the run's SFT model: the ``grpo`` settings it puts over the recipe's (None:
    continued SFT; ``{}``: the recipe's GRPO) and its rounds (k > 1: GRPO in k shares of the budget,
    each from the last one's policy, the reference reset to it; None: the recipe's
    ``rounds.count``). Between rounds the reward models it uses are retrained on the policy's fresh
    samples plus a ``replay`` share of earlier data (None: the recipe's ``rounds.replay_fraction``),
    outside the budget, unless ``retrain`` is off: the round-1 reward models the whole way.
    ``against``: the variants its row is compared with, seed by seed (``gain_over_<name>``, and
    ``last_gain_over_<name>`` between the policies the runs ended with where keep-best kept another).
    ``labels_of``: a frozen arm that trains on the round-1 reward models in round 1, as that
    (retrained) variant does, and from round 2 on on its own, trained once before RL on as many of
    the SFT model's checker-labelled samples as that variant's reward models are given over all its
    rounds, for as many updates as they made (that variant runs first, seed by seed): as strong as
    the retrained ones by round 2, never fresher."""

    model_config = ConfigDict(frozen=True)
    about: str
    grpo: dict | None = None
    rounds: int | None = 1
    retrain: bool = True
    replay: float | None = None
    against: tuple[str, ...] = ()
    labels_of: str | None = None

    @model_validator(mode="after")
    def _labels_only_when_frozen(self):
        if self.labels_of and self.retrain:
            raise ValueError(f"labels_of={self.labels_of!r} is for a frozen arm (retrain=False)")
        return self


BASELINE, ONE_ROUND, TWO_ROUNDS, UNIFORM = "continued-sft", "prm-process", "prm-process-2-rounds", "uniform"
FROZEN, RETRAINED, EQUAL_LABELS = "frozen", "retrained", "frozen-equal-labels"
RULE = {"reward_weights": {"rule": 1.0}, "supervision": "outcome"}
# Process arms name their credit: a run recorded with another (the paper's sum) must not pass it on.
PRM = {"reward_weights": {"prm": 1.0}, "supervision": "process", "process_credit": "centred"}
RULE_PRM = PRM | {"reward_weights": {"rule": 1.0, "prm": 1.0}}  # the checker plus the PRM's step credit
# A learned reward alone never reads an answer, so every group is kept (the paper's draw): dynamic
# sampling reads the checker's verdicts under process supervision, and the ORM's arm draws as the PRM's.
LEARNED_ALONE = {"redraws": 0}
DYNAMIC = {"curriculum": 0.0, "redraws": 3}  # the sparse arms' draw: uniform, dynamic sampling
VARIANTS = {
    BASELINE: Variant(about="SFT continued on its worked solutions at the lr it ended with: the no-RL baseline"),
    # The paper's §5 algorithms on the answer checker; RFT has no KL term, so a recipe's beta is refused.
    "rft": Variant(
        about="rejection-sampling fine-tuning on the frozen SFT model's correct samples",
        grpo=RULE | {"algorithm": "rft", "beta": 0.0, "redraws": 0},
    ),
    # Dynamic sampling keeps groups by their GRPO advantages: these have none (a recipe's redraws would be refused).
    "online-rft": Variant(
        about="the same on the current policy's samples",
        grpo=RULE | {"algorithm": "online_rft", "beta": 0.0, "redraws": 0},
        against=("rft", "rule-outcome"),
    ),
    "ppo": Variant(
        about="a value model, GAE, the KL penalty in the per-token reward",
        grpo=RULE | {"algorithm": "ppo", "redraws": 0},
        against=("rule-outcome",),
    ),
    "rule-outcome": Variant(about="GRPO on the answer checker", grpo=RULE),
    "orm-outcome": Variant(
        about="GRPO on the run's round-1 ORM",
        grpo={"reward_weights": {"orm": 1.0}, "supervision": "outcome"} | LEARNED_ALONE,
    ),
    ONE_ROUND: Variant(
        about="GRPO with process supervision by the run's round-1 PRM (the centred credit)",
        grpo=PRM | LEARNED_ALONE,
        against=("orm-outcome",),
    ),
    # Separates the two things process supervision changes: the reward model (a PRM may rank better
    # than the ORM) and the credit (per step, not per solution).
    "prm-outcome": Variant(
        about="GRPO on the run's round-1 PRM read as one reward per solution (its lowest step "
        "score): the PRM without process credit",
        grpo={"reward_weights": {"prm": 1.0}, "supervision": "outcome"} | LEARNED_ALONE,
    ),
    # The paper's process advantage (every step of the group z-scored together, sum credit) and
    # PURE's min credit on it: each differs from the one it is compared with in the credit alone.
    "prm-process-paper": Variant(
        about="the same through the paper's process advantage (every step z-scored together, sum credit)",
        grpo=PRM | LEARNED_ALONE | {"process_credit": "sum"},
        against=(ONE_ROUND,),
    ),
    "prm-process-min-credit": Variant(
        about="the paper's process advantage with PURE's min-form credit",
        grpo=PRM | LEARNED_ALONE | {"process_credit": "min"},
        against=("prm-process-paper",),
    ),
    TWO_ROUNDS: Variant(
        about="two iterations of prm-process, half the budget each, the PRM retrained between them",
        grpo=PRM | LEARNED_ALONE,
        rounds=2,
        against=(ONE_ROUND,),
    ),
    "rule+orm-outcome": Variant(
        about="the answer checker plus the ORM's reward (outcome supervision), the recipe's draw",
        grpo={"reward_weights": {"rule": 1.0, "orm": 1.0}, "supervision": "outcome"},
        against=("rule-outcome",),
    ),
    "rule+prm-process": Variant(
        about="the answer checker plus the PRM's step credit, the demo's reward",
        grpo=RULE_PRM,
        against=("rule-outcome",),
    ),
    "rule+prm-process-paper": Variant(
        about="the same through the paper's process advantage (every step z-scored together, sum credit)",
        grpo=RULE_PRM | {"process_credit": "sum"},
        against=("rule-outcome", "rule+prm-process"),
    ),
    # Sparse rewards (grpo_core/stages/questions.py), on the recipe's own reward: which questions a step learns from.
    UNIFORM: Variant(
        about="the recipe's GRPO with questions drawn uniformly and every group kept (the paper)",
        grpo={"curriculum": 0.0, "redraws": 0},
    ),
    "dynamic": Variant(
        about="the same with dynamic sampling: a group without reward spread gives its place to another "
        "question's, up to 3 more groups per place",
        grpo={"curriculum": 0.0, "redraws": 3},
    ),
    "curriculum": Variant(
        about="3 in 4 of each step's questions from those the SFT model solved sometimes in its reward-data samples",
        grpo={"curriculum": 0.75, "redraws": 0},
    ),
    "dynamic+curriculum": Variant(about="both", grpo={"curriculum": 0.75, "redraws": 3}),
    # Where the checker is silent (most groups all wrong: no reward spread), a learned reward ranks
    # solutions inside every group: the checker with dynamic sampling against the same plus each
    # (dynamic sampling still judges a group by the checker's verdicts: ``questions.passes_dynamic_sampling``).
    "rule+orm": Variant(
        about="`dynamic` plus the round-1 ORM (outcome supervision)",
        grpo={"reward_weights": {"rule": 1.0, "orm": 1.0}, "supervision": "outcome", "curriculum": 0.0, "redraws": 3},
        against=("dynamic",),
    ),
    "rule+prm": Variant(
        about="`dynamic` plus the round-1 PRM's step credit (process supervision)",
        grpo=RULE_PRM | DYNAMIC,
        against=("dynamic",),
    ),
    # The upper bound of process supervision where the checker is silent: the exact step checker of
    # the arithmetic task as the PRM (``grpo.prm_oracle``).
    "rule+oracle-prm": Variant(
        about="`dynamic` plus the exact step checker's step credit (an oracle PRM; the arithmetic task only)",
        grpo=RULE_PRM | {"prm_oracle": True} | DYNAMIC,
        against=("dynamic", "rule+prm"),
    ),
    # Iterative RL (§4.2) on the recipe's own reward (``iterate``: a learned one alone), the recipe's
    # rounds sharing the budget; only what happens to the reward models between rounds differs.
    FROZEN: Variant(
        about="the recipe's GRPO in its rounds, the reference reset each round, the round-1 reward "
        "models the whole way",
        grpo={},
        rounds=None,
        retrain=False,
    ),
    RETRAINED: Variant(
        about="the same with the reward models retrained between rounds on the policy's fresh "
        "samples plus the recipe's replay share of earlier data (the paper: 10%)",
        grpo={},
        rounds=None,
        against=(FROZEN, EQUAL_LABELS),
    ),
    # Separates what retraining changes: fresher labels (the policy's own samples) from more labels
    # and more training, which this frozen arm gets too, all of them on the SFT model's samples.
    EQUAL_LABELS: Variant(
        about="frozen, round 1 on the round-1 reward models, then on reward models trained once before RL on "
        "as many of the SFT model's checker-labelled samples as `retrained`'s are given in all its rounds, with "
        "as many updates",
        grpo={},
        rounds=None,
        retrain=False,
        labels_of=RETRAINED,
        against=(FROZEN,),
    ),
    "retrained-no-replay": Variant(
        about="the same without replay: the fresh samples alone",
        grpo={},
        rounds=None,
        replay=0.0,
        against=(FROZEN, RETRAINED),
    ),
    "retrained-replay-50": Variant(
        about="the same with half of each retraining set replayed",
        grpo={},
        rounds=None,
        replay=0.5,
        against=(FROZEN, RETRAINED),
    ),
}


class Preset(BaseModel):
    """What a command runs by default. ``eval_every`` None: the recipe's; ``all_rounds``: the
    budget is GRPO's training time over every round (the baseline), not round 1's."""

    model_config = ConfigDict(frozen=True)
    about: str
    variants: tuple[str, ...]
    seeds: int = 3
    samples: int = 1
    sample_questions: int | None = None
    eval_every: int | None = None
    own_process: bool = False
    all_rounds: bool = False
    # Round 1's reward models trained by the experiment, from the run's SFT model under the
    # experiment's recipe (``--recipe``), instead of the run's own; the default budget in steps: the
    # recipe's grpo.max_steps in each of its rounds.
    own_reward_models: bool = False


PRESETS = {
    "compare": Preset(
        about="continued SFT and GRPO on the answer checker, the ORM and the PRM from one run's SFT "
        "model, several seeds each, with intervals",
        variants=(BASELINE, "rule-outcome", "orm-outcome", ONE_ROUND, "rule+prm-process"),
    ),
    "study": Preset(
        about="the paper's §5 study from one run's SFT model: continued SFT, RFT, online RFT, PPO, GRPO "
        "outcome / process, one round against two; several seeds, figures",
        variants=(
            BASELINE,
            "rft",
            "online-rft",
            "ppo",
            "rule-outcome",
            "orm-outcome",
            ONE_ROUND,
            "prm-process-paper",
            "prm-process-min-credit",
            TWO_ROUNDS,
        ),
        samples=16,
        sample_questions=500,
        eval_every=10,
        own_process=True,
    ),
    "sampling": Preset(
        about="where rewards are sparse: the recipe's GRPO with questions drawn uniformly (the paper), "
        "dynamic sampling, the pass-rate curriculum and both, from one run's SFT model, several "
        "seeds each, with intervals",
        variants=(UNIFORM, "dynamic", "curriculum", "dynamic+curriculum"),
    ),
    "sparse": Preset(
        about="where the checker is silent (most groups all wrong): GRPO on the checker with dynamic "
        "sampling against the checker plus the run's ORM, plus its PRM's step credit and plus an oracle "
        "PRM's (the exact step checker), from one run's SFT model, several seeds each, with intervals",
        variants=("dynamic", "rule+orm", "rule+prm", "rule+oracle-prm"),
        seeds=5,
    ),
    "iterate": Preset(
        about="iterative RL where a reward model can go stale: the recipe's learned reward alone, in its "
        "rounds, with the reward models frozen, retrained with the recipe's replay share, frozen after "
        "training on as many labels as retraining gives, retrained without replay and with half replayed; "
        "the same GRPO steps each, several seeds, intervals against frozen, the reward models' staleness "
        "on the policy's samples",
        variants=(FROZEN, RETRAINED, EQUAL_LABELS, "retrained-no-replay", "retrained-replay-50"),
        seeds=5,
        own_reward_models=True,
    ),
    "baseline": Preset(
        about="SFT continued for the seconds GRPO trained over every round, beside the SFT model and "
        "the run's policy (the no-RL baseline)",
        variants=(BASELINE,),
        seeds=1,
        all_rounds=True,
    ),
}


class Budget(BaseModel):
    """What every variant gets: seconds of training, or (``steps``) GRPO steps, i.e. samples (with
    dynamic sampling a step samples up to 1 + ``grpo.redraws`` times as many groups: the
    experiment's table says how many it drew)."""

    model_config = ConfigDict(frozen=True)
    seconds: float
    steps: int | None = None

    def grpo(self, rounds: int = 1, k: int = 1) -> dict:
        """The ``grpo`` section's budget for round ``k`` of ``rounds`` sharing it (the last takes the
        steps that do not divide evenly)."""
        if self.steps:
            return {
                "max_steps": self.steps // rounds + (self.steps % rounds if k == rounds else 0),
                "max_seconds": None,
            }
        return {"max_steps": 10**9, "max_seconds": self.seconds / rounds}

    def tag(self, eval_every: int) -> str:
        """The experiment's folder: another budget is another experiment, never a resume."""
        return (f"steps-{self.steps}" if self.steps else f"time-{self.seconds:g}s") + f"-eval{eval_every}"

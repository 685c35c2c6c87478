"""The experiments' table: the variants a ``compare``, ``study`` or ``baseline`` can run (``VARIANTS``),
what each of those commands runs by default (``PRESETS``), and the budget every variant gets
(``Budget``). Data only, so that the CLI builds its flags and help from it without loading the flow
(``flows/experiment.py``)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Variant(BaseModel):
    """One arm from the run's SFT model: the ``grpo`` settings it puts over the recipe's (None:
    continued SFT), and rounds (2: GRPO in two halves of the budget, the PRM retrained between them
    on the policy's fresh samples plus a 10% replay, outside the budget; the reference reset)."""

    model_config = ConfigDict(frozen=True)
    about: str
    grpo: dict | None = None
    rounds: int = 1


BASELINE, ONE_ROUND, TWO_ROUNDS, UNIFORM = "continued-sft", "prm-process", "prm-process-2-rounds", "uniform"
RULE = {"reward_weights": {"rule": 1.0}, "supervision": "outcome"}
PRM = {"reward_weights": {"prm": 1.0}, "supervision": "process"}
VARIANTS = {
    BASELINE: Variant(about="SFT continued on its worked solutions at the lr it ended with: the no-RL baseline"),
    # The paper's §5 algorithms on the answer checker; RFT has no KL term, so a recipe's beta is refused.
    "rft": Variant(about="rejection-sampling fine-tuning on the frozen SFT model's correct samples",
                   grpo=RULE | {"algorithm": "rft", "beta": 0.0, "redraws": 0}),
    # Dynamic sampling keeps groups by their GRPO advantages: these have none (a recipe's redraws would be refused).
    "online-rft": Variant(about="the same on the current policy's samples",
                          grpo=RULE | {"algorithm": "online_rft", "beta": 0.0, "redraws": 0}),
    "ppo": Variant(about="a value model, GAE, the KL penalty in the per-token reward",
                   grpo=RULE | {"algorithm": "ppo", "redraws": 0}),
    "rule-outcome": Variant(about="GRPO on the answer checker", grpo=RULE),
    "orm-outcome": Variant(about="GRPO on the run's round-1 ORM", grpo={"reward_weights": {"orm": 1.0}, "supervision": "outcome"}),
    ONE_ROUND: Variant(about="GRPO with process supervision by the run's round-1 PRM, the paper's sum credit", grpo=PRM),
    # Separates the two things process supervision changes: the reward model (a PRM may rank better
    # than the ORM) and the credit (per step, not per solution).
    "prm-outcome": Variant(about="GRPO on the run's round-1 PRM read as one reward per solution (its lowest step "
                                 "score): the PRM without process credit", grpo={"reward_weights": {"prm": 1.0},
                                                                                 "supervision": "outcome"}),
    "prm-process-min-credit": Variant(about="the same with PURE's min-form credit", grpo=PRM | {"process_credit": "min"}),
    TWO_ROUNDS: Variant(about="two iterations of prm-process, half the budget each, the PRM retrained between them",
                        grpo=PRM, rounds=2),
    "rule+prm-process": Variant(about="the answer checker plus the PRM's step credit, the demo's reward",
                                grpo={"reward_weights": {"rule": 1.0, "prm": 1.0}, "supervision": "process"}),
    # Sparse rewards (grpo_core/stages/questions.py), on the recipe's own reward: which questions a step learns from.
    UNIFORM: Variant(about="the recipe's GRPO with questions drawn uniformly and every group kept (the paper)",
                     grpo={"curriculum": 0.0, "redraws": 0}),
    "dynamic": Variant(about="the same with dynamic sampling: a group without reward spread gives its place to another "
                             "question's, up to 3 more groups per place", grpo={"curriculum": 0.0, "redraws": 3}),
    "curriculum": Variant(about="3 in 4 of each step's questions from those the SFT model solved sometimes in its "
                                "reward-data samples", grpo={"curriculum": 0.75, "redraws": 0}),
    "dynamic+curriculum": Variant(about="both", grpo={"curriculum": 0.75, "redraws": 3}),
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


PRESETS = {
    "compare": Preset(about="continued SFT and GRPO on the answer checker, the ORM and the PRM from one run's SFT "
                            "model, several seeds each, with intervals",
                      variants=(BASELINE, "rule-outcome", "orm-outcome", ONE_ROUND, "rule+prm-process")),
    "study": Preset(about="the paper's §5 study from one run's SFT model: continued SFT, RFT, online RFT, PPO, GRPO "
                          "outcome / process, one round against two; several seeds, figures",
                    variants=(BASELINE, "rft", "online-rft", "ppo", "rule-outcome", "orm-outcome", ONE_ROUND,
                              "prm-process-min-credit", TWO_ROUNDS),
                    samples=16, sample_questions=500, eval_every=10, own_process=True),
    "sampling": Preset(about="where rewards are sparse: the recipe's GRPO with questions drawn uniformly (the paper), "
                             "dynamic sampling, the pass-rate curriculum and both, from one run's SFT model, several "
                             "seeds each, with intervals",
                       variants=(UNIFORM, "dynamic", "curriculum", "dynamic+curriculum")),
    "baseline": Preset(about="SFT continued for the seconds GRPO trained over every round, beside the SFT model and "
                             "the run's policy (the no-RL baseline)",
                       variants=(BASELINE,), seeds=1, all_rounds=True),
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
            return {"steps": self.steps // rounds + (self.steps % rounds if k == rounds else 0), "max_seconds": None}
        return {"steps": 10**9, "max_seconds": self.seconds / rounds}

    def tag(self, eval_every: int) -> str:
        """The experiment's folder: another budget is another experiment, never a resume."""
        return (f"steps-{self.steps}" if self.steps else f"time-{self.seconds:g}s") + f"-eval{eval_every}"

"""The one training loop that SFT, continued pretraining, the reward models and GRPO run on.

Like minGPT's trainer it knows nothing of the model: a stage hands it a ``step`` (one optimizer
update, or GRPO's exploration stage, returning its metrics) and an ``evaluate``; the loop owns the
budget (steps, epochs, wall time), the learning-rate schedule, the AdamW optimizer built from the
config section, the gradient step with clipping, periodic evaluation with keep-best and
plateau / patience, crash-safe checkpoints with resume, and the stop reason.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo_core.training.checkpoint import resume_point, rng_state, save_checkpoint, set_rng_state, write_whole
from grpo_core.training.distributed import Dist
from grpo_core.lm.modeling import save_model
from grpo_core.training.schedules import learning_rate
from grpo_core.tracking import MetricLogger


@dataclass
class TrainState:
    """Everything a resume restores besides the weights, the optimizer and the RNG."""

    step: int = 0  # optimizer steps (GRPO: exploration stages) taken
    epoch: int = 0
    row: int = 0  # where the epoch's next batch starts (a packed row, an RM's batch)
    tokens: int = 0  # loss tokens trained on, all processes
    elapsed: float = 0.0  # wall seconds, across resumes
    eval_s: float = 0.0  # of which evaluating: not training, so outside the time budget
    best_acc: float = -math.inf  # best evaluation score so far (accuracy, an RM's AUC)
    best_step: int = 0
    best_metrics: dict = field(default_factory=dict)
    bad_evals: int = 0  # regular evaluations in a row without improvement
    plateau_lr: float = 0.0  # the reduce-on-plateau schedule's lr
    stopped: str = ""  # "", "steps", "epochs", "time" or "patience"
    extra: dict = field(default_factory=dict)  # a stage's own counters (GRPO's recent metrics, ...)
    curve: list = field(default_factory=list)  # every evaluation: {step, elapsed_s (training seconds), metrics...}
    history: list = field(default_factory=list)  # every step: {step, elapsed_s, the Plan's ``record`` metrics}

    @property
    def train_s(self) -> float:
        """Seconds spent training (``max_seconds`` budgets these): wall time less evaluations."""
        return self.elapsed - self.eval_s


@dataclass(frozen=True)
class Plan:
    """How long and how often, from a stage's config section."""

    max_steps: int | None = None
    max_epochs: int | None = None
    steps_per_epoch: int | None = None  # with max_epochs: the total the progress lines count down from
    log_every: int = 1
    eval_every: int | None = None  # steps between evaluations
    per_epoch: bool = False  # also evaluate and checkpoint when an epoch ends (the reward models)
    eval_first: bool = False  # the starting model is a candidate (GRPO never returns a worse one)
    eval_last: bool = False  # evaluate the final model even off the grid (otherwise only if none was)
    keep_best: str | None = None  # the metric whose best model is published; None: the last model
    record: tuple[str, ...] = ()  # step metrics kept at every step with its training time (``TrainState.history``)
    patience: int = 0  # stop after this many regular evaluations without improvement
    decay_patience: int = 1  # plateau schedule: lower the lr after this many
    decay_factor: float = 0.5
    min_lr: float = 0.0


STOP_REASONS = {
    "": "max_steps reached",
    "steps": "max_steps reached",
    "epochs": "epochs done",
    "time": "time budget of {sc.max_seconds}s reached",
    "patience": "validation accuracy did not improve for {plan.patience} evaluations",
}


class Stopwatch:
    """Wall time that survives a resume: ``offset`` is the time spent before the restart."""

    def __init__(self, offset: float = 0.0) -> None:
        self.start = time.perf_counter() - offset

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def optimizer_step(model, opt, loss: torch.Tensor, scale: float, max_grad_norm: float) -> float:
    """One optimizer step on ``loss * scale`` (a process's share of the global loss, times the
    world size as DDP averages the gradients), clipped; returns the gradient norm before clipping.
    The gradients are freed once applied, so they are not held through the next step's forward."""
    opt.zero_grad(set_to_none=True)
    (loss * scale).backward()
    return apply_gradients(model, opt, max_grad_norm, loss)


def apply_gradients(model, opt, max_grad_norm: float, loss: torch.Tensor) -> float:
    """The optimizer step on the gradients backward has put on ``model`` (one pass's or several
    passes' summed), clipped; returns the gradient norm before clipping (``loss``: for the message
    where the gradient is not finite). The gradients are freed once applied."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)  # FSDP: a DTensor
    if not math.isfinite(norm):  # the same on every process (DDP averaged the gradients): all stop
        opt.zero_grad(set_to_none=True)
        raise FloatingPointError(
            f"the gradient is not finite (norm {norm}, loss {float(loss.detach()):.4g}): the update was not applied"
        )
    opt.step()
    opt.zero_grad(set_to_none=True)
    return norm


def find_resume(ckpt_root: Path, identity: dict):
    """(checkpoint, state) to resume from, or (None, None) for a fresh start. Checkpoints written
    under another identity are moved aside to ``<root>.stale-<n>``, never resumed or lost."""
    latest, state = resume_point(ckpt_root)
    if latest is None:
        return None, None
    if state.get("identity") != identity:
        n = 0
        while (stale := ckpt_root.with_name(f"{ckpt_root.name}.stale-{n}")).exists():
            n += 1
        ckpt_root.rename(stale)
        print(
            f"warning: checkpoints in {ckpt_root} were written by another recipe or start; moved to {stale}",
            file=sys.stderr,
        )
        return None, None
    return latest, state


# A long stage is never silent: a line on stdout this often (steps done of the budget, rate, time left).
PROGRESS_EVERY_S = 30.0


def progress_line(stage: str, st: TrainState, plan: Plan, max_seconds: float | None) -> str:
    """``[prm] step 120/400, epoch 2/3, 2.10 steps/s, about 2 min left``: where a stage is, from its
    counters (steps across resumes over training seconds) and its budget."""
    rate = st.step / max(st.train_s, 1e-9)
    by_epochs = plan.steps_per_epoch * plan.max_epochs if plan.steps_per_epoch and plan.max_epochs else None
    total = min((b for b in (plan.max_steps, by_epochs) if b), default=None)  # whichever budget ends first
    parts = [f"step {st.step}" + (f"/{total}" if total else "")]
    if plan.max_epochs:
        parts.append(f"epoch {min(st.epoch + 1, plan.max_epochs)}/{plan.max_epochs}")
    parts.append(f"{rate:.2f} steps/s")
    left = ([max(total - st.step, 0) / rate] if total and rate > 0 else []) + (
        [max_seconds - st.train_s] if max_seconds else []
    )
    if left:
        parts.append(time_left(min(left)))
    return f"[{stage}] " + ", ".join(parts)


def time_left(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"about {seconds / 60:.0f} min left" if seconds >= 90 else f"about {seconds:.0f} s left"


class Trainer:
    """Construct with the stage's checkpoint identity; ``resume`` is then the checkpoint folder to
    load the model from (or None). ``start`` builds the optimizer and restores the counters,
    ``fit`` runs the loop, ``publish`` writes ``model/``."""

    def __init__(self, cfg, section: str, out_dir: Path, identity: dict, d: Dist, logger) -> None:
        self.cfg, self.section, self.sc, self.out_dir, self.identity, self.d, self.logger = (
            cfg,
            section,
            getattr(cfg, section),
            out_dir,
            identity,
            d,
            logger,
        )
        self.root = out_dir / "checkpoints"
        self.resume, self._saved = d.main_first(lambda: find_resume(self.root, identity))
        self.wrapped = None

    def wrap(self, module):
        """The module the steps train through (``Dist.wrap``: DDP, or FSDP's shards), before ``start``:
        FSDP replaces the parameters the optimizer is built on. Rank 0's evaluations and the saves
        gather it whole (``Dist.gathered``, ``Dist.full_state``)."""
        self.wrapped = self.d.wrap(module)
        return self.wrapped

    def start(self, model, tokenizer, plan: Plan, companions: dict | None = None) -> TrainState:
        """AdamW over ``model``'s parameters with the section's settings; counters, optimizer and
        RNG from the checkpoint being resumed. ``companions``: other modules the stage trains beside
        the model (PPO's value model), ``{name: (module, lr_scale)}``: each gets an AdamW of its own
        (``self.companions[name]``: (module, optimizer)) on the same schedule, its lr ``lr_scale``
        times the model's, checkpointed with the model and restored on resume."""
        if self.d.sharded and self.wrapped is None:
            raise RuntimeError(
                "launch.strategy=fsdp: call Trainer.wrap before Trainer.start (FSDP replaces the "
                "parameters the optimizer is built on)"
            )
        self.model, self.tokenizer, self.plan = model, tokenizer, plan
        sc = self.sc

        def adamw(groups):
            return torch.optim.AdamW(groups, lr=sc.lr, betas=sc.betas, weight_decay=sc.weight_decay)

        # A model may ask for its own parameter groups (minGPT's ``configure_optimizers``): a group's
        # ``lr_scale`` multiplies the scheduled learning rate.
        self.opt = adamw(
            model.optimizer_groups(sc.weight_decay) if hasattr(model, "optimizer_groups") else model.parameters()
        )
        self.companions = {
            name: (module, adamw([{"params": list(module.parameters()), "lr_scale": scale}]))
            for name, (module, scale) in (companions or {}).items()
        }
        self.state = TrainState(plateau_lr=sc.lr)
        if self._saved is not None:
            self.d.load_optimizer_state(model, self.opt, self._saved["optimizer"])
            self.state = TrainState(**self._saved["counters"])
            set_rng_state(self._saved["rng"])
            for name, (module, opt) in self.companions.items():
                module.load_state_dict(self._saved["companions"][name]["module"])
                opt.load_state_dict(self._saved["companions"][name]["optimizer"])
            if self.d.main:
                print(
                    f"[{self.section}] resuming from step {self.state.step} ({self.resume})",
                    file=sys.stderr,
                    flush=True,
                )
        return self.state

    def fit(
        self, step: Callable[[TrainState], dict | None], evaluate: Callable[[TrainState], dict] | None = None
    ) -> TrainState:
        """Run ``step`` until the budget is spent. ``step`` returns its metrics, or None when it
        trained nothing (a batch too short to split over the processes); it advances ``row`` /
        ``epoch`` itself. ``evaluate`` (rank 0 only) returns metrics including ``plan.keep_best``."""
        st, plan, sc = self.state, self.plan, self.sc
        clock = Stopwatch(st.elapsed)
        if st.stopped == "time" and (sc.max_seconds is None or st.train_s < sc.max_seconds):
            st.stopped = ""  # resumed with a larger time budget
        if plan.eval_first and st.step == 0 and st.best_acc == -math.inf:
            self._evaluate(evaluate, regular=False)
        said, saved = time.monotonic(), st.step  # the last checkpoint: the one resumed from (0: none)
        while not st.stopped:
            if plan.max_steps is not None and st.step >= plan.max_steps:
                st.stopped = "steps"
                break
            if plan.max_epochs is not None and st.epoch >= plan.max_epochs:
                st.stopped = "epochs"
                break
            lr = learning_rate(sc, st.step, st.plateau_lr)
            self._set_lr(lr)
            epoch = st.epoch
            metrics = self._run_step(step, saved)
            epoch_end = plan.per_epoch and st.epoch > epoch
            if metrics is None and not epoch_end:
                continue
            if metrics is not None:
                said = self._count_step(metrics, lr, clock, said)
            last = bool(st.stopped) or st.step == plan.max_steps or st.epoch == plan.max_epochs
            regular = epoch_end or (
                metrics is not None and plan.eval_every is not None and st.step % plan.eval_every == 0
            )
            if evaluate and (regular or (last and (plan.eval_last or st.best_acc == -math.inf))):
                self._evaluate(evaluate, regular)
            grid = metrics is not None and sc.checkpoint_every and st.step % sc.checkpoint_every == 0
            if grid or last or epoch_end or st.stopped:  # (an evaluation may have stopped it)
                self._checkpoint(clock)
                saved = st.step
        st.elapsed = clock.elapsed
        return st

    def _set_lr(self, lr: float) -> None:
        """The scheduled ``lr`` on every optimizer's groups, times a group's ``lr_scale``."""
        for opt in [self.opt] + [o for _, o in self.companions.values()]:
            for group in opt.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)

    def _run_step(self, step: Callable[[TrainState], dict | None], saved: int) -> dict | None:
        """``step`` on the state; a gradient that is not finite stops the stage with where it resumes
        (``saved``: the step of the last checkpoint, 0 for none)."""
        st = self.state
        try:
            return step(st)
        except FloatingPointError as e:
            resume = (
                f"its last checkpoint (step {saved}) is where the same command resumes"
                if saved
                else "it has no checkpoint yet: the same command starts it over"
            )
            raise FloatingPointError(f"{self.section} step {st.step + 1}: {e}; the stage stops, and {resume}") from e

    def _count_step(self, metrics: dict, lr: float, clock: Stopwatch, said: float) -> float:
        """A step that trained: count it, record and log its metrics, stop on the time budget (rank 0's
        clock decides for all), and print a progress line when one is due since ``said``; returns
        when the last one was printed."""
        st, plan, sc, d = self.state, self.plan, self.sc, self.d
        st.step += 1
        st.elapsed = clock.elapsed
        if plan.record:
            st.history.append(
                {
                    "step": st.step,
                    "elapsed_s": round(st.train_s, 2),
                    **{k: metrics[k] for k in plan.record if k in metrics},
                }
            )
        if st.step % plan.log_every == 0:  # a tracking call per step can cost more than the step
            rate = {"perf/tokens_per_s": st.tokens / max(st.elapsed, 1e-9)} if st.tokens else {}
            self.logger.log_metrics({"train/lr": lr} | metrics | rate, step=st.step)
        if sc.max_seconds is not None and st.train_s >= sc.max_seconds:
            st.stopped = "time"
        st.stopped = d.broadcast(st.stopped)
        if d.main and time.monotonic() - said >= PROGRESS_EVERY_S:
            said = time.monotonic()
            print(progress_line(self.section, st, plan, sc.max_seconds), file=sys.stderr, flush=True)
        return said

    def _checkpoint(self, clock: Stopwatch) -> None:
        """A checkpoint of the model, the optimizers, the counters and the RNG (every rank gathers
        the state; rank 0 writes it)."""
        st, d = self.state, self.d
        st.elapsed = clock.elapsed
        weights, optimizer = d.full_state(self.model), d.optimizer_state(self.model, self.opt)  # every rank
        if d.main:
            save_checkpoint(
                self.root,
                st.step,
                self.model,
                self.tokenizer,
                {
                    "optimizer": optimizer,
                    "counters": dataclasses.asdict(st),
                    "companions": {
                        name: {"module": m.state_dict(), "optimizer": o.state_dict()}
                        for name, (m, o) in self.companions.items()
                    },
                    "rng": rng_state(),
                    "identity": self.identity,
                    "config": self.cfg.model_dump(mode="json"),
                },
                keep=self.sc.keep_checkpoints,
                weights=weights,
            )

    def _evaluate(self, evaluate, regular: bool) -> None:
        """Evaluate on rank 0, keep the model if it is the best so far, and (regular evaluations
        only, so that a resumed or extended run sees the same ones) run the plateau controller."""
        st, plan, d = self.state, self.plan, self.d
        start = time.perf_counter()
        with d.gathered(self.wrapped):
            metrics = d.broadcast(evaluate(st) if d.main else None)
        self.logger.log_metrics(metrics, step=st.step)
        # Against training time too (the study's accuracy-over-time figure); the evaluation's own
        # time is not training time (nor in the budget), whatever the evaluation schedule.
        st.curve.append({"step": st.step, "elapsed_s": round(st.train_s, 2), **metrics})
        st.eval_s += d.broadcast(time.perf_counter() - start)
        if plan.keep_best is None:
            return
        score = metrics[plan.keep_best]
        score = score if score == score else -1.0  # an undefined score (an AUC of one class) never wins
        if score > st.best_acc:
            st.best_acc, st.best_step, st.best_metrics, st.bad_evals = score, st.step, metrics, 0
            weights = d.full_state(self.model)  # every rank
            if d.main:
                write_whole(self.out_dir / "best", lambda tmp: save_model(self.model, self.tokenizer, tmp, weights))
        elif regular:
            st.bad_evals += 1
            if st.bad_evals % plan.decay_patience == 0:
                st.plateau_lr = max(st.plateau_lr * plan.decay_factor, plan.min_lr)
            if plan.patience and st.bad_evals >= plan.patience:
                st.stopped = "patience"

    def stop_reason(self) -> str:
        return STOP_REASONS[self.state.stopped].format(sc=self.sc, plan=self.plan)

    def publish(self, keep_last: bool = False) -> Path | None:
        """``model/``: the best-evaluated model (a copy of ``best/``), or the last one when nothing
        is kept by score; ``keep_last``: the last one also as ``last/`` where another was kept (what
        training ended with, beside what was published). Every rank calls it (FSDP gathers the
        weights); rank 0 writes and gets the folder, the others None."""
        final_dir = self.out_dir / "model"
        last = self.plan.keep_best is None or (keep_last and self.state.best_step != self.state.step)
        weights = self.d.full_state(self.model) if last else None
        if not self.d.main:
            return None
        if self.plan.keep_best is None:
            return write_whole(final_dir, lambda tmp: save_model(self.model, self.tokenizer, tmp, weights))
        if last:
            write_whole(self.out_dir / "last", lambda tmp: save_model(self.model, self.tokenizer, tmp, weights))
        return write_whole(final_dir, lambda tmp: shutil.copytree(self.out_dir / "best", tmp))


@dataclass(frozen=True)
class Started:
    """A supervised stage ready to loop (SFT, a reward model): the processes, this process's logger,
    the loop (``start`` called), the model and what trains through it (``Trainer.wrap``), its
    tokenizer and the forward pass's precision context. Each stage's own ``Built`` adds its rows."""

    d: Dist
    logger: MetricLogger
    trainer: Trainer
    model: torch.nn.Module
    tokenizer: object
    trained: torch.nn.Module
    amp: Callable

"""Reward-model training stage: the ORM (``orm.objective``: BCE on every checked solution,
Bradley-Terry on chosen/rejected pairs, or both) or the PRM (BCE on step labels), keeping the epoch
whose held-out ranking of one question's solutions is best (``within_question_auc``: what GRPO's
group-normalised reward sees), on the shared training loop (``trainer.py``). What differs between
the two kinds is one ``RewardModelKind`` each (``KINDS``). Checkpoints at every epoch end; a rerun
resumes there.

Round 1 starts from ``orm.init`` / ``prm.init`` (the SFT checkpoint by default). A later RL round
continues the previous round's reward model on the fresh samples of the current policy plus a
replay of earlier rounds' rows (``rounds.replay_fraction`` of the set); the held-out rows are the
fresh ones only, and the model's held-out metrics before training (``heldout_before``) measure how
stale it had become.
"""

from __future__ import annotations

import functools
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from grpo_core.config import PipelineConfig
from grpo_core.lm.modeling import load_model, load_tokenizer, tiny_llama
from grpo_core.lm.policy import encode
from grpo_core.training import distributed
from grpo_core.rewards.heads import (
    ScoreHead,
    bradley_terry_loss,
    load_reward_model,
    orm_logits,
    is_verifier_head,
    pointwise_bce_loss,
    question_aucs,
    prm_step_logits,
    reward_model_from,
    step_bce_loss,
)
from grpo_core.digests import digest_dir
from grpo_core.lm.runtime import autocast, model_device, place, set_compute
from grpo_core.manifests import Ref, write_manifest
from grpo_core.rewards.gate import quality_gate
from grpo_core.rewards.likelihood import likelihood_scores
from grpo_core.rewards.replay import load_version, retraining_set
from grpo_core.stages.identity import run_identity
from grpo_core.stages.reward_metrics import (
    evaluate_orm,
    evaluate_prm,
    Ranking,
    prm_step_metrics,
    solution_metrics,
    solution_ranking,
    step_ranking,
    solution_text,
    step_batch,
)
from grpo_core.tracking import MetricLogger, NullLogger
from grpo_core.training.trainer import Plan, Started, TrainState, Trainer, optimizer_step


def run_reward_model(
    cfg: PipelineConfig,
    kind: str,
    reward_data: dict[str, Ref],
    init_dir: str | Path,
    out_dir: Path,
    logger: MetricLogger | None = None,
    round_: int = 1,
    replay: Ref | None = None,
    baseline: str | Path | None = None,
) -> dict:
    """Train the ``kind`` ("orm" or "prm") reward model on the reward-data stage's datasets
    (``reward_data``: by name, as ``outputs.reward_datasets`` reads them from its manifest).

    ``replay`` (rounds after the first): the replay buffer's version ``round_ - 1``;
    ``rounds.replay_fraction`` of the training set is then drawn from it.
    ``baseline``: a causal LM (the SFT model) whose own likelihood, untrained, is measured on the
    same held-out rows (``baseline`` in the manifest): a reward model that does not beat it is a
    defect the quality gate reports.

    Under torchrun each process trains on a contiguous share of every batch (a last batch with
    fewer rows than processes is skipped), the loss is normalised by the global batch's pairs or
    steps, and rank 0 evaluates, logs, checkpoints and returns the manifest (the others: None)."""
    run = build(cfg, kind, reward_data, init_dir, out_dir, logger, round_, replay)
    spec, rc, sep = KINDS[kind], getattr(cfg, kind), cfg.reward_data.step_separator

    def evaluate(st: TrainState) -> dict:  # once the baseline has been read: against it, question by question
        held_out = spec.evaluate(
            run.model, run.tokenizer, run.held_out, sep, rc.batch_size, st.extra.get("baseline_aucs")
        )
        return {f"heldout/{k}": v for k, v in held_out.items()}

    if run.trainer.resume is None:
        starting_quality(run, cfg, kind, evaluate, baseline, out_dir)
    run.model.train()
    # The loop: (batch -> update -> log -> [epoch end: evaluate -> keep best -> checkpoint])*.
    st = run.trainer.fit(training_step(run, spec, cfg, rc.batch_size), evaluate)
    final_dir = run.trainer.publish()
    if not run.d.main:
        return None
    best = {k.removeprefix("heldout/"): v for k, v in st.best_metrics.items()}
    gate = quality_gate(spec.gate_metric, best, rc.min_auc, st.extra.get("baseline"), rc.min_questions)
    run.logger.log_metrics({"quality_gate/passed": float(gate["passed"])})
    return write_manifest(out_dir, manifest(kind, cfg, run, st, best, gate, final_dir, init_dir, round_))


@dataclass(frozen=True)
class Built(Started):
    """``Started``, with the training rows, their mix and the held-out rows (``training_rows``)."""

    train: list[tuple[str, dict]]
    mix: dict
    held_out: dict[str, list[dict]]


def build(
    cfg: PipelineConfig,
    kind: str,
    reward_data: dict[str, Ref],
    init_dir: str | Path,
    out_dir: Path,
    logger: MetricLogger | None,
    round_: int,
    replay: Ref | None,
) -> Built:
    """The run's set-up (``run_reward_model``'s arguments): the processes, the rows, the model to
    train (from its last checkpoint where one is) and the loop started on its plan."""
    d = distributed.init(cfg.launch)
    logger = (logger or NullLogger()) if d.main else NullLogger()
    spec, rc = KINDS[kind], getattr(cfg, kind)
    sep = cfg.reward_data.step_separator
    set_compute(cfg.threads)
    torch.manual_seed(cfg.seed)
    train, mix, held_out = training_rows(cfg, kind, reward_data, replay, round_, logger)
    identity = run_identity(
        cfg,
        kind,
        init=digest_dir(Path(init_dir)),
        separator=sep,
        reward_data={n: reward_data[n].digest for n in spec.datasets(cfg)},
        round=round_,
        **({"replay": replay.digest, "replay_fraction": cfg.rounds.replay_fraction} if replay is not None else {}),
    )  # round 1 has no history to replay
    trainer = Trainer(cfg, kind, out_dir, identity, d, logger)
    model = place(resume_or_init(trainer.resume, init_dir, kind, cfg, round_), cfg.launch, train="reward_model")
    model.config.step_separator = sep  # saved with the model: `grpo-pipeline score` splits steps as we do
    amp = functools.partial(autocast, cfg.launch, model_device(model))
    tokenizer = load_tokenizer(trainer.resume or init_dir)
    trained = trainer.wrap(
        model if is_verifier_head(model) else ScoreHead(model)
    )  # one module whose forward is the whole computation
    trainer.start(
        model,
        tokenizer,
        Plan(
            max_steps=rc.max_steps,
            max_epochs=rc.epochs,
            steps_per_epoch=-(-len(train) // rc.batch_size),
            per_epoch=True,
            eval_last=True,
            keep_best=f"heldout/{spec.gate_metric}",
        ),
    )
    return Built(d, logger, trainer, model, tokenizer, trained, amp, train, mix, held_out)


def starting_quality(
    run: Built,
    cfg: PipelineConfig,
    kind: str,
    evaluate: Callable[[TrainState], dict],
    baseline: str | Path | None,
    out_dir: Path,
) -> None:
    """Before a fresh start's first step: the ``baseline`` verifier on the fresh held-out samples (its
    metrics, and its AUC by question, which every later evaluation is paired with), then the starting
    model (last round's, or the SFT model's fresh head) on the same rows (its staleness,
    ``before_metrics``), kept in the state's extras and logged at step 0."""
    d, st, logger, spec, rc = run.d, run.trainer.state, run.logger, KINDS[kind], getattr(cfg, kind)
    if d.main:
        shutil.rmtree(out_dir / "best", ignore_errors=True)  # never publish another run's model
    if baseline is not None and d.main:
        rows, sep = run.held_out[spec.held_out[0]], cfg.reward_data.step_separator
        st.extra["baseline"], st.extra["baseline_aucs"] = evaluate_likelihood(baseline, kind, rows, sep, rc.batch_size)
        logger.log_metrics({f"baseline/{k}": v for k, v in st.extra["baseline"].items()}, step=0)
    with d.gathered(run.trained):
        before = d.broadcast(evaluate(st) if d.main else None)
    st.extra["before_metrics"] = {k.removeprefix("heldout/"): v for k, v in before.items()}
    logger.log_metrics({f"heldout_before/{k}": v for k, v in st.extra["before_metrics"].items()}, step=0)


def training_step(run: Built, spec: RewardModelKind, cfg: PipelineConfig, batch_size: int):
    """The step for ``Trainer.fit``: the epoch's next batch of training rows (the epoch's order is
    the same on resume), this process's share of it, and one clipped update on its loss. Returns
    None for a batch with fewer rows than processes (skipped by all)."""
    d, trainer, train = run.d, run.trainer, run.train

    @functools.lru_cache(maxsize=1)
    def batches_of(epoch: int) -> list[list[int]]:
        order = list(range(len(train)))
        random.Random(cfg.seed + epoch).shuffle(order)
        return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]

    def step(st: TrainState) -> dict | None:
        batches = batches_of(st.epoch)
        batch = batches[st.row]
        st.row += 1
        if st.row == len(batches):
            st.epoch, st.row = st.epoch + 1, 0
        if len(batch) < d.world:
            return None
        rows = [train[i] for i in batch[d.split(len(batch))]]
        by_dataset: dict[str, list[dict]] = {}
        for name, row in rows:
            by_dataset.setdefault(name, []).append(row)
        with run.amp():
            terms = spec.loss_terms(run.trained, run.tokenizer, by_dataset, cfg)
        # Each local mean re-weighted into this process's share of the global batch's mean.
        share = sum(local * (n / max(float(d.sum(n)), 1.0)) for local, n in terms)
        grad_norm = optimizer_step(trainer.model, trainer.opt, share, d.world, trainer.sc.max_grad_norm)  # DDP averages
        return {"train/loss": float(d.sum(share.detach())), "train/grad_norm": grad_norm}

    return step


def manifest(
    kind: str,
    cfg: PipelineConfig,
    run: Built,
    st: TrainState,
    best: dict,
    gate: dict,
    final_dir: Path,
    init_dir: str | Path,
    round_: int,
) -> dict:
    """The stage's manifest: the published model, where it started, its quality (before training,
    the baseline's, the best) and its gate, how training went and what it trained on."""
    return {
        "stage": kind,
        "model": str(final_dir),
        "init": str(init_dir),
        "init_from": getattr(cfg, kind).init if round_ == 1 else "previous round",
        "quality_gate": gate,
        "round": round_,
        "heldout_before": st.extra.get("before_metrics", {}),
        "baseline": st.extra.get("baseline", {}),
        "heldout": best,
        "best_epoch_step": st.best_step,
        "steps": st.step,
        "epochs": st.epoch,
        "n_train": len(run.train),
        "n_test": len(run.held_out[KINDS[kind].held_out[0]]),
        "replay": run.mix,
        "wall_s": round(st.elapsed, 1),
    }


def orm_loss_terms(
    model, tokenizer, batch: dict[str, list[dict]], cfg: PipelineConfig
) -> list[tuple[torch.Tensor, int]]:
    """(mean loss, rows) of the batch's checked ``solutions`` (pointwise BCE) and of its ``pairs``
    (Bradley-Terry), from one forward pass; a term with no rows is (0, 0)."""
    pairs, solutions = batch.get("pairs", []), batch.get("solutions", [])
    prompts = [r["prompt"] for r in pairs] * 2 + [r["prompt"] for r in solutions]
    texts = [r["chosen"] for r in pairs] + [r["rejected"] for r in pairs] + [r["completion"] for r in solutions]
    scores = orm_logits(model, encode(tokenizer, prompts, texts))
    n = len(pairs)
    zero = scores.sum() * 0.0  # keeps every parameter in the graph (DDP) when a term is empty
    pointwise = (
        pointwise_bce_loss(scores[2 * n :], torch.tensor([float(r["correct"]) for r in solutions]))
        if solutions
        else zero
    )
    pairwise = bradley_terry_loss(scores[:n], scores[n : 2 * n]) if pairs else zero
    return [(pointwise, len(solutions)), (pairwise, n)]


def prm_loss_terms(
    model, tokenizer, batch: dict[str, list[dict]], cfg: PipelineConfig
) -> list[tuple[torch.Tensor, float]]:
    """(mean step BCE, steps) of the batch's ``steps`` rows against their ``prm.label`` labels."""
    rollout, ends, labels, mask = step_batch(tokenizer, batch["steps"], cfg.reward_data.step_separator, cfg.prm.label)
    return [(step_bce_loss(prm_step_logits(model, rollout, ends), labels, mask), float(mask.sum()))]


@dataclass(frozen=True)
class RewardModelKind:
    """What differs between the ORM and the PRM, in one place: the datasets it trains on (an ORM's
    chosen by ``orm.objective``) and the loss of a batch of them, the held-out datasets it is
    measured on (the first holds the rows the zero-training verifier is measured on too) and how,
    which of the verifier's scores that measure reads, and the metric its quality gate and
    keep-best read: the ranking within a question, what GRPO's group-normalised reward sees."""

    datasets: Callable[[PipelineConfig], tuple[str, ...]]
    loss_terms: Callable[..., list[tuple[torch.Tensor, float]]]
    held_out: tuple[str, ...]
    evaluate: Callable[..., dict[str, float]]
    verifier_metrics: Callable[[list[float], list[list[float]], list[dict]], dict[str, float]]
    ranking: Callable[[list[float], list[list[float]], list[dict]], Ranking]
    gate_metric: str = "within_question_auc"


ORM_DATASETS = {"pointwise": ("solutions",), "pairwise": ("pairs",), "both": ("solutions", "pairs")}  # by orm.objective
KINDS = {
    "orm": RewardModelKind(
        datasets=lambda cfg: ORM_DATASETS[cfg.orm.objective],
        loss_terms=orm_loss_terms,
        held_out=("solutions", "pairs"),
        evaluate=evaluate_orm,
        verifier_metrics=lambda solution, steps, rows: solution_metrics(solution, rows),
        ranking=lambda solution, steps, rows: solution_ranking(solution, rows),
    ),
    "prm": RewardModelKind(
        datasets=lambda cfg: ("steps",),
        loss_terms=prm_loss_terms,
        held_out=("steps",),
        evaluate=evaluate_prm,
        verifier_metrics=lambda solution, steps, rows: prm_step_metrics(steps, rows),
        ranking=lambda solution, steps, rows: step_ranking(steps, rows),
    ),
}
EMPTY = {
    "pairs": "no question had both a right and a wrong sample",
    "solutions": "no solution was sampled",
    "steps": "no sample had a step",
}  # why a dataset can be empty


@torch.no_grad()
def evaluate_likelihood(
    lm_dir: str | Path, kind: str, rows: list[dict], separator: str, batch: int
) -> tuple[dict[str, float], dict[str, float]]:
    """The zero-training verifier (``rewards.likelihood``: the causal LM ``lm_dir`` read through its own
    token probabilities) on the held-out rows of a ``kind`` reward model, by the same metrics: the
    baseline every trained reward model must beat; and its AUC by question (``question_aucs``)."""
    lm, tokenizer = load_model(lm_dir)
    lm.eval()
    solutions, steps = [], []
    for s in range(0, len(rows), batch):
        part = rows[s : s + batch]
        texts = [solution_text(r, separator) for r in part]
        whole, step_p, mask = likelihood_scores(
            lm, tokenizer, encode(tokenizer, [r["prompt"] for r in part], texts), separator
        )
        solutions += whole.tolist()
        steps += [step_p[i, : int(mask[i].sum())].tolist() for i in range(len(part))]
    spec = KINDS[kind]
    return spec.verifier_metrics(solutions, steps, rows), question_aucs(*spec.ranking(solutions, steps, rows))


def combined_mix(mixes: list[dict]) -> dict:
    """``retraining_set``'s statistics summed over the datasets a model trains on."""
    fresh, replay, wanted = (sum(m[k] for m in mixes) for k in ("fresh", "replay", "replay_wanted"))
    by_round: dict[int, int] = {}
    for m in mixes:
        for r, n in m["by_round"].items():
            by_round[r] = by_round.get(r, 0) + n
    return {
        "fresh": fresh,
        "replay": replay,
        "replay_wanted": wanted,
        "share": replay / max(1, fresh + replay),
        "by_round": dict(sorted(by_round.items())),
    }


def resume_or_init(resume, init_dir: str | Path, kind: str, cfg: PipelineConfig, round_: int):
    """The model to train: the checkpoint to resume, else ``init_dir`` (the SFT model or last round's
    reward model), except in round 1 when ``<kind>.init`` names another starting point. A checkpoint
    or last round's model is what its folder holds; round 1 puts ``<kind>.head`` on its start."""
    if resume is not None:
        return load_reward_model(resume, kind)
    rc = getattr(cfg, kind)
    if round_ > 1:
        return load_reward_model(init_dir, kind)
    if rc.init == "sft":
        return load_reward_model(init_dir, kind, rc.head, rc.lm_tokens)
    tokenizer = load_tokenizer(init_dir)
    if rc.init == "tiny":
        shape = cfg.model.model_copy(update=dict(rc.tiny))
        return reward_model_from(tiny_llama(shape, tokenizer, cfg.seed), kind, rc.head, tokenizer, rc.lm_tokens)
    model = load_reward_model(rc.init, kind, rc.head, rc.lm_tokens)
    if load_tokenizer(rc.init).get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            f"{kind}.init = {rc.init}: its tokenizer differs from the policy's ({init_dir}); a reward "
            f"model must read the policy's tokens"
        )
    return model


def training_rows(
    cfg: PipelineConfig, kind: str, reward_data: dict[str, Ref], replay: Ref | None, round_: int, logger: MetricLogger
) -> tuple[list[tuple[str, dict]], dict, dict[str, list[dict]]]:
    """The ``kind`` model's training rows, ``(dataset, row)`` (each dataset's fresh rows plus its
    share of the replay buffer's version ``replay``), their mix (``combined_mix``) and the held-out
    rows by dataset; an error naming the dataset when there is nothing to train or measure on."""
    from datasets import load_from_disk

    spec, names = KINDS[kind], KINDS[kind].datasets(cfg)
    train: list[tuple[str, dict]] = []  # (dataset, row): the loss of a row is its dataset's
    mixes = []
    for name in names:  # each dataset's fresh rows plus its replay share
        fresh = load_from_disk(reward_data[name].path)["train"].to_list()
        rows, mix = retraining_set(
            fresh, load_version(replay and replay.path, name), cfg.rounds.replay_fraction, cfg.seed, round_
        )
        train += [(name, r) for r in rows]
        mixes.append(mix)
        logger.log_input(
            name=f"reward_data/{name}",
            digest=reward_data[name].digest,
            source=reward_data[name].path,
            rows={"train": len(fresh)},
        )
        if replay is not None:
            logger.log_input(
                name=f"replay/{Path(replay.path).name}/{name}",
                digest=replay.digest,
                source=str(Path(replay.path) / name),
                rows={"replayed": mix["replay"], **{f"from_round_{r}": n for r, n in mix["by_round"].items()}},
            )
    mix = combined_mix(mixes)
    held_out = {name: load_from_disk(reward_data[name].path)["test"].to_list() for name in spec.held_out}
    empty = names[0] if not mix["fresh"] else spec.held_out[0] if not held_out[spec.held_out[0]] else None
    if empty is not None:
        raise ValueError(
            f"{kind}: no {'training' if not mix['fresh'] else 'held-out'} rows in "
            f"{reward_data[empty].path}: {EMPTY[empty]}; raise reward_data.questions or "
            "reward_data.samples_per_question, or train the policy further"
        )
    logger.log_metrics(
        {
            "replay/share": mix["share"],
            "replay/rows": mix["replay"],
            "replay/fresh_rows": mix["fresh"],
            **{f"replay/from_round_{r}": n for r, n in mix["by_round"].items()},
        }
    )
    return train, mix, held_out

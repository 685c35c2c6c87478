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
from grpo_core.lm.modeling import load_tokenizer, tiny_llama
from grpo_core.lm.policy import encode
from grpo_core.training import distributed
from grpo_core.rewards.heads import (
    ScoreHead,
    bradley_terry_loss,
    first_wrong_step,
    load_reward_model,
    orm_logits,
    is_verifier_head,
    pointwise_bce_loss,
    prm_step_logits,
    reward_model_from,
    roc_auc,
    step_bce_loss,
    within_question_auc,
)
from grpo_core.digests import digest_dir
from grpo_core.lm.runtime import autocast, model_device, place, set_compute
from grpo_core.manifests import Ref, write_manifest
from grpo_core.rewards.gate import quality_gate
from grpo_core.rewards.likelihood import likelihood_scores
from grpo_core.rewards.replay import load_version, retraining_set
from grpo_core.rewards.steps import rollout_step_ends
from grpo_core.stages.identity import run_identity
from grpo_core.tracking import MetricLogger, NullLogger
from grpo_core.training.trainer import Plan, TrainState, Trainer, optimizer_step


def solution_text(row: dict, separator: str) -> str:
    """A reward-data row's solution: the sample as generated when the dataset has it (ours does),
    else its steps joined (TRL's step form)."""
    return row.get("completion") or separator.join(row.get("completions", []))


def step_batch(tokenizer, rows: list[dict], separator: str, label: str):
    """Rollout of the solutions in ``rows`` and [B, K] step ends, labels and mask."""
    texts = [solution_text(r, separator) for r in rows]
    rollout = encode(tokenizer, [r["prompt"] for r in rows], texts)
    ends, mask = rollout_step_ends(tokenizer, rollout, separator)  # as GRPO finds them on its rollouts
    labels = torch.zeros(mask.shape)
    for i, (r, text) in enumerate(zip(rows, texts)):
        values = r["soft_labels"] if label == "soft" else [float(x) for x in r["labels"]]
        m = int(mask[i].sum())
        if m != len(values):
            raise ValueError(
                f"step data row {i} of the batch: {len(values)} labels for {m} steps of "
                f"{text!r} split on {separator!r}; was the data labelled with another separator?"
            )
        labels[i, :m] = torch.tensor(values, dtype=torch.float)
    return rollout, ends, labels, mask


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


def solution_metrics(scores: list[float], rows: list[dict]) -> dict[str, float]:
    """Held-out quality of solution scores against ``rows``' ``correct``: what GRPO's group-normalised
    reward sees (the AUC within each question, averaged over questions with right and wrong
    solutions) beside the AUC pooled across questions (where length and operands help)."""
    labels = [bool(r["correct"]) for r in rows]
    within, mixed = within_question_auc(scores, labels, [r["prompt"] for r in rows])
    return {
        "within_question_auc": within,
        "mixed_questions": float(mixed),
        "auc": roc_auc(scores, labels),
        "n_solutions": float(len(rows)),
    }


def prm_step_metrics(probs: list[list[float]], rows: list[dict]) -> dict[str, float]:
    """Held-out quality of per-step probabilities against ``rows``' step labels: step accuracy and
    AUC (against the exact labels too where present), how often the first step scored < 0.5 is the
    first step labelled wrong, and within each question the AUC of the lowest step against a
    solution having no wrong step (what GRPO sees of a PRM whose lowest step is the reward)."""
    flat = [(x, y) for r, p in zip(rows, probs) for x, y in zip(p, r["labels"])]
    exact = [(x, y) for r, p in zip(rows, probs) if r["exact_labels"] for x, y in zip(p, r["exact_labels"])]
    with_error = [(r, p) for r, p in zip(rows, probs) if first_wrong_step(r["labels"]) is not None]
    found = sum(first_wrong_step([x >= 0.5 for x in p]) == first_wrong_step(r["labels"]) for r, p in with_error)
    scored = [
        (min(p), all(r["labels"]), r["prompt"]) for r, p in zip(rows, probs) if p
    ]  # a solution with no step: no verdict
    within, mixed = within_question_auc(*map(list, zip(*scored))) if scored else (float("nan"), 0)
    out = {
        "within_question_auc": within,
        "mixed_questions": float(mixed),
        "step_accuracy": sum((x >= 0.5) == y for x, y in flat) / max(1, len(flat)),
        "step_auc": roc_auc([x for x, _ in flat], [y for _, y in flat]),
        "first_wrong_step_detected": found / max(1, len(with_error)),
        "n_steps": float(len(flat)),
    }
    if exact:
        out["step_auc_exact"] = roc_auc([x for x, _ in exact], [y for _, y in exact])
    return out


@torch.no_grad()
def evaluate_orm(model, tokenizer, held_out: dict[str, list[dict]], separator: str, batch: int) -> dict[str, float]:
    """``solution_metrics`` of the ORM's scores of the held-out ``solutions``, and its accuracy on
    the held-out ``pairs`` (chosen above rejected)."""
    model.eval()
    pairs, solutions, wins, scores = held_out["pairs"], held_out["solutions"], 0, []
    for s in range(0, len(pairs), batch):
        rows = pairs[s : s + batch]
        both = orm_logits(
            model,
            encode(
                tokenizer, [r["prompt"] for r in rows] * 2, [r["chosen"] for r in rows] + [r["rejected"] for r in rows]
            ),
        )
        wins += int((both[: len(rows)] > both[len(rows) :]).sum())
    for s in range(0, len(solutions), batch):
        rows = solutions[s : s + batch]
        scores += orm_logits(
            model, encode(tokenizer, [r["prompt"] for r in rows], [r["completion"] for r in rows])
        ).tolist()
    model.train()
    return solution_metrics(scores, solutions) | ({"pairwise_accuracy": wins / len(pairs)} if pairs else {})


@torch.no_grad()
def evaluate_prm(model, tokenizer, held_out: dict[str, list[dict]], separator: str, batch: int) -> dict[str, float]:
    """``prm_step_metrics`` of the PRM's step probabilities on the held-out ``steps``."""
    model.eval()
    rows, probs = held_out["steps"], []
    for s in range(0, len(rows), batch):
        part = rows[s : s + batch]
        rollout, ends, _, mask = step_batch(tokenizer, part, separator, "hard")
        p = torch.sigmoid(prm_step_logits(model, rollout, ends))
        probs += [p[i, : int(mask[i].sum())].tolist() for i in range(len(part))]
    model.train()
    return prm_step_metrics(probs, rows)


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
    gate_metric: str = "within_question_auc"


ORM_DATASETS = {"pointwise": ("solutions",), "pairwise": ("pairs",), "both": ("solutions", "pairs")}  # by orm.objective
KINDS = {
    "orm": RewardModelKind(
        datasets=lambda cfg: ORM_DATASETS[cfg.orm.objective],
        loss_terms=orm_loss_terms,
        held_out=("solutions", "pairs"),
        evaluate=evaluate_orm,
        verifier_metrics=lambda solution, steps, rows: solution_metrics(solution, rows),
    ),
    "prm": RewardModelKind(
        datasets=lambda cfg: ("steps",),
        loss_terms=prm_loss_terms,
        held_out=("steps",),
        evaluate=evaluate_prm,
        verifier_metrics=lambda solution, steps, rows: prm_step_metrics(steps, rows),
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
) -> dict[str, float]:
    """The zero-training verifier (``rewards.likelihood``: the causal LM ``lm_dir`` read through its own
    token probabilities) on the held-out rows of a ``kind`` reward model, by the same metrics: the
    baseline every trained reward model must beat."""
    from grpo_core.lm.modeling import load_model

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
    return KINDS[kind].verifier_metrics(solutions, steps, rows)


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
    d = distributed.init(cfg.launch)
    logger = (logger or NullLogger()) if d.main else NullLogger()
    spec, rc = KINDS[kind], getattr(cfg, kind)
    sep = cfg.reward_data.step_separator
    set_compute(cfg.threads)
    torch.manual_seed(cfg.seed)
    names = spec.datasets(cfg)
    train, mix, held_out = training_rows(cfg, kind, reward_data, replay, round_, logger)
    identity = run_identity(
        cfg,
        kind,
        init=digest_dir(Path(init_dir)),
        separator=sep,
        reward_data={n: reward_data[n].digest for n in names},
        round=round_,
        **({"replay": replay.digest, "replay_fraction": cfg.rounds.replay_fraction} if replay is not None else {}),
    )  # round 1 has no history to replay
    trainer = Trainer(cfg, kind, out_dir, identity, d, logger)
    model = place(resume_or_init(trainer.resume, init_dir, kind, cfg, round_), cfg.launch, train=True)
    model.config.step_separator = sep  # saved with the model: `grpo-pipeline score` splits steps as we do
    amp = functools.partial(autocast, cfg.launch, model_device(model))
    tokenizer = load_tokenizer(trainer.resume or init_dir)
    trained = trainer.wrap(
        model if is_verifier_head(model) else ScoreHead(model)
    )  # one module whose forward is the whole computation
    st = trainer.start(
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

    def evaluate(st: TrainState) -> dict:
        return {f"heldout/{k}": v for k, v in spec.evaluate(model, tokenizer, held_out, sep, rc.batch_size).items()}

    if trainer.resume is None:
        if d.main:
            shutil.rmtree(out_dir / "best", ignore_errors=True)  # never publish another run's model
        # Staleness: the starting model (last round's, or the SFT model's fresh head) on the fresh samples.
        with d.gathered(trained):
            before = d.broadcast(evaluate(st) if d.main else None)
        st.extra["before_metrics"] = {k.removeprefix("heldout/"): v for k, v in before.items()}
        logger.log_metrics({f"heldout_before/{k}": v for k, v in st.extra["before_metrics"].items()}, step=0)
        if baseline is not None and d.main:
            st.extra["baseline"] = evaluate_likelihood(baseline, kind, held_out[spec.held_out[0]], sep, rc.batch_size)
            logger.log_metrics({f"baseline/{k}": v for k, v in st.extra["baseline"].items()}, step=0)
    model.train()

    @functools.lru_cache(maxsize=1)
    def batches_of(epoch: int) -> list[list[int]]:  # the epoch's order: the same on resume
        order = list(range(len(train)))
        random.Random(cfg.seed + epoch).shuffle(order)
        return [order[s : s + rc.batch_size] for s in range(0, len(order), rc.batch_size)]

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
        with amp():
            terms = spec.loss_terms(trained, tokenizer, by_dataset, cfg)
        # Each local mean re-weighted into this process's share of the global batch's mean.
        share = sum(local * (n / max(float(d.sum(n)), 1.0)) for local, n in terms)
        grad_norm = optimizer_step(trainer.model, trainer.opt, share, d.world, trainer.sc.max_grad_norm)  # DDP averages
        return {"train/loss": float(d.sum(share.detach())), "train/grad_norm": grad_norm}

    # The loop: (batch -> update -> log -> [epoch end: evaluate -> keep best -> checkpoint])*.
    st = trainer.fit(step, evaluate)
    final_dir = trainer.publish()
    if not d.main:
        return None
    best = {k.removeprefix("heldout/"): v for k, v in st.best_metrics.items()}
    gate = quality_gate(spec.gate_metric, best, rc.min_auc, st.extra.get("baseline"))
    logger.log_metrics({"quality_gate/passed": float(gate["passed"])})
    return write_manifest(
        out_dir,
        {
            "stage": kind,
            "model": str(final_dir),
            "init": str(init_dir),
            "init_from": rc.init if round_ == 1 else "previous round",
            "quality_gate": gate,
            "round": round_,
            "heldout_before": st.extra.get("before_metrics", {}),
            "baseline": st.extra.get("baseline", {}),
            "heldout": best,
            "best_epoch_step": st.best_step,
            "steps": st.step,
            "epochs": st.epoch,
            "n_train": len(train),
            "n_test": len(held_out[spec.held_out[0]]),
            "replay": mix,
            "wall_s": round(st.elapsed, 1),
        },
    )

"""Reward-model training stage: the ORM (``orm.objective``: BCE on every checked solution,
Bradley-Terry on chosen/rejected pairs, or both) or the PRM (BCE on step labels), keeping the epoch
with the best held-out AUC (ORM: of the solution score against correctness; PRM: of the step
score against the step labels), on the shared training loop (``trainer.py``). Checkpoints at every
epoch end; a rerun resumes there.

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
from pathlib import Path

import torch

from grpo_core.training import distributed
from grpo_core.config import PipelineConfig
from grpo_core.lm.modeling import load_tokenizer, tiny_llama
from grpo_core.lm.policy import encode
from grpo_core.rewards.heads import (ScoreHead, bradley_terry_loss, first_wrong_step, load_reward_model, orm_logits,
                                     is_likelihood, pointwise_bce_loss, prm_step_logits, reward_model_from, roc_auc,
                                     step_bce_loss, within_question_auc)
from grpo_core.rewards.likelihood import likelihood_scores
from grpo_core.stages.common import digest_dir, run_identity, set_threads, write_manifest
from grpo_core.training.trainer import Plan, Trainer, TrainState
from grpo_core.lm.runtime import autocast, model_device, place
from grpo_core.rewards.replay import load_version, retraining_set
from grpo_core.rewards.scorer import rollout_step_ends
from grpo_core.tracking import MetricLogger, NullLogger


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
            raise ValueError(f"step data row {i} of the batch: {len(values)} labels for {m} steps of "
                             f"{text!r} split on {separator!r}; was the data labelled with another separator?")
        labels[i, :m] = torch.tensor(values, dtype=torch.float)
    return rollout, ends, labels, mask


def pair_logits(model, tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """[B] ORM logits of the chosen and of the rejected solutions of ``rows``, in one forward pass."""
    prompts = [r["prompt"] for r in rows]
    scores = orm_logits(model, encode(tokenizer, prompts + prompts,
                                      [r["chosen"] for r in rows] + [r["rejected"] for r in rows]))
    return scores[: len(rows)], scores[len(rows) :]


# The reward-data datasets each model trains on.
TRAINING_DATA = {("orm", "pointwise"): ("solutions",), ("orm", "pairwise"): ("outcome",),
                 ("orm", "both"): ("solutions", "outcome"), ("prm", None): ("steps",)}


def orm_loss_terms(model, tokenizer, rows: list[dict]) -> list[tuple[torch.Tensor, int]]:
    """(mean loss, rows) of the batch's checked solutions (pointwise BCE) and of its pairs
    (Bradley-Terry), from one forward pass; a term with no rows is (0, 0)."""
    pairs = [r for r in rows if "chosen" in r]
    solutions = [r for r in rows if "chosen" not in r]
    prompts = [r["prompt"] for r in pairs] * 2 + [r["prompt"] for r in solutions]
    texts = [r["chosen"] for r in pairs] + [r["rejected"] for r in pairs] + [r["completion"] for r in solutions]
    scores = orm_logits(model, encode(tokenizer, prompts, texts))
    n = len(pairs)
    zero = scores.sum() * 0.0  # keeps every parameter in the graph (DDP) when a term is empty
    pointwise = (pointwise_bce_loss(scores[2 * n :], torch.tensor([float(r["correct"]) for r in solutions]))
                 if solutions else zero)
    pairwise = bradley_terry_loss(scores[:n], scores[n : 2 * n]) if pairs else zero
    return [(pointwise, len(solutions)), (pairwise, n)]


def solution_metrics(scores: list[float], rows: list[dict]) -> dict[str, float]:
    """Held-out quality of solution scores against ``rows``' ``correct``: what GRPO's group-normalised
    reward sees (the AUC within each question, averaged over questions with right and wrong
    solutions) beside the AUC pooled across questions (where length and operands help)."""
    labels = [bool(r["correct"]) for r in rows]
    within, mixed = within_question_auc(scores, labels, [r["prompt"] for r in rows])
    return {"within_question_auc": within, "mixed_questions": float(mixed), "auc": roc_auc(scores, labels),
            "n_solutions": float(len(rows))}


def step_metrics(probs: list[list[float]], rows: list[dict]) -> dict[str, float]:
    """Held-out quality of per-step probabilities against ``rows``' step labels: step accuracy and
    AUC (against the exact labels too where present), how often the first step scored < 0.5 is the
    first step labelled wrong, and within each question the AUC of the lowest step against a
    solution having no wrong step (what GRPO sees of a PRM whose lowest step is the reward)."""
    flat = [(x, y) for r, p in zip(rows, probs) for x, y in zip(p, r["labels"])]
    exact = [(x, y) for r, p in zip(rows, probs) if r["exact_labels"] for x, y in zip(p, r["exact_labels"])]
    with_error = [(r, p) for r, p in zip(rows, probs) if first_wrong_step(r["labels"]) is not None]
    found = sum(first_wrong_step([x >= 0.5 for x in p]) == first_wrong_step(r["labels"]) for r, p in with_error)
    scored = [(min(p), all(r["labels"]), r["prompt"]) for r, p in zip(rows, probs) if p]  # a solution with no step: no verdict
    within, mixed = within_question_auc(*map(list, zip(*scored))) if scored else (float("nan"), 0)
    out = {"within_question_auc": within, "mixed_questions": float(mixed),
           "step_accuracy": sum((x >= 0.5) == y for x, y in flat) / max(1, len(flat)),
           "step_auc": roc_auc([x for x, _ in flat], [y for _, y in flat]),
           "first_wrong_step_detected": found / max(1, len(with_error)), "n_steps": float(len(flat))}
    if exact:
        out["step_auc_exact"] = roc_auc([x for x, _ in exact], [y for _, y in exact])
    return out


@torch.no_grad()
def evaluate_orm(model, tokenizer, pairs: list[dict], solutions: list[dict], batch: int) -> dict[str, float]:
    """``solution_metrics`` of the ORM's scores, and its held-out pairwise accuracy."""
    model.eval()
    wins, scores = 0, []
    for s in range(0, len(pairs), batch):
        chosen, rejected = pair_logits(model, tokenizer, pairs[s : s + batch])
        wins += int((chosen > rejected).sum())
    for s in range(0, len(solutions), batch):
        rows = solutions[s : s + batch]
        scores += orm_logits(model, encode(tokenizer, [r["prompt"] for r in rows], [r["completion"] for r in rows])).tolist()
    model.train()
    return solution_metrics(scores, solutions) | ({"pairwise_accuracy": wins / len(pairs)} if pairs else {})


@torch.no_grad()
def evaluate_prm(model, tokenizer, rows: list[dict], separator: str, batch: int) -> dict[str, float]:
    """``step_metrics`` of the PRM's step probabilities."""
    model.eval()
    probs: list[list[float]] = []
    for s in range(0, len(rows), batch):
        part = rows[s : s + batch]
        rollout, ends, _, mask = step_batch(tokenizer, part, separator, "hard")
        p = torch.sigmoid(prm_step_logits(model, rollout, ends))
        probs += [p[i, : int(mask[i].sum())].tolist() for i in range(len(part))]
    model.train()
    return step_metrics(probs, rows)


@torch.no_grad()
def evaluate_likelihood(lm_dir: str | Path, kind: str, rows: list[dict], separator: str, batch: int) -> dict[str, float]:
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
        whole, step_p, mask = likelihood_scores(lm, tokenizer, encode(tokenizer, [r["prompt"] for r in part], texts),
                                                separator)
        solutions += whole.tolist()
        steps += [step_p[i, : int(mask[i].sum())].tolist() for i in range(len(part))]
    return solution_metrics(solutions, rows) if kind == "orm" else step_metrics(steps, rows)


# The held-out metric that says how good a reward model is, for what GRPO uses of it (a ranking of
# one question's solutions): training keeps the epoch with the best, and the quality gate reads it.
QUALITY_KEY = {"orm": "within_question_auc", "prm": "within_question_auc"}


def combined_mix(mixes: list[dict]) -> dict:
    """``retraining_set``'s statistics summed over the datasets a model trains on."""
    fresh, replay, wanted = (sum(m[k] for m in mixes) for k in ("fresh", "replay", "replay_wanted"))
    by_round: dict[int, int] = {}
    for m in mixes:
        for r, n in m["by_round"].items():
            by_round[r] = by_round.get(r, 0) + n
    return {"fresh": fresh, "replay": replay, "replay_wanted": wanted, "share": replay / max(1, fresh + replay),
            "by_round": dict(sorted(by_round.items()))}


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
        return load_reward_model(init_dir, kind, rc.head)
    tokenizer = load_tokenizer(init_dir)
    if rc.init == "tiny":
        shape = cfg.model.model_copy(update=dict(rc.tiny))
        return reward_model_from(tiny_llama(shape, tokenizer, cfg.seed), kind, rc.head)
    model = load_reward_model(rc.init, kind, rc.head)
    if load_tokenizer(rc.init).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"{kind}.init = {rc.init}: its tokenizer differs from the policy's ({init_dir}); a reward "
                         f"model must read the policy's tokens")
    return model


def run_reward_model(cfg: PipelineConfig, kind: str, reward_data: dict, init_dir: str | Path, out_dir: Path,
                     logger: MetricLogger | None = None, replay: dict | None = None,
                     baseline: str | Path | None = None) -> dict:
    """Train the ``kind`` ("orm" or "prm") reward model on the reward-data stage's datasets.

    ``replay`` (later RL rounds): ``{"round": k, "dir": buffer version k-1, "digest": its digest}``;
    ``rounds.replay_fraction`` of the training set is then drawn from that version.
    ``baseline``: a causal LM (the SFT model) whose own likelihood, untrained, is measured on the
    same held-out rows (``baseline`` in the manifest): a reward model that does not beat it is a
    defect the quality gate reports.

    Under torchrun each process trains on a contiguous share of every batch (a last batch with
    fewer rows than processes is skipped), the loss is normalised by the global batch's pairs or
    steps, and rank 0 evaluates, logs, checkpoints and returns the manifest (the others: None)."""
    from datasets import load_from_disk

    d = distributed.init(cfg.launch)
    logger = (logger or NullLogger()) if d.main else NullLogger()
    rc = getattr(cfg, kind)
    sep = cfg.reward_data.step_separator
    set_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    replay = replay or {"round": 1, "dir": None, "digest": None}
    names = TRAINING_DATA[kind, getattr(rc, "objective", None)]
    train, mixes = [], []
    for name in names:  # each dataset's fresh rows plus its replay share
        fresh = load_from_disk(reward_data[f"{name}_dir"])["train"].to_list()
        rows, mix = retraining_set(fresh, load_version(replay["dir"], name), cfg.rounds.replay_fraction, cfg.seed,
                                   replay["round"])
        train += rows
        mixes.append(mix)
        logger.log_input(name=f"reward_data/{name}", digest=reward_data[f"{name}_digest"],
                         source=reward_data[f"{name}_dir"], rows={"train": len(fresh)})
        if replay["dir"] is not None:
            logger.log_input(name=f"replay/{Path(replay['dir']).name}/{name}", digest=replay["digest"],
                             source=str(Path(replay["dir"]) / name),
                             rows={"replayed": mix["replay"], **{f"from_round_{r}": n for r, n in mix["by_round"].items()}})
    mix = combined_mix(mixes)
    test_name = "outcome" if kind == "orm" else "steps"
    test = load_from_disk(reward_data[f"{test_name}_dir"])["test"].to_list()
    solutions = load_from_disk(reward_data["solutions_dir"])["test"].to_list() if kind == "orm" else []
    held_out = solutions if kind == "orm" else test
    if not mix["fresh"] or not held_out:
        source = reward_data[f"{names[0]}_dir"]
        raise ValueError(
            f"{kind}: no {'training' if not mix['fresh'] else 'held-out'} rows in {source}: " + (
                "no question had both a right and a wrong sample" if names == ("outcome",) else
                "no solution was sampled" if kind == "orm" else "no sample had a step")
            + "; raise reward_data.questions or reward_data.samples_per_question, or train the policy further")
    logger.log_metrics({"replay/share": mix["share"], "replay/rows": mix["replay"], "replay/fresh_rows": mix["fresh"],
                        **{f"replay/from_round_{r}": n for r, n in mix["by_round"].items()}})
    identity = run_identity(cfg, kind, init=digest_dir(Path(init_dir)), separator=sep,
                            reward_data={n: reward_data[f"{n}_digest"] for n in names}, round=replay["round"],
                            **({"replay": replay["digest"], "replay_fraction": cfg.rounds.replay_fraction}
                               if replay["dir"] is not None else {}))  # round 1 has no history to replay
    trainer = Trainer(cfg, kind, out_dir, identity, d, logger)
    model = place(resume_or_init(trainer.resume, init_dir, kind, cfg, replay["round"]), cfg.launch, train=True)
    model.config.step_separator = sep  # saved with the model: `grpo-pipeline score` splits steps as we do
    amp = functools.partial(autocast, cfg.launch, model_device(model))
    tokenizer = load_tokenizer(trainer.resume or init_dir)
    quality = f"heldout/{QUALITY_KEY[kind]}"
    st = trainer.start(model, tokenizer, Plan(max_epochs=rc.epochs, per_epoch=True, eval_last=True, keep_best=quality))

    def evaluate(st: TrainState) -> dict:
        metrics = (evaluate_orm(model, tokenizer, test, solutions, rc.batch_size) if kind == "orm"
                   else evaluate_prm(model, tokenizer, test, sep, rc.batch_size))
        return {f"heldout/{k}": v for k, v in metrics.items()}

    if trainer.resume is None:
        if d.main:
            shutil.rmtree(out_dir / "best", ignore_errors=True)  # never publish another run's model
        # Staleness: the starting model (last round's, or the SFT model's fresh head) on the fresh samples.
        before = d.broadcast(evaluate(st) if d.main else None)
        st.extra["before_metrics"] = {k.removeprefix("heldout/"): v for k, v in before.items()}
        logger.log_metrics({f"heldout_before/{k}": v for k, v in st.extra["before_metrics"].items()}, step=0)
        if baseline is not None and d.main:
            st.extra["baseline"] = evaluate_likelihood(baseline, kind, held_out, sep, rc.batch_size)
            logger.log_metrics({f"baseline/{k}": v for k, v in st.extra["baseline"].items()}, step=0)
    model.train()
    trained = d.wrap(model if is_likelihood(model) else ScoreHead(model))  # one module whose forward is the whole computation

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
        with amp():
            if kind == "orm":
                terms = orm_loss_terms(trained, tokenizer, rows)
            else:
                rollout, ends, labels, mask = step_batch(tokenizer, rows, sep, cfg.prm.label)
                terms = [(step_bce_loss(prm_step_logits(trained, rollout, ends), labels, mask), float(mask.sum()))]
        # Each local mean re-weighted into this process's share of the global batch's mean.
        share = sum(local * (n / max(float(d.sum(n)), 1.0)) for local, n in terms)
        grad_norm = trainer.update(share, d.world)  # DDP averages the processes' gradients
        return {"train/loss": float(d.sum(share.detach())), "train/grad_norm": grad_norm}

    # The loop: (batch -> update -> log -> [epoch end: evaluate -> keep best -> checkpoint])*.
    st = trainer.fit(step, evaluate)
    if not d.main:
        return None
    final_dir = trainer.publish()
    best = {k.removeprefix("heldout/"): v for k, v in st.best_metrics.items()}
    value = best.get(QUALITY_KEY[kind], float("nan"))
    gate = {"metric": QUALITY_KEY[kind], "value": value, "threshold": rc.min_auc,
            "passed": bool(value >= rc.min_auc)}  # NaN (one class only) fails
    if "baseline" in st.extra:  # the zero-training verifier of the same held-out rows
        gate["baseline"] = st.extra["baseline"].get(QUALITY_KEY[kind], float("nan"))
        gate["beats_baseline"] = bool(value > gate["baseline"])
        gate["passed"] = gate["passed"] and gate["beats_baseline"]
    logger.log_metrics({"quality_gate/passed": float(gate["passed"])})
    return write_manifest(out_dir, {"stage": kind, "model": str(final_dir), "init": str(init_dir),
                                    "init_from": rc.init if replay["round"] == 1 else "previous round",
                                    "quality_gate": gate,
                                    "round": replay["round"], "heldout_before": st.extra.get("before_metrics", {}),
                                    "baseline": st.extra.get("baseline", {}),
                                    "heldout": best, "best_epoch_step": st.best_step,
                                    "steps": st.step, "epochs": st.epoch, "n_train": len(train),
                                    "n_test": len(held_out), "replay": mix, "wall_s": round(st.elapsed, 1)})

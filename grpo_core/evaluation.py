"""Accuracy of a policy on GSM8K-form questions: greedy pass@1, and maj@K / pass@K with sampling."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from grpo_core.data import Example, held_out_sets, load_jsonl, prompt_text
from grpo_core.lm.policy import generate
from grpo_core.lm.runtime import place, set_compute
from grpo_core.manifests import write_manifest
from grpo_core.verify import _clean, extract_answer, is_correct, to_number


def _vote_key(answer: str | None) -> str | None:
    """Answers that are equal numbers vote together (``1/2`` and ``0.5``)."""
    if answer is None:
        return None
    value = to_number(answer)
    return f"num:{value}" if value is not None else f"str:{_clean(answer)}"


def evaluate(
    model,
    tokenizer,
    examples: list[Example],
    *,
    max_new_tokens: int,
    batch_size: int = 64,
    samples: int = 1,
    temperature: float = 0.7,
    seed: int = 0,
) -> tuple[dict[str, float], list[dict]]:
    """Returns metrics (``n``, ``accuracy`` = greedy pass@1, and for samples > 1 ``maj@K``,
    ``pass@K``) and one row per question with the greedy completion."""
    rows: list[dict] = []
    greedy_correct = 0
    maj_correct = pass_correct = 0
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        prompts = [prompt_text(e.question) for e in batch]
        greedy = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
        if samples > 1:
            rep = [p for p in prompts for _ in range(samples)]
            out = generate(
                model,
                tokenizer,
                rep,
                max_new_tokens=max_new_tokens,
                temperatures=[temperature] * len(rep),
                seed=seed + start,
            )
        for i, e in enumerate(batch):
            ok = is_correct(greedy.texts[i], e.gold)
            greedy_correct += ok
            rows.append(
                {
                    "idx": e.idx,
                    "question": e.question,
                    "gold": e.gold,
                    "completion": greedy.texts[i],
                    "predicted": extract_answer(greedy.texts[i]) or "",
                    "correct": bool(ok),
                }
            )
            if samples > 1:
                sampled = out.texts[i * samples : (i + 1) * samples]
                answers = [extract_answer(t) for t in sampled]
                votes = Counter(k for k in map(_vote_key, answers) if k is not None)
                if votes:
                    top = votes.most_common(1)[0][0]
                    winner = next(a for a in answers if _vote_key(a) == top)
                    maj_correct += is_correct(f"#### {winner}", e.gold)
                pass_correct += any(is_correct(t, e.gold) for t in sampled)
    n = len(examples)
    metrics: dict[str, float] = {"n": n, "accuracy": greedy_correct / max(n, 1)}
    if samples > 1:
        metrics[f"maj@{samples}"] = maj_correct / max(n, 1)
        metrics[f"pass@{samples}"] = pass_correct / max(n, 1)
    return metrics, rows


def evaluate_with(model, tokenizer, examples: list[Example], ec, *, seed: int) -> tuple[dict[str, float], list[dict]]:
    """``evaluate`` at an ``EvalConfig``'s settings (``ec``: max_new_tokens, batch_size, samples,
    temperature): the eval stage's pass over each set and ``grpo-pipeline eval``'s."""
    return evaluate(
        model,
        tokenizer,
        examples,
        max_new_tokens=ec.max_new_tokens,
        batch_size=ec.batch_size,
        samples=ec.samples,
        temperature=ec.temperature,
        seed=seed,
    )


@torch.no_grad()
def greedy_accuracy(model, tokenizer, examples: list[Example], max_new_tokens: int, batch_size: int = 128) -> float:
    return evaluate(model, tokenizer, examples, max_new_tokens=max_new_tokens, batch_size=batch_size)[0]["accuracy"]


def test_sets(data_dir: Path) -> dict[str, Path]:
    """The data stage's test split and its further held-out sets (``held_out/<name>.jsonl``), by name."""
    return {"test": Path(data_dir) / "test.jsonl"} | held_out_sets(Path(data_dir))


def write_completions(rows: list[dict], path: Path) -> Path:
    """Every greedy completion, one JSON line per question (``idx``, ``question``, ``completion``, the
    extracted ``answer``, ``correct``), gzipped beside the per-question file: anyone can re-score them."""
    import gzip
    import json

    path = path.with_suffix(".jsonl.gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(
                json.dumps(
                    {
                        "idx": r["idx"],
                        "question": r["question"],
                        "completion": r["completion"],
                        "answer": r["predicted"],
                        "gold": r["gold"],
                        "correct": r["correct"],
                    }
                )
                + "\n"
            )
    return path


def run_eval(cfg, data_dir: Path, models: dict[str, str], out_dir: Path, logger=None) -> dict:
    """The eval stage: greedy pass@1 (and maj@K / pass@K) of every model in ``models`` on the test
    split, and on each further held-out set under ``held_out/<set>``, with per-question correctness
    (``per_question/[<set>/]<name>.json``) for paired differences between models (``grpo_core.stats``)."""
    import json

    from grpo_core.lm.modeling import load_model  # deferred: transformers; the helpers above need torch alone

    ec = cfg.eval
    set_compute(cfg.threads)
    sets = {name: load_jsonl(str(path), limit=ec.n_questions) for name, path in test_sets(data_dir).items()}
    results: dict[str, dict] = {}
    for name, model_dir in models.items():
        model, tokenizer = load_model(model_dir)
        place(model, cfg.launch)
        measured: dict[str, dict] = {}
        for set_name, examples in sets.items():
            metrics, rows = evaluate_with(model, tokenizer, examples, ec, seed=cfg.seed)
            per_question = Path(out_dir) / "per_question" / ("" if set_name == "test" else set_name) / f"{name}.json"
            per_question.parent.mkdir(parents=True, exist_ok=True)  # a model's name may hold a folder: variant/seed-0
            per_question.write_text(json.dumps([int(r["correct"]) for r in rows]))
            relative = per_question.relative_to(Path(out_dir) / "per_question")
            completions = write_completions(rows, Path(out_dir) / "completions" / relative)
            measured[set_name] = {**metrics, "per_question": str(per_question), "completions": str(completions)}
            if logger:
                where = name if set_name == "test" else f"{name}/{set_name}"
                logger.log_metrics({f"eval/{where}/{k}": v for k, v in metrics.items()})
                logger.log_table(rows[: ec.log_examples], f"eval/{where.replace('/', '_')}_samples.json")
        test = measured.pop("test")
        results[name] = {**test, "model": model_dir} | ({"held_out": measured} if measured else {})
    return write_manifest(Path(out_dir), {"stage": "eval", "results": results})

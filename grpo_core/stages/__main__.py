"""The one entry point of every stage: ``python -m grpo_core.stages --config C --inputs FILE --out
DIR`` (torchrun / accelerate launch it as data-parallel processes). FILE says which stage and what
it consumes (``inputs.py``); rank 0 prints the manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from grpo_core.env import setup_environment
from grpo_core.lm.runtime import numerics, peak_memory
from grpo_core.manifests import write_manifest
from grpo_core.recipe import load_config
from grpo_core.stages.inputs import read_inputs
from grpo_core.tracking import logger_from_env
from grpo_core.training import distributed


@record  # under torchrun, a failing rank's traceback goes into the launcher's summary
def main(argv: list[str] | None = None) -> None:
    setup_environment()
    process_numerics = numerics()  # warns here, before any work, where MKL ignores the setting
    p = argparse.ArgumentParser(prog="python -m grpo_core.stages", description="run one pipeline stage")
    p.add_argument("--config", required=True, help="the recipe (YAML)")
    p.add_argument("--inputs", required=True, help="JSON: the stage and what it consumes (grpo_core/stages/inputs.py)")
    p.add_argument("--out", required=True, help="the stage's output folder")
    p.add_argument("--set", action="append", default=[], dest="overrides", help="section.key=value")
    a = p.parse_args(argv)
    inputs = read_inputs(Path(a.inputs))
    manifest = inputs.run(load_config(a.config, a.overrides), Path(a.out), logger_from_env(inputs.stage))
    distributed.finish()
    if manifest is not None:  # rank 0: its peak memory is the stage's (the process ran nothing else)
        print(write_manifest(Path(a.out), {**manifest, "peak_memory": peak_memory(), "numerics": process_numerics}))


if __name__ == "__main__":
    main()
    distributed.exit_rank()  # here, not in main: a caller of main in its own process keeps it

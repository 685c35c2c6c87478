"""Stage entrypoints: each runs by hand, by ``python -m grpo_core.stages.<stage>``, or from a task."""

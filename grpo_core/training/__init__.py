"""Training machinery the stages share: the one training loop, learning-rate schedules, crash-safe
checkpoints and data-parallel processes."""

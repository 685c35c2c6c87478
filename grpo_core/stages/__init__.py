"""The pipeline's stages: each a ``run_*`` function, started in-process by its Prefect task or by
``python -m grpo_core.stages --inputs FILE`` (torchrun's route); their inputs are typed in ``inputs.py``."""

"""Prefect flows that chain the stage tasks.

A worker (``prefect deploy``) imports the flows directly, not through the CLI: the project's
environment defaults are applied here too (values already set win).
"""
from grpo_core.env import setup_environment

setup_environment()


def artifact_key(name: str) -> str:
    """A Prefect artifact key from a name: lower case, dashes for ``_`` and ``.`` (Prefect's rule)."""
    return name.lower().replace("_", "-").replace(".", "-")

"""Prefect tasks: thin wrappers that run a stage, cache it by content, and return its manifest."""

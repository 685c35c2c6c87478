"""Prefect flows that chain the stage tasks."""

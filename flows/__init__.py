"""Prefect flows that chain the stage tasks.

A worker (``prefect deploy``) imports the flows directly, not through the CLI: the project's
environment defaults are applied here too (values already set win).
"""

from grpo_core.env import setup_environment

setup_environment()


def artifact_key(name: str) -> str:
    """A Prefect artifact key from a name: lower case, dashes for ``_`` and ``.`` (Prefect's rule)."""
    return name.lower().replace("_", "-").replace(".", "-")


def numbered_run_name(name: str) -> str:
    """``name`` for the running flow's run, or ``name-2``, ``name-3``, ... when the flow already has
    runs by that name, so that the Prefect UI tells a recipe's reruns apart. For ``flow_run_name``
    callables: it reads the flow run's context."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterName
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    taken = {
        r.name
        for r in ctx.client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[ctx.flow.name])),
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=name)),
        )
    }
    n = 1
    while (f"{name}-{n}" if n > 1 else name) in taken:
        n += 1
    return f"{name}-{n}" if n > 1 else name


def parameter(name: str):
    """A parameter of the running flow (for ``flow_run_name`` callables)."""
    from prefect.context import FlowRunContext

    return FlowRunContext.get().parameters[name]

"""The layers' boundary: the core library (``grpo_core``) never imports the orchestrator (Prefect,
``flows``, ``tasks``), and no module of the project imports one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported(path: Path) -> set[str]:
    """Every module a file imports, at any depth (imports inside functions count too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_the_core_never_imports_the_orchestrator():
    offenders = [
        f"{p.relative_to(ROOT)} imports {m}"
        for p in sorted((ROOT / "grpo_core").rglob("*.py"))
        for m in sorted(imported(p))
        if m.split(".")[0] in {"prefect", "flows", "tasks"}
    ]
    assert offenders == []


PACKAGES = ("grpo_core", "tasks", "flows")


def module_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports, at any depth (``from a import b`` names the
    module ``a.b`` where there is one, else ``a``)."""
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
    }

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {resolve(f"{node.module}.{a.name}") or resolve(node.module) for a in node.names}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def test_no_import_cycle_anywhere():
    """Among grpo_core, tasks and flows, imports inside functions included: no module imports one
    that imports it back, however far round."""
    graph = module_graph()
    done: set[str] = set()

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = cycle_from(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return None

    cycles = [c for n in sorted(graph) if (c := cycle_from(n, []))]
    assert cycles == [], " -> ".join(cycles[0])
    assert {"grpo_core.stages.grpo", "flows.experiment", "tasks.stage_tasks"} <= set(graph)  # the walk saw them

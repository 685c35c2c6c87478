"""The layers' boundary: the core library (``grpo_core``) never imports the orchestrator (Prefect,
``flows``, ``tasks``), and the flows import one another in one direction only."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    offenders = [f"{p.relative_to(ROOT)} imports {m}" for p in sorted((ROOT / "grpo_core").rglob("*.py"))
                 for m in sorted(imported(p)) if m.split(".")[0] in {"prefect", "flows", "tasks"}]
    assert offenders == []


def test_no_import_cycle_among_the_flows():
    graph = {p.stem: {m.split(".")[1] for m in imported(p) if m.startswith("flows.")}
             for p in (ROOT / "flows").glob("*.py")}

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        for nxt in sorted(graph.get(node, ())):
            found = cycle_from(nxt, path + [node])
            if found:
                return found
        return None

    cycles = [c for n in sorted(graph) if (c := cycle_from(n, []))]
    assert cycles == [], " -> ".join(cycles[0])

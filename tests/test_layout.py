"""The project's layout holds what docs/architecture.md says of it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPLOYABLE = ("synapse_repl", "streams", "dashboard")


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every absolute import in ``path`` (relative ones stay inside)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_deployable_code_never_imports_the_test_harness():
    offenders = [
        str(path.relative_to(ROOT))
        for package in DEPLOYABLE
        for path in (ROOT / package).rglob("*.py")
        if imported_modules(path) & {"testing", "tests", "benchmarks", "pytest", "synapse"}
    ]
    assert offenders == []


def module_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (at any depth of the file: an import
    inside a function is a dependency all the same)."""
    files = {}
    for package in DEPLOYABLE:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    deps.add(target)
        graph[name] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return sorted(cycles)


#: Import circles still to be cut (issue 18). The list may only shrink: a new circle fails.
KNOWN_CYCLES = [
    ["streams.admin", "streams.storage.admin_panels"],
    ["streams.jobs.definitions", "streams.jobs.runner"],
]


def test_import_cycles_only_shrink():
    cycles = import_cycles(module_graph())
    assert [c for c in cycles if c not in KNOWN_CYCLES] == []
    assert [c for c in KNOWN_CYCLES if c not in cycles] == [], "a circle is gone: take it off KNOWN_CYCLES"


def test_cycle_finder_finds_a_circle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

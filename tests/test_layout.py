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

"""docs/architecture.md's module tables name every module of the tree, and only modules that
exist: the map a newcomer reads first stays true."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "streams", "rooms", "replication", "jobs", "dashboard", "synapse_attach", "synapse_repl", "testing")
ROW = re.compile(r"^\| (`[^|]+`(?:, `[^|]+`)*) \|", re.MULTILINE)


def named_paths(text: str) -> list[str]:
    """Every path in a table row's first cell; a relative one is in the directory of the
    cell's first path (`replication/endpoint/relay.py`, `consumer.py`)."""
    paths = []
    for cell in ROW.findall(text):
        directory = ""
        for name in re.findall(r"`([^`]+)`", cell):
            if name.split("/", 1)[0] in PACKAGES:
                directory = name.rstrip("/").rsplit("/", 1)[0]
                paths.append(name)
            elif directory and "." in name or name.endswith("/"):
                paths.append(f"{directory}/{name}")
    return paths


def modules() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if path.name == "__init__.py" or "migrations" in rel.parts:
                continue
            found.add(str(rel))
    return found


def test_every_named_module_exists():
    paths = named_paths((ROOT / "docs" / "architecture.md").read_text())
    assert paths, "no module table found"
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_every_module_is_named():
    paths = named_paths((ROOT / "docs" / "architecture.md").read_text())
    files = {p for p in paths if not p.endswith("/")}
    directories = tuple(p for p in paths if p.endswith("/"))
    missing = sorted(m for m in modules() if m not in files and not m.startswith(directories))
    assert missing == [], "add these to docs/architecture.md's module tables"

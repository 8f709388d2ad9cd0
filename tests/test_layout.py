"""The project's layout holds what docs/architecture.md says of it."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The deployable packages by floor, bottom first: a package imports only packages on lower
#: floors (docs/architecture.md draws them). ``synapse_repl`` is the composition root: the
#: settings, ``asgi.py`` and every process's management command.
FLOORS = (
    ("common",),
    ("streams",),
    ("rooms", "replication"),
    ("jobs", "synapse_attach"),
    ("dashboard",),
    ("synapse_repl",),
)
DEPLOYABLE = tuple(package for floor in FLOORS for package in floor)


@functools.lru_cache(maxsize=None)
def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """A file's syntax tree, parsed once per run. CPython 3.11's AST constructor can raise a
    spurious SystemError ("AST constructor recursion depth mismatch") in a process whose
    recursion depth bookkeeping an earlier test left off; one more parse is not affected."""
    try:
        return ast.parse(source, filename)
    except SystemError:
        return ast.parse(source, filename)


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every absolute import in ``path`` (relative ones stay inside)."""
    names = set()
    for node in ast.walk(parse_source(path.read_text(), str(path))):
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
        for node in ast.walk(parse_source(path.read_text(), str(path))):
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


#: Import circles still to be cut. The list may only shrink: a new circle fails.
KNOWN_CYCLES = [
]


def test_import_cycles_only_shrink():
    cycles = import_cycles(module_graph())
    assert [c for c in cycles if c not in KNOWN_CYCLES] == []
    assert [c for c in KNOWN_CYCLES if c not in cycles] == [], "a circle is gone: take it off KNOWN_CYCLES"


def test_cycle_finder_finds_a_circle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# -- where the dialects differ ------------------------------------------------------------------

#: The modules where PostgreSQL and SQLite may differ, each the boundary of its concern
#: (streams/dialect.py's docstring names them).
DIALECT_MODULES = {
    "streams/dialect.py",  # the stream machinery: writers, ID stores, endpoint, commands
    "rooms/storage/sql.py",  # the room event store's SQL
    "jobs/job_dialect.py",  # the batch jobs' reads, writes and locks
    "synapse_repl/settings.py",  # SQLite's connection options, before Django's connections exist
}
#: The room event store's queries written twice ask ``storage.sql.is_sqlite``; sql.py's
#: docstring lists each of these modules and what differs there.
IS_SQLITE_CALLERS = {
    "rooms/storage/reads.py",
    "rooms/storage/chain_index_store.py",
    "rooms/storage/state_groups.py",
    "rooms/storage/plan_loader.py",
}
VENDOR_NAMES = {"postgresql", "sqlite", "django.db.backends.postgresql", "django.db.backends.sqlite3"}


def dialect_tests(source: str) -> list[str]:
    """Where ``source`` asks which database it runs on: a ``.vendor``, a comparison with (or a
    dict keyed by) a vendor or engine name, a call of ``is_sqlite``."""
    def vendor_name(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in VENDOR_NAMES

    found = []
    for node in ast.walk(parse_source(source)):
        if isinstance(node, ast.Attribute) and node.attr == "vendor":
            found.append(f"{node.lineno}: .vendor")
        elif isinstance(node, ast.Compare) and any(map(vendor_name, [node.left, *node.comparators])):
            found.append(f"{node.lineno}: compares with a vendor name")
        elif isinstance(node, ast.Dict) and any(map(vendor_name, node.keys)):
            found.append(f"{node.lineno}: a dict keyed by vendor")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "is_sqlite":
            found.append(f"{node.lineno}: is_sqlite()")
    return found


def test_dialects_differ_only_in_the_dialect_modules():
    offenders = {}
    for package in DEPLOYABLE:
        for path in (ROOT / package).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            if "migrations" in path.parts or rel in DIALECT_MODULES:
                continue
            found = dialect_tests(path.read_text())
            if rel in IS_SQLITE_CALLERS:
                found = [f for f in found if not f.endswith("is_sqlite()")]
            if found:
                offenders[rel] = found
    assert offenders == {}, "move these behind streams/dialect.py, storage/sql.py or jobs/dialect.py"


def test_dialect_finder_finds_each_form():
    source = ('if connection.vendor == "postgresql": pass\n'
              'if kind != "sqlite": pass\n'
              'EXPR = {"postgresql": "a", "sqlite": "b"}\n'
              'if is_sqlite(cursor): pass\n'
              'ENGINE = "django.db.backends.sqlite3"\n')
    assert sorted(dialect_tests(source)) == ["1: .vendor", "1: compares with a vendor name",
                                             "2: compares with a vendor name", "3: a dict keyed by vendor",
                                             "4: is_sqlite()"]


# -- citations ------------------------------------------------------------------------------------

#: Citations of texts that are not in this repository (the distilled specs the project was
#: started from): the code cites docs/*.md or Synapse's public source instead.
OUTSIDE_CITATION = re.compile(r"shared/(?:specs|reference)|\b(?:spec|lesson|shared spec) §")
#: Being rewritten on other branches, which replace their citations there: rooms/storage/persist.py
#: and replication/worker/client.py. The integrator empties this after merging them.
CITATIONS_TO_REPLACE: set[str] = set()


def test_code_and_docs_cite_nothing_outside_the_repository():
    paths = [p for package in (*DEPLOYABLE, "testing", "tests") for p in (ROOT / package).rglob("*.py")]
    paths += [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in paths if str(path.relative_to(ROOT)) not in CITATIONS_TO_REPLACE
        and path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE_CITATION.search(line)
    ]
    assert offenders == [], "cite docs/*.md or Synapse's source path instead"


#: The modules that may reach the process's runtime from below the composition root: the
#: typing views' one accessor. Everything else is handed what it needs.
RUNTIME_EDGES = {"replication.http.typing_changes"}


def test_nothing_below_the_edges_reaches_up_to_the_runtime():
    graph = module_graph()
    reaching = sorted(name for name, deps in graph.items()
                      if name.startswith("replication") and "streams.runtime" in deps)
    assert reaching == sorted(RUNTIME_EDGES)


def floor_of(module: str) -> int:
    package = module.split(".")[0]
    return next(n for n, floor in enumerate(FLOORS) if package in floor)


#: Imports that still run up a floor, each to be cut. The list may only shrink: a new one fails.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(name, dep) for name, deps in graph.items() for dep in deps
            if floor_of(dep) > floor_of(name) or (floor_of(dep) == floor_of(name)
                                                  and dep.split(".")[0] != name.split(".")[0])}


def test_no_module_imports_a_package_on_a_higher_floor():
    upward = upward_imports(module_graph())
    assert sorted(upward - KNOWN_UPWARD) == [], "import from a lower floor, or hand the part in from the composition root"
    assert sorted(KNOWN_UPWARD - upward) == [], "an upward import is gone: take it off KNOWN_UPWARD"


def test_upward_finder_finds_an_import_up_and_across():
    graph = {"streams.a": {"dashboard.b"}, "rooms.c": {"replication.d"}, "jobs.e": {"streams.a"}}
    assert upward_imports(graph) == {("streams.a", "dashboard.b"), ("rooms.c", "replication.d")}


#: Module names Django gives a meaning to in every app: the one exception to one module per name.
DJANGO_NAMES = {"__init__", "apps", "models", "admin", "urls", "views", "tasks", "routing", "consumers"}


def test_one_module_per_name_across_the_tree():
    """A name says which concept a module holds, so no two modules share one (``auth.py`` three
    times said nothing about which auth)."""
    homes: dict[str, list[str]] = {}
    for package in (*DEPLOYABLE, "testing"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts or path.stem in DJANGO_NAMES:
                continue
            homes.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in homes.items() if len(paths) > 1} == {}


def deferred_imports(path: Path, root: Path = ROOT) -> list[str]:
    """Imports of project modules inside a function of ``path`` that say nothing of why: neither
    in an ``AppConfig.ready()`` (Django's place for what needs loaded apps) nor under a
    ``# deferred: <why>`` comment. Such an import hides an edge of the graph and, in this tree,
    only ever dodged load order."""
    source = path.read_text()
    lines = source.splitlines()
    project = {*DEPLOYABLE}
    found = []
    for fn in ast.walk(parse_source(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name == "ready":
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            if not {name.split(".")[0] for name in names} & project:
                continue
            above = [line.strip() for line in lines[node.lineno - 2::-1]]
            while above and above[0].startswith(("from ", "import ")):  # the imports of one group
                above.pop(0)
            comments = []
            while above and above[0].startswith("#"):
                comments.append(above.pop(0))
            if not any(c.startswith("# deferred:") for c in comments) and "# deferred:" not in lines[node.lineno - 1]:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_import_inside_a_function_only_dodges_load_order():
    offenders = [where for package in DEPLOYABLE for path in (ROOT / package).rglob("*.py")
                 if "migrations" not in path.parts for where in deferred_imports(path)]
    assert offenders == [], "import at the top of the module, or say why not: '# deferred: <why>'"


def test_deferred_import_finder(tmp_path):
    (tmp_path / "m.py").write_text(
        "def f():\n    from streams import conf\n"
        "def g():\n    # deferred: a reason\n    from streams import conf\n"
        "def h():\n    import json\n"
        "class C:\n    def ready(self):\n        from rooms import models\n")
    assert deferred_imports(tmp_path / "m.py", root=tmp_path) == ["m.py:2"]


def test_each_app_has_the_ordinary_shape():
    """Every subsystem is a Django app of the ordinary shape: ``apps.py``; its tables in its own
    ``models.py`` with ``migrations/``, and ``admin.py`` (the dashboard's and the observer's
    status rows are shown on the dashboard's pages instead); its tests under ``tests/<app>/``.
    No model is defined anywhere else."""
    from django.apps import apps as registry

    ours = [config for config in registry.get_app_configs() if config.name in DEPLOYABLE]
    assert sorted(config.name for config in ours) == sorted(set(DEPLOYABLE) - {"common"})
    for config in ours:
        root = ROOT / config.name
        assert (root / "apps.py").exists(), config.name
        assert (ROOT / "tests" / config.name).is_dir(), config.name
        models = list(config.get_models())
        if models:
            assert {m.__module__ for m in models} == {f"{config.name}.models"}, config.name
            assert (root / "migrations" / "__init__.py").exists(), config.name
            assert (root / "admin.py").exists() or config.name in ("dashboard", "synapse_attach"), config.name

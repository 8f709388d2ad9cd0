"""The docs and the code's comments describe the software as it is, not how it was built: no
numbered work sessions or rounds, no issue numbers told as history, no dates of measurements
(a figure carries the machine's load instead; history stays in git). And every relative link
of the docs leads somewhere: the file exists and, for a ``#fragment``, so does the heading."""
from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"node_modules", "__pycache__", "staticfiles"}
THIS = Path(__file__).resolve()

# Between two words of a phrase: spaces, a line break, or a comment's "#" carried over to the
# next line ("... per sync, docs/benchmarks.md,\n    # session 13)").
_ = r"[\s#]+"
NARRATION = [
    re.compile(rf"\bsessions?{_}\d+", re.IGNORECASE),
    re.compile(rf"\blast{_}session\b", re.IGNORECASE),
    re.compile(rf"\bround{_}(?:one|two|three|four|\d+)\b", re.IGNORECASE),
    re.compile(rf"\bissues?{_}#?\d+", re.IGNORECASE),
    re.compile(rf"\bpart{_}\d+{_}of\b", re.IGNORECASE),
    re.compile(r"\byesterday\b", re.IGNORECASE),
    re.compile(rf"\bwe{_}measured{_}on\b", re.IGNORECASE),
]
#: A date in prose is a diary's (when something was measured or done); the docs give the
#: machine's load instead. Only the docs: code has dates of its own (Django's generated
#: migration headers, test fixtures).
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
#: An issue of another project is a reference, not this project's history: Synapse's
#: "#5064", element-hq/synapse#18544, an upstream bug.
UPSTREAM = re.compile(r"synapse|element-hq|matrix-org|upstream|github\.com|/[\w.-]+#?$", re.IGNORECASE)
def docs() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def project_files() -> list[Path]:
    """The project's Python, templates, Makefile and contrib/: every file a reader meets."""
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS]
        for name in files:
            path = Path(top) / name
            rel = path.relative_to(ROOT)
            if (name.endswith((".py", ".html")) or name == "Makefile"
                    or rel.parts[0] == "contrib") and path.resolve() != THIS:
                found.append(path)
    return sorted(found)


def narration(text: str, *, dates: bool) -> list[str]:
    """Each phrase of ``text`` that narrates, with a little of its line."""
    hits = []
    patterns = NARRATION + ([DATE] if dates else [])
    for pattern in patterns:
        for m in pattern.finditer(text):
            before = text[max(0, m.start() - 40):m.start()]
            if pattern.pattern.startswith(r"\bissues") and UPSTREAM.search(before):
                continue
            line = text.count("\n", 0, m.start()) + 1
            hits.append(f"line {line}: {' '.join(m.group(0).split())!r}")
    return hits


def test_the_rule_catches_narration_and_spares_references():
    assert narration("Measured in session 12 (issue 19 part 2), round two.", dates=False) == [
        "line 1: 'session 12'", "line 1: 'round two'", "line 1: 'issue 19'"]
    assert narration("docs/benchmarks.md, session\n    # 13)", dates=False) == ["line 1: 'session # 13'"]
    assert narration("measured on 2026-11-24", dates=True) == ["line 1: '2026-11-24'"]
    spared = ("Synapse's issue #5064; element-hq/synapse#18544; the session's Redis; "
              "in the second round; part of the work; version 1.163.2")
    assert narration(spared, dates=True) == []


def test_no_doc_narrates():
    found = {}
    for path in docs():
        rel = str(path.relative_to(ROOT))
        text = path.read_text()
        if hits := narration(text, dates=True):
            found[rel] = hits
    assert found == {}, "say what is true now, with the machine's load beside a figure"


def test_no_code_comment_narrates():
    found = {}
    for path in project_files():
        if hits := narration(path.read_text(errors="replace"), dates=False):
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}, "say what the code does and why, not how it came to be"


# --- links -------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (``-`` and ``_`` kept),
    each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return "".join(c for c in text if c.isalnum() or c in "-_ ").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    found = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def test_slugs_are_githubs():
    assert slug("Idle workers: `benchmarks/bench_idle_workers.py`") == "idle-workers-benchmarksbench_idle_workerspy"
    assert slug("On SQLite (`--sqlite`)") == "on-sqlite---sqlite"
    assert slug("Visibility: per-(room, user) ranges of the room's ordering") == (
        "visibility-per-room-user-ranges-of-the-rooms-ordering")


def test_every_relative_link_of_the_docs_resolves():
    broken = []
    for path in docs():
        for target in LINK.findall(FENCE.sub("", path.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            rel = path.relative_to(ROOT)
            if not dest.exists():
                broken.append(f"{rel}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{rel}: {target} (no such heading)")
    assert broken == []

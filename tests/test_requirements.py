"""The lock files (README, "Dependencies"): every package pinned with hashes, every top-level
requirement in its lock, and the runtime lock free of test-only packages. A hand edit of a
lock (or a *.in changed without `make lock`) fails here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCKS = {"requirements.in": "requirements.txt", "requirements-test.in": "requirements-test.txt",
         "requirements-ci.in": "requirements-ci.txt"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def read_lock(name: str) -> dict[str, tuple[str, set[str]]]:
    """``{canonical name: (version, {sha256 hashes})}`` of a pip-compile --generate-hashes lock."""
    packages: dict[str, tuple[str, set[str]]] = {}
    current = None
    for raw in (ROOT / name).read_text().splitlines():
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("--hash") else raw.strip()
        if not line:
            continue
        if line.startswith("--hash="):
            assert current is not None, f"{name}: a hash before any requirement"
            algorithm, _, digest = line.removeprefix("--hash=").rstrip(" \\").partition(":")
            assert algorithm == "sha256" and re.fullmatch(r"[0-9a-f]{64}", digest), raw
            packages[current][1].add(digest)
            continue
        match = PIN.match(line)
        assert match, f"{name}: not an exact pin: {raw!r}"
        current = canonicalize_name(match.group(1))
        assert current not in packages, f"{name}: {current} twice"
        packages[current] = (match.group(2), set())
    return packages


def top_level(name: str) -> list[Requirement]:
    reqs = []
    for raw in (ROOT / name).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            reqs.append(Requirement(line))
    return reqs


@pytest.mark.parametrize("lock", sorted(LOCKS.values()))
def test_every_locked_package_is_pinned_with_hashes(lock):
    packages = read_lock(lock)
    assert packages
    assert all(hashes for _, hashes in packages.values()), [n for n, (_, h) in packages.items() if not h]


@pytest.mark.parametrize("source, lock", sorted(LOCKS.items()))
def test_every_top_level_requirement_is_in_its_lock(source, lock):
    packages = read_lock(lock)
    for req in top_level(source):
        name = canonicalize_name(req.name)
        assert name in packages, f"{req} is in {source} but not in {lock}: run make lock"
        assert req.specifier.contains(packages[name][0], prereleases=True), \
            f"{lock} pins {name}=={packages[name][0]}, outside {source}'s {req}: run make lock"


def test_runtime_lock_has_no_test_only_package():
    runtime = read_lock("requirements.txt")
    test_only = {canonicalize_name(r.name) for r in top_level("requirements-test.in")}
    assert test_only and not test_only & set(runtime), test_only & set(runtime)


def test_test_lock_agrees_with_runtime_lock():
    """Both install into one venv: a package in both has one version (and the same files)."""
    runtime, test = read_lock("requirements.txt"), read_lock("requirements-test.txt")
    shared = set(runtime) & set(test)
    assert shared  # (twisted, attrs...: daphne's and Synapse's common ground)
    assert {n: runtime[n] for n in shared} == {n: test[n] for n in shared}


def make_dry_run(target: str, tmp_path: Path) -> list[str]:
    """The pip commands ``make TARGET`` would run for a venv that does not exist yet."""
    import subprocess

    done = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    return [line for line in done.stdout.splitlines() if " pip install " in line]


def test_make_run_installs_only_the_runtime_lock_and_make_test_adds_the_test_lock(tmp_path):
    run, test = make_dry_run("run", tmp_path), make_dry_run("test", tmp_path)
    assert [line.split()[-1] for line in run] == ["requirements.txt"]
    assert [line.split()[-1] for line in test] == ["requirements.txt", "requirements-test.txt"]
    for line in run + test:
        assert "--require-hashes" in line and "--quiet" not in line and " -q" not in line  # progress shown

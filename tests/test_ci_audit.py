"""The supply-chain gate's policy (.ci/audit.py) on pip-audit's JSON report."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ci_audit", ROOT / ".ci" / "audit.py")
audit = importlib.util.module_from_spec(spec)
sys.modules["ci_audit"] = audit  # (dataclasses look their module up)
spec.loader.exec_module(audit)

REPORT = {"dependencies": [
    {"name": "django", "version": "4.2.0", "vulns": [
        {"id": "PYSEC-2023-61", "fix_versions": ["4.2.1"], "aliases": ["CVE-2023-31047"]}]},
    {"name": "oldlib", "version": "1.0", "vulns": [{"id": "GHSA-x", "fix_versions": [], "aliases": []}]},
    {"name": "redis", "version": "8.1.0", "vulns": []},
    {"name": "private", "skip_reason": "Dependency not found on PyPI and could not be audited"},
]}


def test_fails_only_on_vulnerabilities_with_a_fix():
    verdict = audit.Verdict()
    verdict.add(REPORT)
    assert verdict.fixable == ["django 4.2.0: PYSEC-2023-61, CVE-2023-31047 (fixed in 4.2.1)"]
    assert verdict.unfixable == ["oldlib 1.0: GHSA-x (no fix yet)"]
    assert verdict.failed(strict=False)
    clean = audit.Verdict()
    clean.add({"dependencies": REPORT["dependencies"][1:]})
    assert not clean.failed(strict=False)


def test_strict_mode_fails_when_something_could_not_be_audited():
    verdict = audit.Verdict()
    verdict.add({"dependencies": REPORT["dependencies"][2:]})
    assert verdict.unaudited and not verdict.failed(strict=False)
    assert verdict.failed(strict=True)


def test_banner_says_plainly_when_nothing_could_be_audited():
    verdict = audit.Verdict()
    verdict.add({"dependencies": [
        {"name": "django", "version": "5.2.19", "skip_reason": "Dependency not found on PyPI"},
        {"name": "redis", "version": "8.1.0", "skip_reason": "Dependency not found on PyPI"}]})
    banner = verdict.banner(strict=False)
    assert banner.startswith("SUPPLY CHAIN: NOT CHECKED: none of the 2 locked packages could be audited")
    assert "\n" not in banner
    assert not verdict.failed(strict=False)
    assert verdict.failed(strict=True) and "FAILED" in verdict.banner(strict=True)


def test_banner_counts_a_package_in_both_locks_once():
    verdict = audit.Verdict()
    verdict.add({"dependencies": REPORT["dependencies"][2:]})  # redis audited, private not
    verdict.add({"dependencies": REPORT["dependencies"][2:3]})  # redis again (the test lock)
    assert verdict.banner(strict=False) == ("SUPPLY CHAIN: PARTLY CHECKED: 1 of 2 locked packages "
                                            "audited, no fixable vulnerability; 1 could not be audited")
    clean = audit.Verdict()
    clean.add({"dependencies": REPORT["dependencies"][2:3]})
    assert clean.banner(strict=True) == ("SUPPLY CHAIN: ok: all 1 locked packages audited, "
                                         "no fixable vulnerability")


def test_banner_names_the_fix_when_a_locked_package_is_vulnerable():
    verdict = audit.Verdict()
    verdict.add(REPORT)
    assert verdict.banner(strict=False).startswith(
        "SUPPLY CHAIN: FAILED: 1 known vulnerabilities with a fix in the locked packages (upgrade them")

#!/usr/bin/env python3
"""Supply-chain gate for CI (docs/security.md): pip-audit over the lock files.

The locks (requirements.txt, requirements-test.txt) pin the whole tree with hashes, so they
are exactly what gets installed: pip-audit reads them as they are, resolving nothing.

Fails (exit 1) on a known vulnerability that has a fixed version to move to. A vulnerability
without a fix is printed and does not fail the run (nothing to upgrade to yet). A package
pip-audit could not look up (the vulnerability data unreachable, or a package PyPI does not
know) is *not audited*: "no known vulnerability" then means "nothing was looked up", and the
closing banner says so in plain words; with ``AUDIT_STRICT=1`` that fails the run too.

The last line printed is a one-line banner; ``--banner-file PATH`` also writes it there, so
.ci/run can repeat it at the end of the test run's summary.

Usage: .ci/audit.py [--banner-file PATH] PIP_AUDIT LOCK_FILE...
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field


@dataclass
class Verdict:
    """What pip-audit said about every locked package (a package in two locks counts once)."""

    fixable: list[str] = field(default_factory=list)
    unfixable: list[str] = field(default_factory=list)
    unaudited: list[str] = field(default_factory=list)
    audited: set[str] = field(default_factory=set)
    packages: set[str] = field(default_factory=set)

    def add(self, report: dict) -> None:
        for dep in report.get("dependencies", []):
            name = f"{dep['name']} {dep.get('version', '')}".strip()
            self.packages.add(name)
            if "skip_reason" in dep:
                self.unaudited.append(f"{name}: {dep['skip_reason']}")
                continue
            self.audited.add(name)
            for vuln in dep.get("vulns", []):
                ids = ", ".join([vuln["id"], *vuln.get("aliases", [])])
                if vuln.get("fix_versions"):
                    self.fixable.append(f"{name}: {ids} (fixed in {', '.join(vuln['fix_versions'])})")
                else:
                    self.unfixable.append(f"{name}: {ids} (no fix yet)")

    @property
    def not_audited(self) -> set[str]:
        return self.packages - self.audited

    def failed(self, strict: bool) -> bool:
        return bool(self.fixable) or (strict and bool(self.not_audited))

    def banner(self, strict: bool) -> str:
        """One line that says what was and was not checked, whatever happened."""
        total, missing = len(self.packages), len(self.not_audited)
        fixable, unfixable = len(set(self.fixable)), len(set(self.unfixable))
        no_fix = f"; {unfixable} known vulnerabilities without a fix yet" if unfixable else ""
        if fixable:
            return (f"SUPPLY CHAIN: FAILED: {fixable} known vulnerabilities with a fix in the locked "
                    f"packages (upgrade them: make lock UPGRADE=1){no_fix}")
        if total == 0:
            return "SUPPLY CHAIN: NOT CHECKED: the lock files list no packages"
        if missing == total:
            verdict = "FAILED (AUDIT_STRICT=1)" if strict else "NOT CHECKED"
            return (f"SUPPLY CHAIN: {verdict}: none of the {total} locked packages could be audited "
                    "(no vulnerability data reachable), so no vulnerability was looked up")
        if missing:
            verdict = "FAILED (AUDIT_STRICT=1)" if strict else "PARTLY CHECKED"
            return (f"SUPPLY CHAIN: {verdict}: {total - missing} of {total} locked packages audited, "
                    f"no fixable vulnerability; {missing} could not be audited{no_fix}")
        return f"SUPPLY CHAIN: ok: all {total} locked packages audited, no fixable vulnerability{no_fix}"


def run_pip_audit(pip_audit: str, lock_file: str) -> dict:
    # --disable-pip --require-hashes: the lock is the whole tree; audit it as written.
    result = subprocess.run([pip_audit, "--format", "json", "--progress-spinner", "off",
                             "--disable-pip", "--require-hashes", "-r", lock_file],
                            capture_output=True, text=True)
    # pip-audit exits 1 when it finds something; the JSON is on stdout either way.
    if not result.stdout.strip():
        sys.stderr.write(result.stderr)
        raise SystemExit(f"pip-audit -r {lock_file} failed with status {result.returncode}")
    return json.loads(result.stdout)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--banner-file", help="also write the closing one-line verdict here")
    parser.add_argument("pip_audit")
    parser.add_argument("lock_files", nargs="+")
    args = parser.parse_args(argv[1:])
    verdict = Verdict()
    for lock_file in args.lock_files:
        verdict.add(run_pip_audit(args.pip_audit, lock_file))
    strict = os.environ.get("AUDIT_STRICT", "") not in ("", "0")
    for title, items in (("VULNERABLE, fix available", verdict.fixable),
                         ("vulnerable, no fix yet", verdict.unfixable),
                         # (when nothing at all was audited, the banner alone says it)
                         ("NOT AUDITED", verdict.unaudited if verdict.audited else [])):
        if items:
            print(f"pip-audit: {title} ({len(set(items))}):")
            for item in sorted(set(items)):
                print(f"  {item}")
    banner = verdict.banner(strict)
    if args.banner_file:
        with open(args.banner_file, "w") as f:
            f.write(banner + "\n")
    print(banner)
    return 1 if verdict.failed(strict) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Supply-chain gate for CI (docs/security.md): pip-audit over requirements.txt and over the
packages actually installed in .venv (the pins and everything they pulled in).

Fails (exit 1) on a known vulnerability that has a fixed version to move to. A vulnerability
without a fix is printed and does not fail the run (nothing to upgrade to yet). A package
pip-audit could not look up (the vulnerability service unreachable or not knowing it) is
printed as unaudited; with ``AUDIT_STRICT=1`` that fails the run too, since "nothing found"
then means "nothing checked".

Usage: .ci/audit.py PIP_AUDIT REQUIREMENTS [SITE_PACKAGES]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field


@dataclass
class Verdict:
    fixable: list[str] = field(default_factory=list)
    unfixable: list[str] = field(default_factory=list)
    unaudited: list[str] = field(default_factory=list)

    def add(self, report: dict) -> None:
        for dep in report.get("dependencies", []):
            name = f"{dep['name']} {dep.get('version', '')}".strip()
            if "skip_reason" in dep:
                self.unaudited.append(f"{name}: {dep['skip_reason']}")
            for vuln in dep.get("vulns", []):
                ids = ", ".join([vuln["id"], *vuln.get("aliases", [])])
                if vuln.get("fix_versions"):
                    self.fixable.append(f"{name}: {ids} (fixed in {', '.join(vuln['fix_versions'])})")
                else:
                    self.unfixable.append(f"{name}: {ids} (no fix yet)")

    def failed(self, strict: bool) -> bool:
        return bool(self.fixable) or (strict and bool(self.unaudited))


def run_pip_audit(pip_audit: str, *args: str) -> dict:
    result = subprocess.run([pip_audit, "--format", "json", "--progress-spinner", "off", *args],
                            capture_output=True, text=True)
    # pip-audit exits 1 when it finds something; the JSON is on stdout either way.
    if not result.stdout.strip():
        sys.stderr.write(result.stderr)
        raise SystemExit(f"pip-audit {' '.join(args)} failed with status {result.returncode}")
    return json.loads(result.stdout)


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    pip_audit, requirements = argv[1], argv[2]
    verdict = Verdict()
    # The pins, each exactly as written (requirements.txt pins every direct dependency).
    verdict.add(run_pip_audit(pip_audit, "-r", requirements, "--no-deps", "--disable-pip"))
    if len(argv) == 4:  # what pip installed from them, transitive dependencies included
        verdict.add(run_pip_audit(pip_audit, "--path", argv[3]))
    strict = os.environ.get("AUDIT_STRICT", "") not in ("", "0")
    for title, items in (("VULNERABLE, fix available", verdict.fixable),
                         ("vulnerable, no fix yet", verdict.unfixable),
                         ("NOT AUDITED", verdict.unaudited)):
        if items:
            print(f"pip-audit: {title} ({len(items)}):")
            for item in sorted(set(items)):
                print(f"  {item}")
    if verdict.unaudited and not strict:
        print("pip-audit: some packages could not be audited (vulnerability data unreachable?); "
              "set AUDIT_STRICT=1 to fail on that")
    failed = verdict.failed(strict)
    print(f"pip-audit: {'FAILED' if failed else 'ok'}: {len(verdict.fixable)} fixable, "
          f"{len(verdict.unfixable)} without fix, {len(set(verdict.unaudited))} not audited")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

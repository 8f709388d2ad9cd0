"""contrib/prometheus/synapse_attach_alerts.yml: parsed by promtool and its alerts fired (and
not fired) by promtool's own rule tests (``synapse_attach_alerts_test.yml``)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROMETHEUS = Path(__file__).resolve().parents[2] / "contrib" / "prometheus"
RULES = PROMETHEUS / "synapse_attach_alerts.yml"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: apt-get install prometheus (Debian's package ships it)")
    return path


def test_the_rules_parse():
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 rules found" in result.stdout


def test_the_alerts_fire_when_they_should_and_not_before():
    result = subprocess.run([promtool(), "test", "rules", "synapse_attach_alerts_test.yml"], cwd=PROMETHEUS,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails(tmp_path):
    """The test above could not fail if promtool passed anything: the same tests, expecting
    the stuck alert while the writer has caught up."""
    shutil.copy(RULES, tmp_path / RULES.name)
    tests = (PROMETHEUS / "synapse_attach_alerts_test.yml").read_text().replace(
        "exp_alerts: []  # it caught up", "exp_alerts: [{exp_labels: {severity: critical, stream: events, "
                                          "writer: persister1}}]")
    (tmp_path / "t.yml").write_text(tests)
    result = subprocess.run([promtool(), "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0

"""contrib/prometheus/synapse_audit_alerts.yml: parsed by promtool and its alert fired (and
not fired) by promtool's own rule tests (``synapse_audit_alerts_test.yml``)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.synapse_attach.test_alert_rules import promtool

PROMETHEUS = Path(__file__).resolve().parents[2] / "contrib" / "prometheus"
RULES = PROMETHEUS / "synapse_audit_alerts.yml"
TESTS = PROMETHEUS / "synapse_audit_alerts_test.yml"


def test_the_rule_parses():
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rules found" in result.stdout


def test_the_alert_fires_for_a_room_listed_long_enough_and_only_it():
    result = subprocess.run([promtool(), "test", "rules", TESTS.name], cwd=PROMETHEUS, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails(tmp_path):
    """The test above could not fail if promtool passed anything: the same tests, expecting the
    alert for the room that was listed in one run only."""
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / "t.yml").write_text(TESTS.read_text().replace('room_id: "!crowded:hs"', 'room_id: "!blip:hs"'))
    result = subprocess.run([promtool(), "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0

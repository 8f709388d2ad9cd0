"""contrib/: the Grafana dashboard and the Prometheus alert rules an operator loads.

Every expression must parse (``promtool``, Debian's ``prometheus`` package: the real parser,
not ours) and every metric it names must be on /metrics once the cluster has written facts,
reserved an ID, published an endpoint snapshot, served a catch-up and run a check.
"""
import json
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.utils import timezone

from dashboard import worker_status
from jobs.models import JobRun
from tests.dashboard.test_views import endpoint_row, receipts_written, staff_client  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

CONTRIB = Path(__file__).resolve().parents[2] / "contrib"
ALERTS = CONTRIB / "prometheus" / "alerts.yml"
DASHBOARD = CONTRIB / "grafana" / "synapse_repl.json"
METRIC_NAME = re.compile(r"\bsynapse_repl_[a-z0-9_]+")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: apt-get install prometheus (Debian's package ships it)")
    return path


def alert_expressions() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_alert_rules_pass_promtool():
    result = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(alert_expressions()) >= 5


def test_dashboard_expressions_pass_promtool(tmp_path):
    # promtool parses expressions inside rule files: wrap each panel query in a recording rule
    # (Grafana's $__rate_interval becomes a plain range, as Grafana does before sending it).
    exprs = dashboard_expressions()
    assert exprs
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:panel_query_{i}", "expr": e.replace("$__rate_interval", "5m")}
        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rejects_a_broken_expression(tmp_path):
    """The two checks above could not fail if promtool accepted anything."""
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"alert": "Broken", "expr": "sum by (stream (synapse_repl_stream_stuck_ids) >"}]}]}))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode != 0


def test_every_metric_named_is_on_metrics(staff_client, receipts_written, settings):  # noqa: F811
    from prometheus_client.parser import text_string_to_metric_families

    rt, w, ids = receipts_written
    endpoint_row()
    worker_status.save("redis-w1", "redis", True, {("receipts", "master"): ids[0]})
    now = timezone.now()
    JobRun.objects.create(job="check_visibility", status=JobRun.Status.SUCCEEDED, started_at=now - timedelta(seconds=5),
                          ended_at=now, differences=3)
    JobRun.objects.create(job="check_topological_ordering", status=JobRun.Status.FAILED,
                          started_at=now - timedelta(seconds=5), ended_at=now, error="boom")
    settings.REPLICATION_SECRET = "contrib-test-secret"
    caught_up = staff_client.get("/_synapse/replication/get_repl_stream_updates/receipts/txn-contrib?from_token=0&upto_token=1",
                                 HTTP_AUTHORIZATION="Bearer contrib-test-secret")
    assert caught_up.status_code == 200, caught_up.content
    with w.generator.get_next():  # one ID reserved and not yet complete: pending and stuck counts
        response = staff_client.get("/metrics")
    assert response.status_code == 200
    families = list(text_string_to_metric_families(response.content.decode()))
    samples = {s.name: s for f in families for s in f.samples}

    named = {name for expr in alert_expressions() + dashboard_expressions() for name in METRIC_NAME.findall(expr)}
    assert len(named) >= 10, named
    missing = sorted(name for name in named if name not in samples)
    assert not missing, f"named in contrib/ but with no sample on /metrics: {missing}"

    by_job = {(s.name, s.labels.get("job")): s.value for f in families for s in f.samples}
    assert by_job[("synapse_repl_job_last_run_failed", "check_topological_ordering")] == 1
    assert by_job[("synapse_repl_job_last_run_failed", "check_visibility")] == 0
    assert by_job[("synapse_repl_job_last_run_differences", "check_visibility")] == 3

"""Dashboard pages, status.json and /metrics: what staff see, and that nobody else sees it."""
import random
from datetime import datetime, timezone

import pytest
from django.contrib.auth import get_user_model

from dashboard.models import EndpointStatus
from streams.conf import stream_writers
from streams.models import Receipt
from streams.runtime import StreamRuntime

pytestmark = pytest.mark.django_db(transaction=True)

PROTECTED_PAGES = ["/", "/connections/", "/admin/", "/admin/rooms/event/", "/admin/streams/streamposition/"]


@pytest.fixture
def staff_client(client):
    user = get_user_model().objects.create_user("operator", password="x" * 12, is_staff=True)
    client.force_login(user)
    return client


@pytest.fixture
def plain_client(client):
    user = get_user_model().objects.create_user("someone", password="x" * 12)
    client.force_login(user)
    return client


@pytest.fixture
def receipts_written():
    rt = StreamRuntime(instance_name="master", writers=stream_writers(""))
    try:
        w = rt.writer("receipts")
        ids = w.append([[(Receipt, Receipt.synthetic(random.Random(), n))] for n in range(3)])
        yield rt, w, ids
    finally:
        rt.close()


def endpoint_row(**snapshot_overrides):
    snapshot = {
        "server_name": "test", "counters": {"started_at": 0, "connections": 4, "rdata_sent": 120,
                                            "position_sent": 7, "other_sent": 9,
                                            "disconnects": {"ping timeout": 2, "bad line": 1}},
        "connections": [{"name": "worker1", "peer": "127.0.0.1:5555", "connected_at": 1.0, "last_ping_at": 2.0,
                         "outbound_queue": 42, "streams": ["events"], "syncing_users": [],
                         "syncing_user_count": 0, "commands_in": 3, "lines_out": 9}],
        "recent_disconnects": [],
        **snapshot_overrides,
    }
    return EndpointStatus.objects.create(endpoint="host 127.0.0.1:9092", server_name="test", pid=1,
                                         updated_at=datetime.now(timezone.utc), snapshot=snapshot)


def test_streams_page_shows_positions_and_pending(admin_client, receipts_written):
    rt, w, ids = receipts_written
    with w.generator.get_next() as pending_id:
        page = admin_client.get("/")
        data = admin_client.get("/status.json").json()
    assert page.status_code == 200
    body = page.content.decode()
    assert f'data-writer="master">{ids[-1]}<' in body
    assert 'data-stream="events" data-writer="master">nothing written yet<' in body  # configured, no position
    assert 'src="/static/dashboard/live.js"' in body
    assert "Job runs" in body  # the place batch jobs will fill
    receipts = next(s for s in data["streams"] if s["name"] == "receipts")
    assert receipts["positions"] == {"master": ids[-1]}
    assert receipts["linear"] == ids[-1]
    assert [(p["writer"], p["stream_ids"], p["stuck"]) for p in receipts["pending"]] == [("master", [pending_id], False)]


def test_connections_page_lists_workers(staff_client):
    endpoint_row(recent_disconnects=[{"at": 3.0, "name": "worker2", "peer": "127.0.0.1:6666",
                                      "reason": "bad line", "detail": "bad line"}])
    body = staff_client.get("/connections/").content.decode()
    assert "worker1" in body and "127.0.0.1:5555" in body and ">42<" in body


@pytest.mark.parametrize("path", PROTECTED_PAGES)
def test_anonymous_gets_the_sign_in_page(client, path, receipts_written):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


@pytest.mark.parametrize("path", PROTECTED_PAGES)
def test_non_staff_gets_the_sign_in_page(plain_client, path, receipts_written):
    response = plain_client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


@pytest.mark.parametrize("path", ["/status.json", "/metrics"])
def test_data_endpoints_refuse_anonymous_and_non_staff(client, plain_client, path, receipts_written):
    from django.test import Client

    for c in (Client(), plain_client):
        response = c.get(path)
        assert response.status_code == 403
        assert b"master" not in response.content and b"receipts" not in response.content


def test_metrics_in_prometheus_format(staff_client, receipts_written, settings):
    from prometheus_client.parser import text_string_to_metric_families

    rt, w, ids = receipts_written
    endpoint_row()
    # The catch-up endpoint wants the replication secret, staff or not (whatever value the
    # settings hold in this run: generated on the embedded default).
    settings.REPLICATION_SECRET = "metrics-test-secret"
    caught_up = staff_client.get("/_synapse/replication/get_repl_stream_updates/receipts/txn-metrics?from_token=0&upto_token=1",
                                 HTTP_AUTHORIZATION="Bearer metrics-test-secret")
    assert caught_up.status_code == 200, caught_up.content
    response = staff_client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}
    ep = ("endpoint", "host 127.0.0.1:9092")
    assert samples[("synapse_repl_stream_position", (("stream", "receipts"), ("writer", "master")))] == ids[-1]
    assert samples[("synapse_repl_stream_linear_position", (("stream", "receipts"),))] == ids[-1]
    assert samples[("synapse_repl_stream_facts_total", (("stream", "receipts"),))] == ids[-1]
    assert samples[("synapse_repl_endpoint_connections", (ep,))] == 1
    assert samples[("synapse_repl_connection_outbound_queue", (ep, ("name", "worker1"), ("peer", "127.0.0.1:5555")))] == 42
    assert samples[("synapse_repl_replication_lines_sent_total", (("command", "RDATA"), ep))] == 120
    assert samples[("synapse_repl_replication_lines_sent_total", (("command", "POSITION"), ep))] == 7
    assert samples[("synapse_repl_endpoint_disconnects_total", (ep, ("reason", "ping timeout")))] == 2
    assert samples[("synapse_repl_catchup_requests_total", (("status", "200"), ("stream", "receipts")))] >= 1


def test_metrics_open_to_configured_networks(client, settings, receipts_written):
    settings.DASHBOARD = {**settings.DASHBOARD, "METRICS_ALLOWED_NETWORKS": "10.0.0.0/8"}
    assert client.get("/metrics").status_code == 403  # the test client is 127.0.0.1
    settings.DASHBOARD = {**settings.DASHBOARD, "METRICS_ALLOWED_NETWORKS": "10.0.0.0/8, 127.0.0.0/8"}
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b'synapse_repl_stream_position{stream="receipts",writer="master"}' in response.content
    # ...which opens /metrics only, nothing else.
    assert client.get("/status.json").status_code == 403


def test_bad_metrics_network_is_a_clear_error(client, settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.DASHBOARD = {**settings.DASHBOARD, "METRICS_ALLOWED_NETWORKS": "10.0.0.0/33"}
    with pytest.raises(ImproperlyConfigured, match="10.0.0.0/33"):
        client.get("/metrics")


def test_job_runs_panel_lists_runs_and_starts_one(staff_client, settings):
    """The streams page lists job runs; its form starts one (eager Celery: in a child process,
    which records its outcome on this database). The check names a room that does not exist:
    the child reports it without starting Spark. A dashboard start that runs Spark to success
    in its child is test_child.py's ``test_dashboard_job_leaves_no_jvm_in_the_web_process``."""
    import threading
    import time

    from django.utils import timezone

    from jobs.models import JobRun

    JobRun.objects.create(job="check_visibility", status=JobRun.Status.FAILED, started_at=timezone.now(),
                          ended_at=timezone.now(), error="Traceback...\nRuntimeError: the database went away")
    page = staff_client.get("/").content.decode()
    assert "check_visibility" in page and "RuntimeError: the database went away" in page
    assert '<option>topological_ordering</option>' in page

    assert staff_client.post("/jobs/start", {"job": "no_such_job"}).status_code == 400
    answer = staff_client.post("/jobs/start", {"job": "check_topological_ordering", "rooms": "!nowhere:hs"})
    assert answer.status_code == 302
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        run = JobRun.objects.filter(job="check_topological_ordering").first()
        if run is not None and run.status != JobRun.Status.RUNNING:
            break
        time.sleep(0.5)
    for thread in threading.enumerate():  # the launcher's thread records a dead child's end
        if thread.name.startswith("job check_topological_ordering"):
            thread.join(timeout=60)
    run.refresh_from_db()
    assert run.trigger.startswith("dashboard (") and run.parameters == {"rooms": ["!nowhere:hs"]}
    # the child's own verdict (a child that never reached this database would leave the
    # launcher's "ended without recording an outcome" instead)
    assert (run.status, run.error) == (
        JobRun.Status.FAILED, "room !nowhere:hs does not exist: nothing was checked or written"), run.error
    assert run.rows_in is None and run.ended_at is not None


def test_a_check_with_differences_is_shown_as_a_failure_with_a_table(staff_client, client):
    """A check that found differences finished its work but failed its purpose: the jobs
    panel, the live feed and the admin all show it failed, with the count and a small table."""
    from django.utils import timezone

    from dashboard.job_panel import recent_job_runs
    from jobs.models import JobRun

    sample = [{"room_id": f"!r{i}:hs", "event_id": f"$e{i}", "expected": str(i), "found": None} for i in range(15)]
    bad = JobRun.objects.create(job="check_visibility", status=JobRun.Status.SUCCEEDED, started_at=timezone.now(),
                                ended_at=timezone.now(), rows_in=500, differences=420, difference_sample=sample)
    clean = JobRun.objects.create(job="check_topological_ordering", status=JobRun.Status.SUCCEEDED,
                                  started_at=timezone.now(), ended_at=timezone.now(), rows_in=500, differences=0)
    feed = {r["id"]: r for r in recent_job_runs()}
    assert (feed[bad.pk]["verdict"], feed[bad.pk]["verdict_text"]) == ("failed", "failed: 420 differences")
    assert feed[bad.pk]["difference_columns"] == ["room_id", "event_id", "expected", "found"]
    assert len(feed[bad.pk]["difference_rows"]) == 10 and feed[bad.pk]["difference_rows"][3] == ["!r3:hs", "$e3", "3", ""]
    assert (feed[clean.pk]["verdict"], feed[clean.pk]["difference_rows"]) == ("succeeded", [])

    page = staff_client.get("/").content.decode()
    assert '<td class="status-failed">failed: 420 differences</td>' in page
    assert '<td class="status-succeeded">succeeded</td>' in page
    assert "first 10 of 420 differences" in page and "<th>room_id</th>" in page and "<td>$e9</td>" in page
    assert "$e10" not in page  # a readable table, not the whole sample

    admin = get_user_model().objects.create_superuser("root", password="y" * 12)
    client.force_login(admin)
    listing = client.get("/admin/jobs/jobrun/").content.decode()
    assert "failed: 420 differences" in listing and 'class="status-failed"' in listing
    detail = client.get(f"/admin/jobs/jobrun/{bad.pk}/change/").content.decode()
    assert 'table class="differences"' in detail and "<td>!r9:<wbr>hs</td>" in detail and "!r10:hs" not in detail


def test_a_process_with_other_writers_keeps_their_rows_and_the_dashboard_warns(staff_client, settings):
    """A process whose STREAM_WRITERS leaves out a writer others recorded must not delete that
    writer's position (the other process may be the right one); the dashboard says they disagree."""
    from streams.models import StreamPosition
    from streams.stream_status import stream_status

    for name in ("w1", "w2"):
        rt = StreamRuntime(instance_name=name, writers=stream_writers("receipts=w1,w2"))
        try:
            rt.writer("receipts").append([[(Receipt, Receipt.synthetic(random.Random(), n))] for n in range(3)])
        finally:
            rt.close()
    w1_row = StreamPosition.objects.get(stream_name="receipts", instance_name="w1").stream_id

    rt = StreamRuntime(instance_name="w2", writers=stream_writers("receipts=w2"))
    try:
        rt.writer("receipts").append([[(Receipt, Receipt.synthetic(random.Random(), 9))]])
    finally:
        rt.close()
    assert StreamPosition.objects.get(stream_name="receipts", instance_name="w1").stream_id == w1_row

    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "STREAM_WRITERS": "receipts=w2"}
    receipts = next(s for s in stream_status() if s.name == "receipts")
    assert receipts.unconfigured == {"w1": w1_row} and list(receipts.positions) == ["w2"]
    assert "w1" in receipts.writers_warning and "STREAM_WRITERS" in receipts.writers_warning
    page = staff_client.get("/").content.decode()
    from django.utils.html import escape

    assert "WRITERS DISAGREE" in page and escape(receipts.writers_warning) in page
    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "STREAM_WRITERS": "receipts=w1,w2"}
    assert "WRITERS DISAGREE" not in staff_client.get("/").content.decode()


def test_job_start_refuses_anonymous(client):
    answer = client.post("/jobs/start", {"job": "visibility"})
    assert answer.status_code == 302 and "/login/" in answer["Location"]


def test_job_start_refuses_get(staff_client):
    assert staff_client.get("/jobs/start").status_code == 405


def test_each_writer_shows_its_last_write_and_whether_its_process_runs(staff_client, pg_url, settings, tmp_path):
    """After both writers of a stream exited, the dashboard must not show one of them
    "+N ahead of linear" for good, with no sign that either is gone. A writer whose process
    finished cleanly reads "finished"; one whose process was killed, "exited unexpectedly"."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from streams.models import StreamPosition
    from streams.stream_status import stream_status

    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "STREAM_WRITERS": "receipts=w1,w2"}
    root = Path(__file__).resolve().parents[2]
    before = datetime.now(timezone.utc)

    def write(name: str, *args: str) -> subprocess.Popen:
        env = {**os.environ, "DATABASE_URL": pg_url, "STATE_DIR": str(tmp_path), "INSTANCE_NAME": name,
               "STREAM_WRITERS": "receipts=w1,w2"}
        env.pop("REDIS_URL", None)
        return subprocess.Popen([sys.executable, "manage.py", "write_facts", "receipts", *args, "--no-progress"],
                                cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    finished = write("w1", "--count", "3")
    assert finished.wait(timeout=120) == 0, finished.stderr.read()
    killed = write("w2", "--count", "100000", "--rate", "20")
    deadline = time.monotonic() + 120
    while not StreamPosition.objects.filter(stream_name="receipts", instance_name="w2", pid=killed.pid).exists():
        assert killed.poll() is None and time.monotonic() < deadline, "w2 did not write"
        time.sleep(0.1)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)

    receipts = next(s for s in stream_status() if s.name == "receipts")
    rows = {w.name: w for w in receipts.writer_rows}
    assert set(rows) == {"w1", "w2"}
    for w in rows.values():  # both processes have exited
        assert w.alive is False and w.pid and w.last_write >= before
    assert rows["w1"].finished and not rows["w1"].gone
    assert rows["w2"].gone and not rows["w2"].finished
    page = staff_client.get("/").content.decode()
    row = page.split('<tr data-stream="receipts"')[1].split("</tr>")[0]
    assert row.count("exited unexpectedly</strong>") == 1 and row.count(">finished</span>") == 1
    assert "last write" in page
    assert 'class="ahead"' not in row
    metrics = staff_client.get("/metrics").content.decode()
    for w in ("w1", "w2"):
        assert f'synapse_repl_stream_writer_process_up{{stream="receipts",writer="{w}"}} 0.0' in metrics
        assert f'synapse_repl_stream_writer_last_write_timestamp_seconds{{stream="receipts",writer="{w}"}}' in metrics
    status = staff_client.get("/status.json").json()
    by_name = next(s for s in status["streams"] if s["name"] == "receipts")["writer_status"]
    assert {w: (s["alive"], s["last_write"] is not None, s["finished"], s["gone"]) for w, s in by_name.items()} == {
        "w1": (False, True, True, False), "w2": (False, True, False, True)}

    # a writer in a running process (this one) is alive; the idle w1 holds nothing back, so the
    # linear position follows w2 and no writer is ahead of it
    rt = StreamRuntime(instance_name="w2", writers=stream_writers("receipts=w1,w2"))
    try:
        rt.writer("receipts").append([[(Receipt, Receipt.synthetic(random.Random(), 99))]])
    finally:
        rt.close()
    receipts = next(s for s in stream_status() if s.name == "receipts")
    rows = {w.name: w for w in receipts.writer_rows}
    assert rows["w2"].alive is True and rows["w2"].pid == os.getpid() and rows["w2"].ahead == 0
    assert receipts.linear == rows["w2"].position and receipts.laggard is None
    assert rows["w1"].finished
    status = staff_client.get("/status.json").json()
    assert next(s for s in status["streams"] if s["name"] == "receipts")["writer_status"]["w2"]["alive"] is True


def test_typing_shows_the_position_the_web_process_holds(staff_client, settings):
    """Typing lives in memory in the web process: after typing changes sent to it (as
    ``write_facts typing`` sends them) the pages show its position, not "nothing written yet"."""
    import json

    from prometheus_client.parser import text_string_to_metric_families

    from streams.runtime import runtime

    settings.REPLICATION_SECRET = "typing-test-secret"
    updates = [{"room_id": "!r:hs", "user_id": f"@u{i}:hs", "typing": i % 2 == 0, "timeout": 30000}
               for i in range(6)]
    answer = staff_client.post("/_synapse/replication/typing", json.dumps({"updates": updates}),
                               content_type="application/json", HTTP_AUTHORIZATION="Bearer typing-test-secret")
    assert answer.status_code == 200, answer.content
    token = runtime().typing().current_token
    assert token > 0
    me = runtime().instance_name
    typing = next(s for s in staff_client.get("/status.json").json()["streams"] if s["name"] == "typing")
    assert typing["positions"] == {me: token} and typing["linear"] == token
    page = staff_client.get("/").content.decode()
    row = page.split('<tr data-stream="typing"')[1].split("</tr>")[0]
    assert f">{token}</span>" in row and "nothing written yet" not in row
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for family in
               text_string_to_metric_families(staff_client.get("/metrics").content.decode()) for s in family.samples}
    assert samples[("synapse_repl_stream_position", (("stream", "typing"), ("writer", me)))] == token


def test_backfill_says_why_its_positions_are_negative(staff_client):
    from streams.stream_status import BACKWARDS_NOTE

    page = staff_client.get("/").content.decode()
    row = page.split('<tr data-stream="backfill"')[1].split("</tr>")[0]
    assert "(counts down)" in row and "count down from -2" in row
    assert "count down from -2" in BACKWARDS_NOTE

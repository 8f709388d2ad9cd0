"""What an operator does in the browser (Debian's headless Chromium, Playwright), on a full-mode
layout: the web process (daphne serving the ASGI app) and the replication endpoint
(``runreplication``) are separate processes, so the endpoint can be killed as it would die.

One service for the whole walk: a check run from the dashboard finds a difference and is shown
as a failure; a job started from the dashboard shows its Spark progress and is cancelled; the
Connections page lists a Redis worker with its lag; every page is photographed at 1,400 and
760 px (``artifacts/screenshots/``, kept by CI) and measured (``page_layout``): no word of a
table cell split across lines, nothing clipped, no page wider than the window; and the Live
banner turns red when the endpoint process is killed.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from testing.processes import stop_process, wait_port
from testing.services import free_port
from tests.dashboard.page_layout import layout_faults
from tests.dashboard.test_browser import CHROMIUM, CHROMIUM_ARGS, PASSWORD, SCREENSHOTS, WAIT_MS

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (1400, 760)
JOB_WAIT_MS = 120_000  # a Spark driver starting on a loaded 2-core machine

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

def _stop_group(proc: subprocess.Popen) -> None:
    stop_process(proc, timeout=15, group=True)


@pytest.fixture
def full_mode(pg_url, redis_server, tmp_path):
    """daphne (web, feed, jobs in child processes) and runreplication, one database; a Redis
    worker following the (silent) Redis channel and reporting where it stands."""
    web_port, rep_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(DATABASE_URL=pg_url, WEB_LISTEN=f"127.0.0.1:{web_port}", REPLICATION_LISTEN=f"127.0.0.1:{rep_port}",
               STATE_DIR=str(tmp_path / "state"), ADMIN_PASSWORD=PASSWORD, PYTHONUNBUFFERED="1",
               DJANGO_SETTINGS_MODULE="synapse_repl.settings", SPARK_MASTER="local[1]",
               JOB_MODULES="tests.dashboard.browser_jobs", SERVER_NAME="browser.test")
    subprocess.run([sys.executable, "manage.py", "ensure_admin"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=120)
    procs = {}

    def start(name, *args):
        log = open(tmp_path / f"{name}.log", "w")
        procs[name] = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        return procs[name]

    try:
        start("endpoint", "manage.py", "runreplication", "--listen", f"127.0.0.1:{rep_port}")
        # the web process as a deployment runs it without an endpoint of its own
        start("web", "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port), "synapse_repl.asgi:application")
        wait_port(rep_port, procs["endpoint"], tmp_path / "endpoint.log", timeout=60)
        wait_port(web_port, procs["web"], tmp_path / "web.log", timeout=60)
        start("redis-worker", "manage.py", "replication_worker", "--name", "redis-follower", "--redis",
              "--redis-url", redis_server.url, "--catchup-url", f"http://127.0.0.1:{web_port}",
              "--server-name", "browser.test", "--streams", "receipts,events", "--jsonl", str(tmp_path / "w.jsonl"))
        yield f"http://127.0.0.1:{web_port}", procs, env, redis_server.url
    finally:
        for proc in procs.values():
            _stop_group(proc)  # its session: a job's child process and its JVM too


def manage(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


class TcpWorker:
    """A worker on the replication endpoint's socket, as the Connections page lists it: its
    NAME, a user it reports syncing, and a PING every few seconds so the endpoint keeps it."""

    def __init__(self, listen: str, name: str, user: str):
        host, _, port = listen.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(f"NAME {name}\nPING 1\nREPLICATE \nUSER_SYNC i1 {user} DEV start 1\n".encode())
        self.stopped = threading.Event()
        threading.Thread(target=self._keepalive, name="worker pings", daemon=True).start()
        threading.Thread(target=self._drain, name="worker reads", daemon=True).start()

    def _keepalive(self) -> None:
        n = 2
        while not self.stopped.wait(4):
            try:
                self.sock.sendall(f"PING {n}\n".encode())
            except OSError:
                return
            n += 1

    def _drain(self) -> None:
        try:
            while self.sock.recv(65536):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


def start_job(page, job: str) -> None:
    page.select_option("form.start-job select[name=job]", job)
    page.click("form.start-job button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def test_operator_walk_in_a_real_browser(full_mode, tmp_path):
    if not os.path.exists(CHROMIUM):  # fail, never skip: CI must run this
        pytest.fail(f"{CHROMIUM} not found: apt-get install chromium (.ci/run installs it)", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    base, procs, env, redis_url = full_mode
    manage(env, "write_facts", "events", "--count", "40", "--per-txn", "5", "--seed", "7", "--no-progress")
    # One stored ordering made wrong, as a bug behind the persist path's back would. The last
    # event of any type: 40 events over the generator's 8 rooms may hold no message at all
    # (each room starts with four setup events and two joins).
    import psycopg

    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as db:
        changed = db.execute("UPDATE events SET topological_ordering = topological_ordering + 1000 WHERE "
                             "stream_ordering = (SELECT max(stream_ordering) FROM events)").rowcount
        assert changed == 1
        event_pk = db.execute("SELECT id FROM events ORDER BY stream_ordering LIMIT 1").fetchone()[0]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(base + "/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(base + "/")
            status = page.locator("#live-status")
            expect(status).to_have_attribute("data-state", "live", timeout=WAIT_MS)

            # From the dashboard, at once: a check (it will find the wrong ordering) and a job
            # that runs until cancelled.
            start_job(page, "check_topological_ordering")
            start_job(page, "test_endless")
            # The job shows its Spark progress while it runs; Cancel ends it.
            row = page.locator('tbody[data-live="jobs"] tr', has_text="test_endless").first
            expect(row.locator(".job-progress")).to_have_text(re.compile(r"stages \d+/\d+, tasks \d+/4"),
                                                              timeout=JOB_WAIT_MS)
            expect(row.get_by_role("link", name="Spark UI")).to_be_visible()
            page.screenshot(path=str(SCREENSHOTS / "streams-job-running-1400.png"), full_page=True)
            row.get_by_role("button", name="Cancel").click()
            expect(row.locator("td").nth(2)).to_have_text(re.compile(r"^cancelled"), timeout=JOB_WAIT_MS)
            # The check that found a difference reads as failed, in red, with the difference.
            check_row = page.locator('tbody[data-live="jobs"] tr', has_text="check_topological_ordering").first
            expect(check_row.locator("td.status-failed")).to_have_text(re.compile(r"^failed: 1 difference\b"),
                                                                       timeout=JOB_WAIT_MS)
            # (retried: the live table may redraw the row between two reads, and a detached
            # cell has no computed style)
            expect(check_row.locator("td.status-failed")).to_have_css("color", "rgb(179, 38, 30)")
            # the differences table's last column: the ordering found stored (the right one + 1000)
            expect(page.locator("table.differences td").last).to_have_text(re.compile(r"^10\d\d$"))

            # Every page at both widths, a TCP worker connected (its name, address and syncing
            # user in the Connections and Syncing users tables): photographed, then measured
            # (folded differences opened): no word of a table cell split across lines (an
            # identifier wraps only after its separators), nothing clipped, no page wider
            # than the window.
            with psycopg.connect(env["DATABASE_URL"], autocommit=True) as db:
                check_pk = db.execute("SELECT id FROM job_runs WHERE job = 'check_topological_ordering'").fetchone()[0]
            pages = {"streams": "/", "connections": "/connections/", "syncing-users": "/connections/users/",
                     "admin": "/admin/", "admin-events": "/admin/rooms/event/",
                     "admin-event": f"/admin/rooms/event/{event_pk}/change/",
                     "admin-positions": "/admin/streams/streamposition/", "admin-job-runs": "/admin/jobs/jobrun/",
                     "admin-job-run": f"/admin/jobs/jobrun/{check_pk}/change/",
                     "job-findings": f"/jobs/{check_pk}/findings"}
            tcp_worker = TcpWorker(env["REPLICATION_LISTEN"], "worker1", "@carol:browser.test")
            faults = {}
            try:
                for width in WIDTHS:
                    page.set_viewport_size({"width": width, "height": 900})
                    for name, path in pages.items():
                        page.goto(base + path)
                        if page.locator("#live-status").count():
                            expect(status, f"{name} at {width} px").to_have_attribute("data-state", "live",
                                                                                      timeout=WAIT_MS)
                        if name == "connections":
                            expect(page.locator(".connections td.conn-name")).to_have_text("worker1", timeout=WAIT_MS)
                        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
                        if found := layout_faults(page):
                            faults[f"{name} at {width} px"] = found
            finally:
                tcp_worker.close()
            assert faults == {}
            # the differences table, measured above, holds the wrong ordering on the run's page
            page.goto(base + f"/admin/jobs/jobrun/{check_pk}/change/")
            expect(page.locator("table.differences td").last).to_have_text(re.compile(r"^10\d\d$"))
            # and its link opens the run's findings page, which holds it too
            page.get_by_role("link", name="all kept findings").click()
            expect(page).to_have_url(re.compile(rf"/jobs/{check_pk}/findings$"))
            expect(page.locator("table.differences td").last).to_have_text(re.compile(r"^10\d\d$"))
            expect(page.locator("[data-figure=Kept]")).to_have_text("1 of 1 difference kept.")
            # an event's receipt time reads as a time (UTC), the stored milliseconds in its tooltip
            page.goto(base + f"/admin/rooms/event/{event_pk}/change/")
            received = page.locator(".field-received_at time")
            expect(received).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
            expect(received).to_have_attribute("title", re.compile(r"^\d{13} ms since 1970-01-01 UTC$"))
            assert "(ms)" not in page.locator("#content").text_content()
            # the events list shows every column, the last one too, at 1,400 px
            page.set_viewport_size({"width": 1400, "height": 900})
            page.goto(base + "/admin/rooms/event/")
            expect(page.locator("#result_list td.field-instance_name").first).to_be_in_viewport()

            # The Redis worker, on the Connections page with its lag per stream: it applies what
            # a writer announces on Redis, and lags by what one that does not announce wrote.
            assert procs["redis-worker"].poll() is None and "replication subscribed" in (
                tmp_path / "redis-worker.log").read_text()
            manage({**env, "REDIS_URL": redis_url}, "write_facts", "receipts", "--count", "3", "--no-progress")
            manage(env, "write_facts", "receipts", "--count", "4", "--no-progress")
            worker = page.locator('tr[data-worker="redis-follower"]')
            lag = worker.locator('.lag[data-stream="receipts"]')
            for _ in range(60):  # the table is drawn with the page; the worker reports every 2 s
                page.goto(base + "/connections/")
                if lag.count() and lag.text_content() == "receipts 4":
                    break
                page.wait_for_timeout(500)
            expect(worker).to_contain_text("redis")
            expect(worker).to_contain_text("following")
            expect(lag).to_have_text("receipts 4")
            page.screenshot(path=str(SCREENSHOTS / "connections-redis-worker-1400.png"), full_page=True)

            # The endpoint process dies: the banner turns red and names it; /health/ready 503.
            page.goto(base + "/")
            expect(status).to_have_attribute("data-state", "live", timeout=WAIT_MS)
            os.killpg(procs["endpoint"].pid, signal.SIGKILL)
            procs["endpoint"].wait(timeout=15)
            expect(status).to_have_attribute("data-state", "failing", timeout=WAIT_MS)
            expect(status).to_contain_text("replication endpoint")
            import urllib.error
            import urllib.request

            with pytest.raises(urllib.error.HTTPError) as probe:
                urllib.request.urlopen(base + "/health/ready", timeout=10)
            assert probe.value.code == 503
            page.screenshot(path=str(SCREENSHOTS / "streams-endpoint-down-1400.png"))
        finally:
            browser.close()

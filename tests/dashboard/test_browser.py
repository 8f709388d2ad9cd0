"""The streams page in a real browser: Debian's headless Chromium driven by Playwright.

``manage.py runservice`` (what ``make run`` starts) serves the test database; the browser
signs in as the superuser ``runservice`` ensured (``ADMIN_PASSWORD``), opens the streams
page, and sees positions change — without a reload — as ``manage.py write_facts`` writes
from another process; on the connections page it sees a worker connect to the replication
endpoint (another process) and leave. When the server goes away, the page says so.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testing.processes import stop_process, wait_port
from testing.services import free_port
from tests.dashboard.page_layout import layout_faults

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PASSWORD = "browser-test-password"
WAIT_MS = 30_000  # upper bound for what should happen within about a second
#: where the browser tests put their screenshots: CI keeps this directory as an artifact
#: (.ci/run names it at the end of its output; git ignores it)
SCREENSHOTS = Path(os.environ.get("SCREENSHOT_DIR", ROOT / "artifacts" / "screenshots"))

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def stop(proc: subprocess.Popen) -> None:
    """Stop the service and the children it started (its own process group)."""
    stop_process(proc, timeout=15, group=True)


@pytest.fixture
def service(pg_url, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(DATABASE_URL=pg_url, WEB_LISTEN=f"127.0.0.1:{port}", REPLICATION_LISTEN=f"127.0.0.1:{free_port()}",
               STATE_DIR=str(tmp_path / "state"), ADMIN_PASSWORD=PASSWORD, DEMO="0", PYTHONUNBUFFERED="1")
    log = open(tmp_path / "service.log", "w+")
    proc = subprocess.Popen([sys.executable, "manage.py", "runservice"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_port(port, proc, tmp_path / "service.log", timeout=60)
    except RuntimeError:
        stop(proc)
        raise
    yield f"http://127.0.0.1:{port}", proc, env
    stop(proc)
    log.close()


def write_facts(env: dict, stream: str, count: int) -> int:
    done = subprocess.run([sys.executable, "manage.py", "write_facts", stream, "--count", str(count), "--no-progress"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # (Playwright's sync API runs an event loop here: no Django ORM in this thread.)
    return int(re.search(r"position (\d+), linear", done.stdout).group(1))


def test_positions_change_live_in_a_real_browser(service, tmp_path):
    if not os.path.exists(CHROMIUM):  # fail, never skip: CI must run this
        pytest.fail(f"{CHROMIUM} not found: apt-get install chromium (.ci/run installs it)", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    base, proc, env = service
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(base + "/")
            assert "/admin/login/" in page.url  # nothing without signing in
            page.fill("#id_username", "admin")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(base + "/")
            status = page.locator("#live-status")
            expect(status).to_have_attribute("data-state", "live", timeout=WAIT_MS)
            page.evaluate("window.loadedOnce = 'yes'")  # gone if the page were reloaded

            position = page.locator('.position[data-stream="receipts"][data-writer="master"]')
            first = write_facts(env, "receipts", 5)
            expect(position).to_have_text(str(first), timeout=WAIT_MS)
            second = write_facts(env, "receipts", 7)
            assert second > first
            expect(position).to_have_text(str(second), timeout=WAIT_MS)
            expect(page.locator('.linear[data-stream="receipts"]')).to_have_text(str(second), timeout=WAIT_MS)
            assert page.evaluate("window.loadedOnce") == "yes"
            assert page.evaluate("window.liveUpdates") >= 2
            page.screenshot(path=str(SCREENSHOTS / "runservice-streams-1280.png"), full_page=True)
            assert (SCREENSHOTS / "runservice-streams-1280.png").stat().st_size > 10_000

            # The chart's day view: per-minute samples from the database, fetched once.
            page.click('[data-live="range"][data-range="day"]')
            page.wait_for_function("window.factsPerMinutePoints !== undefined", timeout=WAIT_MS)
            assert page.evaluate("window.factsPerMinuteStatus") == 200
            expect(page.locator('[data-range="day"]')).to_have_attribute("aria-pressed", "true")
            page.click('[data-live="range"][data-range="live"]')

            # At 760 px: no page is wider than the window, no table header wraps (but the nine
            # columns of job runs', between words), no word of a cell is split across lines
            # (page_layout), and every time shown has one format with the zone.
            page.set_viewport_size({"width": 760, "height": 900})
            for path in ("/", "/connections/", "/admin/"):
                page.goto(base + path)
                expect(status).to_have_attribute("data-state", "live", timeout=WAIT_MS)
                expect(page.locator('[data-live="updated"]').first).to_have_text(
                    re.compile(r"updated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"), timeout=WAIT_MS)
                assert page.evaluate("document.documentElement.scrollWidth") <= 760, path
                broken = page.evaluate("""() => [...document.querySelectorAll("th")].filter(th => {
                    if (th.closest("table.jobs")) return false;
                    const range = document.createRange(); range.selectNodeContents(th);
                    return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1;
                }).map(th => th.textContent)""")
                assert broken == [], (path, broken)
                assert layout_faults(page) == [], path
                page.screenshot(path=str(SCREENSHOTS / f"runservice-{path.strip('/') or 'streams'}-760.png"),
                                full_page=True)
            page.set_viewport_size({"width": 1280, "height": 900})

            # A worker connects to the replication endpoint (runservice's child process): the
            # connections page shows it, then its disconnect and the reason, live.
            page.goto(base + "/connections/")
            expect(status).to_have_attribute("data-state", "live", timeout=WAIT_MS)
            host, _, rport = env["REPLICATION_LISTEN"].rpartition(":")
            worker = socket.create_connection((host, int(rport)), timeout=10)
            worker.sendall(b"NAME browser-worker\nPING 1\nREPLICATE \nUSER_SYNC i1 @carol:test DEV start 1\n")
            row = page.locator(".connections tr", has_text="browser-worker")
            expect(row).to_contain_text("@carol:test", timeout=WAIT_MS)
            assert layout_faults(page) == []  # its name, address and user: whole words
            page.evaluate("window.loadedOnce = 'yes'")
            worker.shutdown(socket.SHUT_WR)  # as a stopping worker does: in order (FIN)
            gone = page.locator(".disconnects tr", has_text="browser-worker")
            expect(gone).to_contain_text("shut down", timeout=WAIT_MS)  # closed in order, not lost
            expect(row).to_have_count(0)
            worker.close()
            assert page.evaluate("window.loadedOnce") == "yes"
            page.screenshot(path=str(SCREENSHOTS / "runservice-connections-1280.png"), full_page=True)

            # A part the service needs fails (here the database loses its stream_sequences
            # table): the banner turns red with the reason, and /health/ready says 503; back
            # when the table is.
            import urllib.error
            import urllib.request

            import psycopg

            with psycopg.connect(env["DATABASE_URL"], autocommit=True) as db:
                db.execute("ALTER TABLE stream_sequences RENAME TO stream_sequences_away")
                try:
                    expect(status).to_have_attribute("data-state", "failing", timeout=WAIT_MS)
                    expect(status).to_contain_text("database")
                    with pytest.raises(urllib.error.HTTPError) as probe:
                        urllib.request.urlopen(base + "/health/ready", timeout=10)
                    assert probe.value.code == 503
                    page.screenshot(path=str(SCREENSHOTS / "runservice-database-failing-1280.png"))
                finally:
                    db.execute("ALTER TABLE stream_sequences_away RENAME TO stream_sequences")
            expect(status).to_have_attribute("data-state", "live", timeout=WAIT_MS)
            # the probe's own run of the checks (each bounded at 1 s) may come from before the
            # repair or, on a loaded machine, time out once: it turns ready within the wait
            deadline = time.monotonic() + WAIT_MS / 1000
            while True:
                try:
                    assert urllib.request.urlopen(base + "/health/ready", timeout=10).status == 200
                    break
                except urllib.error.HTTPError as e:
                    assert e.code == 503 and time.monotonic() < deadline, e
                    time.sleep(0.5)

            # The server goes away: the page says so (and keeps trying to reconnect).
            stop(proc)
            expect(status).to_have_attribute("data-state", "disconnected", timeout=WAIT_MS)
            expect(status).to_contain_text("reconnecting")
            page.screenshot(path=str(SCREENSHOTS / "runservice-disconnected-1280.png"))
        finally:
            browser.close()

"""An anonymous ``/health/ready`` flood against a real full-mode ``runservice`` (PostgreSQL,
Redis, the Celery worker beside it): the web process's threads and database connections
stay near their idle count, ``/api/`` keeps answering during it, and SIGTERM ends the
service within a few seconds (docs/security.md, "Health probes")."""
from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import psycopg
import pytest

from tests.synapse_repl.test_web_hardening import Service, _wait_for

API_TOKEN = "t" * 40
FLOOD_CLIENTS = 40
FLOOD_SECONDS = 6.0
#: The issue's goal: within +5 of the idle count after the flood.
SLACK = 5


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError(f"no Threads: line for {pid}")


def database_connections(monitor: psycopg.Connection) -> int:
    """Backends connected to the test database, the monitor's own left out (it connects once,
    before the flood: a flood that empties the server's slots must not blind it)."""
    return monitor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid()").fetchone()[0]


def status_of(url: str, timeout: float, headers: dict[str, str] | None = None) -> str:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
            return str(r.status)
    except urllib.error.HTTPError as e:
        return str(e.code)
    except OSError as e:
        return type(e).__name__


@pytest.fixture
def full_service(tmp_path, pg_url, redis_server):
    service = Service({"DATABASE_URL": pg_url, "REDIS_URL": redis_server.url, "API_TOKEN": API_TOKEN,
                       "ADMIN_USER": "ops", "ADMIN_PASSWORD": "operator-password-0123456789",
                       "REPLICATION_SECRET": "s" * 40}, tmp_path / "var")
    service.start()
    try:
        _wait_for(lambda: "ready" in service.output() and "celery@" in service.output(), "the Celery worker")
        yield service
    finally:
        service.stop()


def test_ready_flood_leaves_threads_and_connections_and_api_alone(full_service, pg_url, request):
    service, pid = full_service, full_service.proc.pid
    api = f"{service.base}/api/sync?user_id=@u:localhost"
    bearer = {"Authorization": f"Bearer {API_TOKEN}"}
    assert status_of(api, 30, bearer) == "200"
    # Idle, once a few concurrent requests have started the thread pools the process keeps
    # (at their bounded size: its working state, not what a flood leaves behind).
    warm = [threading.Thread(target=lambda: [status_of(f"{service.base}/health/ready", 30) for _ in range(3)])
            for _ in range(8)]
    for t in warm:
        t.start()
    for t in warm:
        t.join(timeout=60)
    time.sleep(2)
    monitor = psycopg.connect(pg_url, autocommit=True)
    request.addfinalizer(monitor.close)
    idle_threads, idle_connections = threads_of(pid), database_connections(monitor)

    stop = threading.Event()
    flood: Counter = Counter()
    lock = threading.Lock()

    def attacker() -> None:
        # An impatient prober: gives up after 2 s and asks again at once.
        while not stop.is_set():
            outcome = status_of(f"{service.base}/health/ready", 2)
            with lock:
                flood[outcome] += 1

    attackers = [threading.Thread(target=attacker, daemon=True) for _ in range(FLOOD_CLIENTS)]
    for t in attackers:
        t.start()
    api_during, peak_threads, peak_connections = [], idle_threads, idle_connections
    deadline = time.monotonic() + FLOOD_SECONDS
    while time.monotonic() < deadline:
        api_during.append(status_of(api, 30, bearer))
        peak_threads = max(peak_threads, threads_of(pid))
        peak_connections = max(peak_connections, database_connections(monitor))
        time.sleep(0.3)
    stop.set()
    for t in attackers:
        t.join(timeout=60)
    print(f"idle: {idle_threads} threads, {idle_connections} connections; flood peak: {peak_threads} threads, "
          f"{peak_connections} connections; probes: {dict(flood)}; /api/ during: {Counter(api_during)}")

    assert flood["200"] + flood["503"] > FLOOD_CLIENTS, dict(flood)  # the flood was served, not refused
    assert api_during and set(api_during) == {"200"}, Counter(api_during)
    # After the flood (a bounded wait for the condition; the goal is 10 s).
    _wait_for(lambda: threads_of(pid) <= idle_threads + SLACK, "the web process's threads to settle", 30)
    _wait_for(lambda: database_connections(monitor) <= idle_connections + SLACK, "database connections to settle", 30)
    print(f"after: {threads_of(pid)} threads, {database_connections(monitor)} connections")

    # SIGTERM with probes in flight: the service stops within 5 s, its children with it.
    stop.clear()
    attackers = [threading.Thread(target=attacker, daemon=True) for _ in range(FLOOD_CLIENTS)]
    for t in attackers:
        t.start()
    time.sleep(1)
    children = _descendants(pid)
    assert children, "no Celery worker under runservice"
    os.kill(pid, signal.SIGTERM)
    sent = time.monotonic()
    _wait_for(lambda: service.proc.poll() is not None, "runservice to exit after SIGTERM", 30)
    took = time.monotonic() - sent
    stop.set()
    print(f"SIGTERM to exit: {took:.1f} s")
    assert took < 5, f"runservice took {took:.1f} s to stop after SIGTERM"
    _wait_for(lambda: not [c for c in children if _alive(c)], "runservice's children to exit", 10)
    for t in attackers:
        t.join(timeout=60)


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (the supervised children run in sessions of their own)."""
    parents = {int(n): (_stat(int(n)) or ["", "0"])[1] for n in os.listdir("/proc") if n.isdigit()}
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, ppid in parents.items() if int(ppid or 0) == p]
        found += kids
        frontier += kids
    return found

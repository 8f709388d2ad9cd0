"""``/health/live`` and ``/health/ready``: unauthenticated probes that say ok/failing per part
(database, Redis when configured, this host's replication endpoint, a Celery worker) and
nothing more, against the throwaway PostgreSQL and Redis."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from dashboard import health
from dashboard.health import endpoint_key
from dashboard.models import EndpointStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _own_probe(monkeypatch):
    """Each test its own readiness probe: the process's one shares a result for a second,
    which would answer one test with the state of the one before."""
    monkeypatch.setattr(health, "readiness_probe", health.ReadinessProbe())


@pytest.fixture
def listen(settings):
    settings.REDIS_URL = ""
    settings.HEALTH_CHECK_ENDPOINT = True
    return settings.SYNAPSE_REPL["REPLICATION_LISTEN"]


def endpoint_row(listen: str, pid: int, age: float = 0.0) -> None:
    EndpointStatus.objects.update_or_create(endpoint=endpoint_key(listen), defaults={
        "server_name": "secret.example", "pid": pid,
        "updated_at": datetime.now(timezone.utc) - timedelta(seconds=age), "snapshot": {}})


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_live_answers_anonymous(client):
    response = client.get("/health/live")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_ready_when_database_and_endpoint_are_up(client, listen):
    endpoint_row(listen, pid=subprocess.os.getpid())
    response = client.get("/health/ready")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "endpoint": "ok"}}
    assert response["Cache-Control"] == "no-store"


@pytest.mark.parametrize("case", ["never started", "process gone", "silent"])
def test_not_ready_without_a_running_endpoint(client, listen, case):
    if case == "process gone":
        endpoint_row(listen, pid=dead_pid())
    elif case == "silent":
        endpoint_row(listen, pid=subprocess.os.getpid(), age=60)
    response = client.get("/health/ready")
    assert response.status_code == 503
    body = response.json()
    assert body == {"status": "failing", "checks": {"database": "ok", "endpoint": "failing"}}
    # Nothing beyond ok/failing: no host, port, process ID or server name.
    text = response.content.decode()
    for secret in (listen, socket.gethostname(), "secret.example", "process"):
        assert secret not in text


def test_endpoint_check_can_be_left_out(client, listen, settings):
    settings.HEALTH_CHECK_ENDPOINT = False
    response = client.get("/health/ready")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok"}


def test_redis_unreachable_fails_redis_and_celery(client, listen, settings):
    endpoint_row(listen, pid=subprocess.os.getpid())
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    settings.HEALTH_CHECK_CELERY = True
    response = client.get("/health/ready")
    assert response.status_code == 503
    assert response.json()["checks"] == {
        "database": "ok", "redis": "failing", "endpoint": "ok", "celery": "failing"}
    assert "127.0.0.1" not in response.content.decode()


def test_redis_up_without_a_celery_worker(client, listen, settings, redis_server):
    endpoint_row(listen, pid=subprocess.os.getpid())
    settings.REDIS_URL = redis_server.url
    settings.HEALTH_CHECK_CELERY = False
    response = client.get("/health/ready")
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {"database": "ok", "redis": "ok", "endpoint": "ok"}


def test_database_missing_its_tables_is_failing(client, listen):
    from django.db import connection

    endpoint_row(listen, pid=subprocess.os.getpid())
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE stream_sequences RENAME TO stream_sequences_away")
    try:
        response = client.get("/health/ready")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE stream_sequences_away RENAME TO stream_sequences")
    assert response.status_code == 503
    assert json.loads(response.content)["checks"]["database"] == "failing"


# --- bounded: each check, and the probes sharing one run ---------------------------------------


def _readiness_in_thread(timeout: float = 60) -> list:
    """``readiness()`` on a thread of its own (as the probe runs it), waited for at most
    ``timeout`` seconds: a check without a bound fails the test instead of hanging it."""
    import threading

    out: list = []
    worker = threading.Thread(target=lambda: out.append(health.readiness()), daemon=True)
    worker.start()
    worker.join(timeout)
    assert out, f"readiness() still running after {timeout} s"
    return out[0]


def test_a_database_statement_that_hangs_fails_within_the_statement_timeout(listen, pg_url):
    """Another session holds the table the check reads: the check gives up (PostgreSQL's
    statement_timeout) and says so, instead of waiting for the lock."""
    import psycopg

    endpoint_row(listen, pid=subprocess.os.getpid())
    with psycopg.connect(pg_url) as holder:
        holder.execute("LOCK TABLE stream_sequences IN ACCESS EXCLUSIVE MODE")
        results = {r.part: r for r in _readiness_in_thread()}
    assert not results["database"].ok
    assert "statement timeout" in results["database"].reason
    assert results["endpoint"].ok


def _backends(pg_url: str) -> set[int]:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        return {row[0] for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")}


def test_the_checks_connection_is_closed_and_the_threads_own_is_left_alone(listen, pg_url):
    from django.db import connection

    endpoint_row(listen, pid=subprocess.os.getpid())
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        mine = cursor.fetchone()[0]
    before = _backends(pg_url)
    assert mine in before
    results = health.readiness()  # on this thread, as the dashboard's feed runs it
    assert all(r.ok for r in results), results
    assert _backends(pg_url) == before
    with connection.cursor() as cursor:  # still the same session, still usable
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] == mine


def test_bounded_settings():
    from streams.dialect import bounded_settings_for

    pg = {"ENGINE": "django.db.backends.postgresql", "NAME": "db", "CONN_MAX_AGE": 60,
          "OPTIONS": {"sslmode": "require", "options": "-c search_path=app", "pool": True}}
    bounded = bounded_settings_for("postgresql", pg, 1.5)
    assert bounded["OPTIONS"] == {"sslmode": "require", "connect_timeout": 2,
                                  "options": "-c search_path=app -c statement_timeout=1500"}
    assert bounded["CONN_MAX_AGE"] == 0 and bounded["NAME"] == "db"
    assert pg["OPTIONS"]["pool"] is True and "connect_timeout" not in pg["OPTIONS"]  # a copy
    assert bounded_settings_for("postgresql", {"OPTIONS": {}}, 3.2)["OPTIONS"] == {
        "connect_timeout": 4, "options": "-c statement_timeout=3200"}
    assert bounded_settings_for("sqlite", {"OPTIONS": {"timeout": 20}}, 1.0)["OPTIONS"] == {"timeout": 1.0}


class _HeldRun:
    """The checks, held until released: how many times they ran, and when they may end."""

    def __init__(self, results=None) -> None:
        import threading

        self.release = threading.Event()
        self.runs = 0
        self.results = results or [health.Check("database", True)]

    def __call__(self):
        self.runs += 1
        assert self.release.wait(30)
        return self.results


def _probe_concurrently(probe, n: int):
    import asyncio

    async def many():
        return await asyncio.gather(*(probe.results() for _ in range(n)))

    return asyncio.run(many())


def test_concurrent_probes_share_one_run_then_its_result(listen):
    import threading

    run = _HeldRun()
    probe = health.ReadinessProbe(run, fresh_for=60, wait=30)
    threading.Timer(0.5, run.release.set).start()
    answers = _probe_concurrently(probe, 40)
    assert run.runs == 1
    assert all(a == run.results for a in answers)
    assert _probe_concurrently(probe, 40) == [run.results] * 40 and run.runs == 1  # fresh: reused


def test_a_run_that_outlasts_the_wait_answers_failing_and_is_not_started_again(listen):
    run = _HeldRun()
    probe = health.ReadinessProbe(run, fresh_for=60, wait=0.2)
    try:
        for _ in range(3):
            answers = _probe_concurrently(probe, 10)
            assert all(health.public_view(a) == {"status": "failing", "checks": {"database": "failing", "endpoint": "failing"}}
                       for a in answers)
        assert run.runs == 1 and probe.runs == 1
    finally:
        run.release.set()


def test_a_check_that_raises_is_a_failing_answer(listen):
    def broken():
        raise RuntimeError("no\nluck")

    probe = health.ReadinessProbe(broken, wait=30)
    [answer] = _probe_concurrently(probe, 1)
    assert answer == [health.Check("readiness", False, "readiness checks: no luck")]

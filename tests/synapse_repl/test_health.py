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

from dashboard.models import EndpointStatus
from synapse_repl import health
from synapse_repl.health import endpoint_key

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

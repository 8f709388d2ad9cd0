"""Is this process ready to serve: the parts it depends on, each ok or failing.

``/health/live`` answers 200 while the process answers at all (liveness: restart me if not);
``/health/ready`` runs :func:`readiness` and answers 200 when every part is ok, 503 otherwise
(readiness: send me no traffic). Both are unauthenticated, as load balancers and Kubernetes
probes expect, so they reveal nothing but ``ok``/``failing`` per part; the reasons (which may
name hosts) go only to the staff dashboard's Live banner, through the live feed.

The parts: the database (answers and is migrated far enough to hold ``stream_sequences``),
Redis when ``REDIS_URL`` is set, this host's replication endpoint (``REPLICATION_LISTEN``:
its status row is fresh and its process alive), and a Celery worker when Redis carries the
jobs (a worker answers a ping).
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from streams.id_store import pid_alive

from .startup import _one_line, ping_redis

#: Seconds a check may take (a probe that hangs is itself a failure).
CHECK_TIMEOUT = 1.0


@dataclass(frozen=True)
class Check:
    part: str
    ok: bool
    reason: str = ""


def check_database() -> Check:
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM stream_sequences LIMIT 1")
            cursor.fetchall()
    except Exception as e:
        connection.close()
        return Check("database", False, f"database: {_one_line(e)}")
    return Check("database", True)


def check_redis(url: str) -> Check:
    try:
        ping_redis(url, CHECK_TIMEOUT)
    except Exception as e:
        return Check("redis", False, f"Redis unreachable: {_one_line(e)}")
    return Check("redis", True)


def endpoint_key(listen: str, host: str | None = None) -> str:
    """The status row key the endpoint listening on ``listen`` on this host writes
    (dashboard.endpoint_status.start_publishing)."""
    address, _, port = listen.rpartition(":")
    return f"{host or socket.gethostname()} {address.strip('[]')}:{port}"


def check_endpoint(listen: str, now: datetime | None = None) -> Check:
    from dashboard.endpoint_status import STALE_AFTER_SECONDS
    from dashboard.models import EndpointStatus

    now = now or datetime.now(timezone.utc)
    try:
        row = EndpointStatus.objects.filter(endpoint=endpoint_key(listen)).first()
    except Exception:
        return Check("endpoint", False, "replication endpoint: its status cannot be read (database)")
    if row is None:
        return Check("endpoint", False, f"replication endpoint on {listen} has not started")
    if not pid_alive(row.pid):
        return Check("endpoint", False, f"replication endpoint on {listen} is down (process {row.pid} gone)")
    age = (now - row.updated_at).total_seconds()
    if age > STALE_AFTER_SECONDS:
        return Check("endpoint", False, f"replication endpoint on {listen} silent for {age:.0f} s")
    return Check("endpoint", True)


def check_celery() -> Check:
    from .celery import app

    try:
        replies = app.control.ping(timeout=CHECK_TIMEOUT)
    except Exception as e:
        return Check("celery", False, f"Celery: {_one_line(e)}")
    if not replies:
        return Check("celery", False, "no Celery worker answers (jobs will not run)")
    return Check("celery", True)


def configured_checks() -> list[Callable[[], Check]]:
    """The checks this process's settings call for (sync: each may block up to
    :data:`CHECK_TIMEOUT`)."""
    from django.conf import settings

    from streams.conf import repl_setting

    checks: list[Callable[[], Check]] = [check_database]
    if settings.REDIS_URL:
        checks.append(lambda: check_redis(settings.REDIS_URL))
    listen = repl_setting("REPLICATION_LISTEN")
    if settings.HEALTH_CHECK_ENDPOINT and listen:
        checks.append(lambda: check_endpoint(listen))
    if settings.REDIS_URL and settings.HEALTH_CHECK_CELERY:
        checks.append(check_celery)
    return checks


def readiness() -> list[Check]:
    """Every configured check's result. A Redis that fails skips the Celery ping (it would
    only wait for the same broker)."""
    results: list[Check] = []
    for check in configured_checks():
        if check is check_celery and any(r.part == "redis" and not r.ok for r in results):
            results.append(Check("celery", False, "Celery: its broker (Redis) is unreachable"))
            continue
        results.append(check())
    return results


def public_view(results: list[Check]) -> dict:
    """What an unauthenticated probe may see: ok/failing per part, nothing more."""
    return {
        "status": "ok" if all(r.ok for r in results) else "failing",
        "checks": {r.part: "ok" if r.ok else "failing" for r in results},
    }


def banner_view(results: list[Check]) -> dict:
    """What the staff dashboard's banner shows: the public view plus the reasons."""
    return {**public_view(results), "reasons": [r.reason for r in results if not r.ok]}


def live_view(request):
    """Liveness: this process answers (nothing else is checked: a database outage must not
    get every web process restarted)."""
    from django.http import JsonResponse

    return JsonResponse({"status": "ok"})


def ready_view(request):
    """Readiness: 200 when every configured part is ok, else 503; ok/failing per part only."""
    from django.http import JsonResponse

    body = public_view(readiness())
    response = JsonResponse(body, status=200 if body["status"] == "ok" else 503)
    response["Cache-Control"] = "no-store"
    return response

"""Is this process ready to serve: the parts it depends on, each ok or failing.

``/health/live`` answers 200 while the process answers at all (liveness: restart me if not);
``/health/ready`` answers 200 when every part is ok, 503 otherwise (readiness: send me no
traffic). Both are unauthenticated, as load balancers and Kubernetes probes expect, so they
reveal nothing but ``ok``/``failing`` per part; the reasons (which may name hosts) go only to
the staff dashboard's Live banner, through the live feed.

The parts: the database (answers and is migrated far enough to hold ``stream_sequences``),
Redis when ``REDIS_URL`` is set, this host's replication endpoint (``REPLICATION_LISTEN``:
its status row is fresh and its process alive), and a Celery worker when Redis carries the
jobs (a worker answers a ping).

Probes are cheap and bounded, whoever sends them and however many (docs/security.md, "Health
probes"): :data:`readiness_probe` runs the checks at most once at a time in this process, on
a thread of its own, and its result answers every probe for :data:`READY_FRESH_SECONDS`
(:mod:`common.single_flight` decides); each check has a timeout; the checks use a
database connection of their own, closed as soon as they are done; the view is async, so a
waiting probe runs nothing and holds no database connection (Django's middleware still takes a
thread per request under ASGI, for the request's duration, whatever the URL).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterator

from common.error_text import one_line as _one_line
from common.redis_ping import ping_redis
from common.single_flight import Reuse, SingleFlight, Start
from dashboard.endpoint_status import STALE_AFTER_SECONDS
from dashboard.models import EndpointStatus
from streams.conf import repl_setting
from streams.dialect import bounded_settings
from streams.id_store import pid_alive

#: Seconds a check may take (a probe that hangs is itself a failure): Redis's connect and
#: reply, the Celery ping, each database statement. PostgreSQL's connect takes whole seconds,
#: at least 2 (libpq's ``connect_timeout``).
CHECK_TIMEOUT = 1.0
#: Seconds one run of the checks answers every probe for: a flood of probes costs one run a
#: second, while a part that goes down shows within about a second.
READY_FRESH_SECONDS = 1.0
#: Seconds a probe waits for the run in flight; past that it answers 503, every part failing
#: (a process that cannot tell within this is not ready).
READY_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class Check:
    part: str
    ok: bool
    reason: str = ""


@contextlib.contextmanager
def bounded_database(timeout: float = CHECK_TIMEOUT) -> Iterator[None]:
    """Within the block, this thread's default database connection is one of its own, with
    :func:`streams.dialect.bounded_settings`; it is closed at the end of the block and the thread's previous
    connection (untouched, whatever it holds) is back: the checks hold no connection past
    their answer."""
    from django.db import connections

    previous = connections["default"]
    bounded = type(previous)(bounded_settings("default", timeout), "default")
    connections["default"] = bounded
    try:
        yield
    finally:
        try:
            bounded.close()
        finally:
            connections["default"] = previous


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
    # deferred: Celery's imports (0.3 CPU-s) only in a process whose settings call for this check
    from jobs.celery_app import app

    try:
        # limit=1: the first worker's answer is enough (without it, every ping waits the timeout)
        replies = app.control.ping(timeout=CHECK_TIMEOUT, limit=1)
    except Exception as e:
        return Check("celery", False, f"Celery: {_one_line(e)}")
    if not replies:
        return Check("celery", False, "no Celery worker answers (jobs will not run)")
    return Check("celery", True)


def configured_checks() -> list[tuple[str, Callable[[], Check]]]:
    """The parts this process's settings call for, each with its check (sync: each may block
    up to :data:`CHECK_TIMEOUT`, the database's connect a little longer)."""
    from django.conf import settings

    checks: list[tuple[str, Callable[[], Check]]] = [("database", check_database)]
    if settings.REDIS_URL:
        checks.append(("redis", lambda: check_redis(settings.REDIS_URL)))
    listen = repl_setting("REPLICATION_LISTEN")
    if settings.HEALTH_CHECK_ENDPOINT and listen:
        checks.append(("endpoint", lambda: check_endpoint(listen)))
    if settings.REDIS_URL and settings.HEALTH_CHECK_CELERY:
        checks.append(("celery", check_celery))
    return checks


def readiness() -> list[Check]:
    """Every configured check's result, on a database connection of their own
    (:func:`bounded_database`). A Redis that fails skips the Celery ping (it would only wait
    for the same broker)."""
    results: list[Check] = []
    with bounded_database():
        for part, check in configured_checks():
            if part == "celery" and any(r.part == "redis" and not r.ok for r in results):
                results.append(Check("celery", False, "Celery: its broker (Redis) is unreachable"))
                continue
            results.append(check())
    return results


def unanswered(wait: float) -> list[Check]:
    """Every configured part failing: the checks did not answer within ``wait`` seconds."""
    return [Check(part, False, f"{part}: the readiness checks did not answer within {wait:g} s")
            for part, _check in configured_checks()]


class ReadinessProbe:
    """This process's readiness, shared by every concurrent probe: at most one run of
    ``run`` at a time, on a daemon thread of its own (a run that hangs never holds up the
    process's exit), and a run's result answers every probe for ``fresh_for`` seconds
    (:class:`~common.single_flight.SingleFlight` decides). A probe waits at most ``wait``
    seconds for the run in flight."""

    def __init__(self, run: Callable[[], list[Check]] = readiness, *, fresh_for: float = READY_FRESH_SECONDS,
                 wait: float = READY_WAIT_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.run, self.wait, self.clock = run, wait, clock
        self._flight: SingleFlight[list[Check]] = SingleFlight(fresh_for)
        self._lock = threading.Lock()
        self._in_flight: concurrent.futures.Future[list[Check]] | None = None
        #: runs started so far (what a flood of probes cost)
        self.runs = 0

    async def results(self) -> list[Check]:
        with self._lock:
            step = self._flight.next_step(self.clock())
            if isinstance(step, Reuse):
                return step.result
            if isinstance(step, Start):
                self._in_flight = self._start()
            in_flight = self._in_flight
        assert in_flight is not None  # Start set it, and Join follows a Start
        try:
            # Only this probe's view of the run is cancelled on timeout (or when the probe
            # goes away): the run itself is RUNNING and cannot be, others still wait for it.
            return await asyncio.wait_for(asyncio.wrap_future(in_flight), self.wait)
        except asyncio.TimeoutError:
            return unanswered(self.wait)

    def _start(self) -> concurrent.futures.Future[list[Check]]:
        future: concurrent.futures.Future[list[Check]] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        self.runs += 1
        threading.Thread(target=self._run, args=(future,), name="readiness-checks", daemon=True).start()
        return future

    def _run(self, future: concurrent.futures.Future[list[Check]]) -> None:
        try:
            results = self.run()
        except Exception as e:  # a check that raises is a failing part, never a probe left waiting
            results = [Check("readiness", False, f"readiness checks: {_one_line(e)}")]
        with self._lock:
            self._flight.finished(results, self.clock())
        future.set_result(results)


#: The one probe of this process (every ``/health/ready`` shares it).
readiness_probe = ReadinessProbe()


def public_view(results: list[Check]) -> dict:
    """What an unauthenticated probe may see: ok/failing per part, nothing more."""
    return {
        "status": "ok" if all(r.ok for r in results) else "failing",
        "checks": {r.part: "ok" if r.ok else "failing" for r in results},
    }


def banner_view(results: list[Check]) -> dict:
    """What the staff dashboard's banner shows: the public view plus the reasons."""
    return {**public_view(results), "reasons": [r.reason for r in results if not r.ok]}


async def live_view(request):
    """Liveness: this process answers (nothing else is checked: a database outage must not
    get every web process restarted). Async, like :func:`ready_view`: the view holds no thread."""
    from django.http import JsonResponse

    return JsonResponse({"status": "ok"})


async def ready_view(request):
    """Readiness: 200 when every configured part is ok, else 503; ok/failing per part only
    (the result :data:`readiness_probe` shares)."""
    from django.http import JsonResponse

    body = public_view(await readiness_probe.results())
    response = JsonResponse(body, status=200 if body["status"] == "ok" else 503)
    response["Cache-Control"] = "no-store"
    return response

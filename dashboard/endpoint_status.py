"""Publishing a replication endpoint's connections to the other processes (through the
database), and reading them back.

The endpoint runs in its own process (``runreplication``); on the embedded default it
shares no channel layer with the web process, so its snapshot goes to the
``dashboard_endpoint_status`` table: written when it changes (checked every
:data:`PUBLISH_INTERVAL`) and at least every :data:`HEARTBEAT_SECONDS`; a row not refreshed
for :data:`STALE_AFTER_SECONDS` belongs to an endpoint that stopped or hangs.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from django.dispatch import receiver

from dashboard.facts_history import minute_of, record_minute
from dashboard.models import EndpointStatus
from dashboard.process_stats import process_stats
from replication.endpoint.connection_records import endpoint_started

logger = logging.getLogger(__name__)

PUBLISH_INTERVAL = 0.5
HEARTBEAT_SECONDS = 5.0
STALE_AFTER_SECONDS = 15.0
#: Rows of endpoints silent for longer than this are no longer shown.
FORGET_AFTER = timedelta(hours=1)


@receiver(endpoint_started, dispatch_uid="dashboard.endpoint_status")
def start_publishing(sender: Any, endpoint: Any, host: str, port: int, **kwargs: Any) -> None:
    key = f"{socket.gethostname()} {host}:{port}"
    endpoint.status_publisher = asyncio.get_running_loop().create_task(
        publish_loop(key, endpoint), name="endpoint-status")


async def publish_loop(key: str, endpoint: Any, interval: float = PUBLISH_INTERVAL) -> None:
    last: dict[str, Any] | None = None
    last_at = 0.0
    recorded_minute: datetime | None = None
    loop = asyncio.get_running_loop()
    # One thread of its own, keeping its database connection from one write to the next:
    # while workers are fed the snapshot changes at every write, and a new connection each
    # time (a pool thread's, closed after use) was a third of the endpoint's CPU at 10,000
    # facts/s, beside a PostgreSQL backend started each time (docs/benchmarks.md).
    # deferred: every process loads this module at start-up (its receiver), the endpoint's stack
    # (0.6 s of imports) only a process that runs an endpoint needs, and only this loop uses it
    from replication.endpoint.server import endpoint_snapshot

    executor = ThreadPoolExecutor(1, thread_name_prefix="endpoint-status")

    def in_thread(func: Callable[..., Any], *args: Any) -> Any:
        return loop.run_in_executor(executor, _closing_on_error, func, *args)

    try:
        while True:
            snapshot = endpoint_snapshot(endpoint)
            now = loop.time()
            # The endpoint runs as long as the service does: it keeps the facts/s history going
            # while no page is open (dashboard.facts_history).
            if recorded_minute != minute_of(datetime.now(timezone.utc)):
                try:
                    recorded_minute = await in_thread(record_minute)
                except Exception:
                    logger.exception("could not record the facts per minute")
            if snapshot != last or now - last_at >= HEARTBEAT_SECONDS:
                try:
                    await in_thread(save, key, endpoint.server_name, snapshot)
                    last, last_at = snapshot, now
                except Exception:
                    logger.exception("could not record the endpoint status")
            await asyncio.sleep(interval)
    finally:
        executor.submit(_close_connection)  # the thread's, once it is done with any write
        executor.shutdown(wait=False)


def _closing_on_error(func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)``; a failure closes this thread's connection, so the next call opens a
    new one (the database may have restarted)."""
    try:
        return func(*args)
    except Exception:
        _close_connection()
        raise


def _close_connection() -> None:
    from django.db import connection

    connection.close()


def save(key: str, server_name: str, snapshot: dict[str, Any]) -> None:
    """The endpoint's row, as one UPDATE (an INSERT the first time)."""
    from django.db import IntegrityError, transaction

    values = {"server_name": server_name, "pid": os.getpid(), "updated_at": datetime.now(timezone.utc),
              # what the process costs, refreshed with the row (at least every HEARTBEAT_SECONDS)
              "snapshot": {**snapshot, "process": process_stats()}}
    if EndpointStatus.objects.filter(endpoint=key).update(**values):
        return
    try:
        with transaction.atomic():
            EndpointStatus.objects.create(endpoint=key, **values)
    except IntegrityError:  # another process of the same key wrote it meanwhile
        EndpointStatus.objects.filter(endpoint=key).update(**values)


def endpoint_statuses(now: datetime | None = None) -> list[dict[str, Any]]:
    """Every endpoint heard of within the last hour, with its snapshot and whether it is stale."""

    now = now or datetime.now(timezone.utc)
    result = []
    for row in EndpointStatus.objects.filter(updated_at__gte=now - FORGET_AFTER).order_by("endpoint"):
        age = (now - row.updated_at).total_seconds()
        result.append({
            "endpoint": row.endpoint, "server_name": row.server_name, "pid": row.pid,
            "updated_at": row.updated_at.timestamp(), "age_seconds": round(age, 1),
            "stale": age > STALE_AFTER_SECONDS, **row.snapshot,
        })
    return result

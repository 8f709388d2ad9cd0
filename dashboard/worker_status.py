"""Replication workers reporting where they stand (``dashboard_worker_status``), and their lag.

A worker following over Redis is invisible to the endpoints, and Synapse's channel must carry
only what Synapse sends, so each ``replication_worker`` writes its positions to the database
every :data:`PUBLISH_SECONDS`. A worker's lag on a stream is how many IDs the writers'
positions are ahead of the tokens it applied (summed over the stream's writers).
"""
from __future__ import annotations

import asyncio
import logging
import os
from datetime import datetime, timedelta, timezone
from typing import Any

from asgiref.sync import sync_to_async

from dashboard.models import WorkerStatus
from dashboard.process_stats import process_stats
from streams.stream_status import stream_status

logger = logging.getLogger(__name__)

PUBLISH_SECONDS = 2.0
STALE_AFTER_SECONDS = 15.0
FORGET_AFTER = timedelta(hours=1)


def save(name: str, transport: str, connected: bool, positions: dict[tuple[str, str], int]) -> None:
    from django.db import connection

    nested: dict[str, dict[str, int]] = {}
    for (stream, writer), token in positions.items():
        nested.setdefault(stream, {})[writer] = token
    try:
        WorkerStatus.objects.update_or_create(name=name, defaults={
            "transport": transport, "pid": os.getpid(), "connected": connected,
            "updated_at": datetime.now(timezone.utc), "positions": nested, "process": process_stats()})
    finally:
        connection.close()  # a pool thread may not come back to it


async def publish_loop(worker: Any, transport: str, interval: float = PUBLISH_SECONDS) -> None:
    """Run beside the worker: record its positions until cancelled."""
    failed = False
    while True:
        try:
            await sync_to_async(save, thread_sensitive=False)(worker.name, transport, bool(worker.connected),
                                                              worker.positions())
            failed = False
        except Exception as exc:
            if not failed:  # once per outage, not every tick
                logger.warning("replication worker %s: could not record its status: %s", worker.name, exc)
            failed = True
        await asyncio.sleep(interval)


def lag(worker_positions: dict[str, dict[str, int]], writer_positions: dict[str, dict[str, int]]) -> dict[str, int]:
    """Per stream the worker follows: IDs written that it has not applied yet."""
    result = {}
    for stream, applied in worker_positions.items():
        writers = writer_positions.get(stream, {})
        result[stream] = sum(max(0, abs(pos) - abs(applied.get(writer, 0))) for writer, pos in writers.items())
    return result


def worker_statuses(now: datetime | None = None) -> list[dict[str, Any]]:
    """Every worker heard of within the last hour, with its lag per stream and whether it is stale."""

    now = now or datetime.now(timezone.utc)
    rows = list(WorkerStatus.objects.filter(updated_at__gte=now - FORGET_AFTER).order_by("name"))
    if not rows:
        return []
    writers = {s.name: dict(s.positions) for s in stream_status() if s.db_backed}
    result = []
    for row in rows:
        age = (now - row.updated_at).total_seconds()
        result.append({"name": row.name, "transport": row.transport, "pid": row.pid, "connected": row.connected,
                       "age_seconds": round(age, 1), "stale": age > STALE_AFTER_SECONDS,
                       "positions": row.positions, "lag": lag(row.positions, writers), "process": row.process})
    return result

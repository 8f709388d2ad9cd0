"""Facts per minute kept in the database (``dashboard_facts_per_minute``), at least a day.

Once a minute a process records every database-backed stream's facts total (its highest
completed stream ID, as /metrics counts it); the rate of a minute is the difference with the
previous sample. Several processes may record the same minute: the first row wins (a unique
constraint), so the table holds one sample per stream and minute whoever runs.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from dashboard.models import FactsPerMinute
from streams.stream_status import stream_status

#: Samples older than this are deleted (more than the day the issue asks for).
RETENTION = timedelta(hours=25)


def minute_of(when: datetime) -> datetime:
    return when.astimezone(timezone.utc).replace(second=0, microsecond=0)


def stream_totals() -> dict[str, int]:
    return {s.name: max((abs(p) for p in s.positions.values()), default=0)
            for s in stream_status() if s.db_backed}


def record_minute(now: datetime | None = None, totals: dict[str, int] | None = None) -> datetime:
    """Record this minute's totals (once per minute and stream whoever calls) and prune."""

    minute = minute_of(now or datetime.now(timezone.utc))
    totals = stream_totals() if totals is None else totals
    FactsPerMinute.objects.bulk_create(
        [FactsPerMinute(stream=name, minute=minute, facts_total=total) for name, total in totals.items()],
        ignore_conflicts=True)
    FactsPerMinute.objects.filter(minute__lt=minute - RETENTION).delete()
    return minute


def facts_per_minute(since: datetime) -> list[dict[str, Any]]:
    """Facts/s per stream for each recorded minute after ``since``: ``{"t": unix seconds,
    "rates": {stream: facts/s}}``, averaged since the stream's previous sample (a gap
    while nothing recorded is spread over its minutes, not shown as a spike)."""

    rows = FactsPerMinute.objects.filter(minute__gte=minute_of(since) - timedelta(minutes=1)).order_by("minute", "stream")
    previous: dict[str, tuple[datetime, int]] = {}
    points: dict[datetime, dict[str, float]] = {}
    for row in rows.iterator():
        before = previous.get(row.stream)
        previous[row.stream] = (row.minute, row.facts_total)
        if before is None:
            continue
        seconds = (row.minute - before[0]).total_seconds()
        points.setdefault(row.minute, {})[row.stream] = round(max(0, row.facts_total - before[1]) / seconds, 2)
    return [{"t": minute.timestamp(), "rates": rates} for minute, rates in sorted(points.items())]

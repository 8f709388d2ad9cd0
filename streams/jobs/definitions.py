"""The jobs the runner knows, each: read (io) -> compute (pure) -> write or compare."""
from __future__ import annotations

from typing import Any, Sequence

from pyspark.sql import functions as F

from . import io
from .consistency import ordering_differences
from .runner import Outcome, SAMPLE_LIMIT, register
from .topology import topological_ordering

#: the event's own declared depth, read from the stored JSON by the database
_DECLARED_DEPTH = {
    "postgresql": "(convert_from(json, 'UTF8')::jsonb ->> 'depth')::bigint",
    "sqlite": "CAST(json_extract(CAST(json AS TEXT), '$.depth') AS INTEGER)",
}


def _events_query(vendor: str) -> io.Query:
    return io.Query(
        columns=("room_id", "event_id", "stream_ordering", "depth", "topological_ordering"),
        source=f"(SELECT room_id, event_id, stream_ordering, topological_ordering, "
               f"{_DECLARED_DEPTH[vendor]} AS depth FROM events) AS ev",
        schema="room_id string, event_id string, stream_ordering long, depth long, topological_ordering long",
        partition_column="stream_ordering",
    )


EDGES = io.Query(
    columns=("room_id", "event_id", "prev_event_id", "id"),
    source="event_edges",
    schema="room_id string, event_id string, prev_event_id string, id long",
    partition_column="id",
)


def _vendor() -> str:
    from django.db import connection

    return connection.vendor


def _orderings(spark: Any, rooms: Sequence[str] | None):
    events = io.read(spark, _events_query(_vendor()), rooms).cache()
    edges = io.read(spark, EDGES, rooms)
    return events, topological_ordering(events, edges)


@register("topological_ordering")
def recompute_topological_ordering(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    """Recompute every event's topological ordering and swap the changed ones in."""
    events, result = _orderings(spark, rooms)
    stage = io.Staging.create("topo", [("event_id", "text"), ("topological_ordering", "bigint")])
    try:
        written = stage.write(result)
        changed, _ = io.swap_in([
            (f"UPDATE events SET topological_ordering = s.topological_ordering, depth = s.topological_ordering "
             f"FROM {stage.name} AS s WHERE events.event_id = s.event_id "
             f"AND events.topological_ordering <> s.topological_ordering", ()),
            (f"UPDATE room_memberships SET topological_ordering = s.topological_ordering "
             f"FROM {stage.name} AS s WHERE room_memberships.event_id = s.event_id "
             f"AND room_memberships.topological_ordering <> s.topological_ordering", ()),
        ])
    finally:
        stage.drop()
    rows_in = events.count()
    events.unpersist()
    return Outcome(rows_in=rows_in, rows_out=max(changed, 0), differences=None)


@register("check_topological_ordering")
def check_topological_ordering(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    """Compare recomputed orderings with the stored ones; write nothing."""
    events, result = _orderings(spark, rooms)
    stored = events.select("room_id", "event_id", "topological_ordering")
    diffs = ordering_differences(result, stored).cache()
    n = diffs.count()
    sample = [r.asDict() for r in diffs.orderBy("room_id", "event_id").limit(SAMPLE_LIMIT).collect()]
    rows_in = events.count()
    diffs.unpersist()
    events.unpersist()
    return Outcome(rows_in=rows_in, rows_out=0, differences=n, sample=sample)

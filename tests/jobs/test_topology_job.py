"""The ordering jobs read only the events that stray from their declared depth, plus the rooms
with an event without a depth, whole (their walk needs every event): both kinds in one run,
on both databases, against orderings worked out here from ``event_edges``."""
from __future__ import annotations

import json

import pytest
from django.db import connection

from jobs.models import JobRun
from jobs.runner import run_job
from rooms.storage.plan_snapshot import LATE_ALWAYS
from rooms.storage.synthetic import RoomBuilder
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, rows, store  # noqa: F401

A, B = "@a:hs", "@b:hs"


def _room(room_id: str) -> list[tuple[str, bytes]]:
    b = RoomBuilder(room_id, server="hs")
    return [b.create(A), b.member(A, "join"), b.message(A, "one"), b.member(B, "join"), b.message(B, "two"),
            b.message(A, "three")]


def _walked(room_id: str) -> dict[str, int]:
    """1 + the largest ordering of an event's prev events in the room, 1 without any."""
    events = [e for (e,) in rows("SELECT event_id FROM events WHERE room_id = %s", room_id)]
    prevs: dict[str, list[str]] = {e: [] for e in events}
    for e, p in rows("SELECT event_id, prev_event_id FROM event_edges WHERE room_id = %s", room_id):
        if p in prevs:
            prevs[e].append(p)
    memo: dict[str, int] = {}

    def order(e: str) -> int:
        if e not in memo:
            memo[e] = 1 + max((order(p) for p in prevs[e]), default=0)
        return memo[e]

    return {e: order(e) for e in events}


@ON_BOTH_DATABASES
@pytest.mark.parametrize("default_database", ["postgresql", "sqlite"], indirect=True)
def test_strayed_events_and_rooms_without_depths_in_one_run(store, spark):
    walked_room, other_room, untouched_room = "!nodepth:hs", "!strayed:hs", "!untouched:hs"
    for room in (walked_room, other_room, untouched_room):
        store.persist(*(raw for _, raw in _room(room)))
    stored = dict(rows("SELECT event_id, topological_ordering FROM events"))
    # the walked room's events lose their depth (the old unsigned format) and their orderings
    # move off what the walk gives; one event of the other room strays from its depth
    with connection.cursor() as cursor:
        for event_id, raw in rows("SELECT event_id, json FROM events WHERE room_id = %s", walked_room):
            body = json.loads(bytes(raw))
            del body["depth"]
            cursor.execute("UPDATE events SET json = %s, topological_ordering = topological_ordering + 10 "
                           "WHERE event_id = %s", [json.dumps(body).encode(), event_id])
        victim = rows("SELECT event_id FROM events WHERE room_id = %s ORDER BY stream_ordering DESC", other_room)[0][0]
        cursor.execute("UPDATE events SET topological_ordering = topological_ordering + 1000 WHERE event_id = %s",
                       [victim])
    late = "SELECT room_id, late_stream FROM rooms ORDER BY room_id"
    assert {late_stream for _, late_stream in rows(late)} == {None}
    expected = {**stored, **_walked(walked_room)}
    wrong = {e: t for e, t in rows("SELECT event_id, topological_ordering FROM events") if expected[e] != t}
    assert victim in wrong and len(wrong) == 7

    check = run_job("check_topological_ordering")
    assert check.status == JobRun.Status.SUCCEEDED, check.error
    assert check.rows_in == 18 and check.differences == len(wrong)
    assert {(d["event_id"], int(d["expected"]), int(d["found"])) for d in check.difference_sample} == {
        (e, expected[e], t) for e, t in wrong.items()}

    fix = run_job("topological_ordering")
    assert fix.status == JobRun.Status.SUCCEEDED, fix.error
    assert fix.rows_in == 18 and fix.rows_out == len(wrong)
    assert dict(rows("SELECT event_id, topological_ordering FROM events")) == expected
    # the rooms whose orderings moved are walked by every incremental sync from now on
    assert rows(late) == [(walked_room, LATE_ALWAYS), (other_room, LATE_ALWAYS), (untouched_room, None)]
    assert run_job("check_topological_ordering").differences == 0


@pytest.mark.django_db
def test_the_strayed_read_parses_each_events_json_once():
    """PostgreSQL pulls a subquery's columns up as expressions wherever the outer query names
    them: the strayed read's filter names ``depth`` four times, and PostgreSQL parsed every
    event's JSON four times (docs/benchmarks.md, the ordering jobs). With the partitions' stream
    bounds the read must still be an index scan of ``events``, the JSON parsed in one place."""
    from jobs.definitions import _strayed_query
    from jobs.job_dialect import for_database

    dialect = for_database()
    assert dialect.name == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")  # an empty table: the plan an indexed 10 M one gets
        cursor.execute(f"EXPLAIN (VERBOSE) SELECT * FROM {_strayed_query(dialect).source} "
                       "WHERE stream_ordering >= 1 AND stream_ordering < 100")
        plan = "\n".join(r[0] for r in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert plan.count("convert_from(") == 1, plan
    assert "Index Cond: ((e.stream_ordering >= 1) AND (e.stream_ordering < 100))" in plan, plan

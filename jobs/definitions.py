"""The built-in jobs (listed by name in ``registry``), each: read (io) -> compute (pure) -> write
or compare."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from pyspark.sql import functions as F

from jobs import io
from jobs.chain_cover_job import chain_cover, chain_cover_differences
from jobs.consistency import ordering_differences
from jobs.job_dialect import JobDialect, for_database
from jobs.outcome import Outcome, counted_sample
from jobs.topology import MAX_DEPTH, rooms_frame, topological_ordering
from jobs.visibility_job import visibility_differences, visibility_ranges
from rooms.storage.plan_snapshot import LATE_ALWAYS


def _events_query(dialect: JobDialect) -> io.Query:
    return io.Query(
        columns=("room_id", "event_id", "stream_ordering", "depth", "topological_ordering"),
        source=f"{dialect.events_with_depth} AS ev",
        schema="room_id string, event_id string, stream_ordering long, depth long, topological_ordering long",
        partition_column="stream_ordering",
    )


def _strayed_query(dialect: JobDialect) -> io.Query:
    """The events whose stored ordering is not their declared depth, and those without one:
    the only rows the job can change. The database compares while it scans (it parses each
    event's JSON for its depth either way), so the rows that hold, nearly all, never travel.
    The partitions split ``events``' stream orderings: each scans its share once."""
    clamped = f"CASE WHEN depth < 0 THEN 0 WHEN depth > {MAX_DEPTH} THEN {MAX_DEPTH} ELSE depth END"
    return io.Query(
        columns=("room_id", "event_id", "stream_ordering", "depth", "topological_ordering"),
        source=f"(SELECT * FROM {dialect.events_with_depth} AS e WHERE depth IS NULL "
               f"OR topological_ordering IS NULL OR topological_ordering <> {clamped}) AS ev",
        schema="room_id string, event_id string, stream_ordering long, depth long, topological_ordering long",
        partition_column="stream_ordering",
        # the query's own bounds would parse every event's JSON once more (a second scan)
        bounds_source="events",
    )


#: the edges, each with its event's stream ordering: the numeric column the read is split on
#: (``event_edges`` has no ``id`` since migration 0011). The room is the event's (the same as
#: the edge's): a read of some rooms' edges then starts from ``events``' room index, where
#: ``event_edges`` has none and each partition scanned all of it (1.4 GB of rows at 10 M events).
EDGES = io.Query(
    columns=("room_id", "event_id", "prev_event_id", "stream_ordering"),
    source="(SELECT e.room_id, x.event_id, x.prev_event_id, e.stream_ordering "
           "FROM event_edges x JOIN events e ON e.event_id = x.event_id) AS edges",
    schema="room_id string, event_id string, prev_event_id string, stream_ordering long",
    partition_column="stream_ordering",
)


#: above this many rooms to walk, the edges are read whole and filtered in Spark
WALK_ROOMS_IN_SQL = 1000


def count_events(rooms: Sequence[str] | None, state_only: bool = False) -> int:
    """The events a job examines (its ``rows_in``): all, or ``rooms``' events; only state
    events with ``state_only``. Inside a check's consistent cut, those of the cut."""
    source = "(SELECT room_id FROM events WHERE state_key IS NOT NULL) AS e" if state_only else "events"
    return io.scalar(io.Query.select("count(*)", source, rooms, io.quote))


@contextmanager
def _orderings(spark: Any, rooms: Sequence[str] | None) -> Iterator[tuple[Any, Any]]:
    """(the events read with their stored ordering, the recomputed orderings of those events),
    cached while inside.

    Only the strayed events are read (:func:`_strayed_query`), and the rooms with an event
    without a declared depth (usually none) whole, with their edges: their walk needs every
    event of the room."""
    dialect = for_database()
    strayed = io.read(spark, _strayed_query(dialect), rooms).cache()
    try:
        walk = sorted(r.room_id for r in strayed.where(F.col("depth").isNull()).select("room_id").distinct().collect())
        if not walk:
            with topological_ordering(strayed, None) as result:
                yield strayed, result
            return
        in_sql = walk if len(walk) <= WALK_ROOMS_IN_SQL else rooms
        walked = rooms_frame(spark, walk)
        whole = io.read(spark, _events_query(dialect), in_sql).join(walked, on="room_id", how="left_semi")
        events = strayed.join(walked, on="room_id", how="left_anti").unionByName(whole).cache()
        try:
            edges = io.read(spark, EDGES, in_sql)
            with topological_ordering(events, edges, walk) as result:
                yield events, result
        finally:
            events.unpersist()
    finally:
        strayed.unpersist()


ORDERING_COLUMNS = [("event_id", "text"), ("topological_ordering", "bigint")]


def apply_orderings(stage: io.Staging) -> int:
    """Swap staged orderings in (one transaction); the number of events that changed.

    The rooms whose orderings move are marked for good in ``rooms.late_stream``: their
    events may now sit before earlier ones of the stream, in ways the persist path's marks
    never saw, so incremental sync walks ``*shared``'s ranges there, and each range's walk
    without stream-ordering bounds, as before the column existed."""
    _, changed, _ = io.swap_in([
        (f"UPDATE rooms SET late_stream = {LATE_ALWAYS} WHERE room_id IN ("
         f"SELECT e.room_id FROM {stage.name} AS s JOIN events e ON e.event_id = s.event_id "
         f"WHERE e.topological_ordering <> s.topological_ordering)", ()),
        (f"UPDATE events SET topological_ordering = s.topological_ordering "
         f"FROM {stage.name} AS s WHERE events.event_id = s.event_id "
         f"AND events.topological_ordering <> s.topological_ordering", ()),
        (f"UPDATE room_memberships SET topological_ordering = s.topological_ordering "
         f"FROM {stage.name} AS s WHERE room_memberships.event_id = s.event_id "
         f"AND room_memberships.topological_ordering <> s.topological_ordering", ()),
    ])
    return changed


def recompute_topological_ordering(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    """Recompute every event's topological ordering and swap the changed ones in."""
    rows_in = count_events(rooms)
    with _orderings(spark, rooms) as (_, result):
        stage = io.Staging.create("topo", ORDERING_COLUMNS)
        try:
            stage.write(result)
            changed = apply_orderings(stage)
        finally:
            stage.drop()
    return Outcome(rows_in=rows_in, rows_out=max(changed, 0), differences=None)


def check_topological_ordering(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    """Compare recomputed orderings with the stored ones, over one consistent cut; write nothing."""
    with io.consistent_cut():
        return _check_topological_ordering(spark, rooms)


def _check_topological_ordering(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    rows_in = count_events(rooms)
    with _orderings(spark, rooms) as (events, result):
        stored = events.select("room_id", "event_id", "topological_ordering")
        n, sample = counted_sample(ordering_differences(result, stored), lambda d: d.orderBy("room_id", "event_id"))
    return Outcome(rows_in=rows_in, rows_out=0, differences=n, sample=sample)


# -- visibility ---------------------------------------------------------------------------------

def _vis_events_query(dialect: JobDialect) -> io.Query:
    """The events with their state group after, and the prev events (JSON text) of the state
    events the boundary rules may need them for (history visibility, membership): looked up
    in ``event_edges``' index inside the partitioned read, not shuffled and joined in Spark."""
    return io.Query(
        columns=("room_id", "event_id", "topological_ordering", "stream_ordering", "type", "state_key",
                 "membership", "outlier", "rejected", "state_group", "prev_events"),
        source="(SELECT e.room_id, e.event_id, e.topological_ordering, e.stream_ordering, e.type, e.state_key, "
               "e.membership, e.outlier, e.rejected, s.state_group, CASE WHEN e.state_key IS NOT NULL AND e.type IN "
               f"('m.room.member', 'm.room.history_visibility') THEN {dialect.prev_events} END AS prev_events "
               "FROM events e LEFT JOIN event_to_state_groups s ON s.event_id = e.event_id) AS ev",
        schema="room_id string, event_id string, topological_ordering long, stream_ordering long, type string, "
               "state_key string, membership string, outlier boolean, rejected boolean, state_group long, "
               "prev_events string",
        partition_column="stream_ordering",
    )


def _groups_query(dialect: JobDialect) -> io.Query:
    return io.Query(
        columns=("room_id", "state_group", "prev_state_group", "type", "state_key", "membership",
                 "history_visibility"),
        source="(SELECT g.room_id, g.id AS state_group, eg.prev_state_group, s.type, s.state_key, "
               "ev.membership, CASE WHEN s.type = 'm.room.history_visibility' THEN "
               f"{dialect.history_visibility} END AS history_visibility "
               "FROM state_groups g LEFT JOIN state_group_edges eg ON eg.state_group = g.id "
               "LEFT JOIN state_groups_state s ON s.state_group = g.id AND (s.type = 'm.room.member' "
               "OR (s.type = 'm.room.history_visibility' AND s.state_key = '')) "
               "LEFT JOIN events ev ON ev.event_id = s.event_id) AS sg",
        schema="room_id string, state_group long, prev_state_group long, type string, state_key string, "
               "membership string, history_visibility string",
        partition_column="state_group",
    )


RANGES = io.Query(
    columns=("room_id", "user_id", "start_topological", "start_stream", "end_topological", "end_stream", "id"),
    source="room_visibility_ranges",
    schema="room_id string, user_id string, start_topological long, start_stream long, end_topological long, "
           "end_stream long, id long",
    partition_column="id",
)

RANGE_COLUMNS = [("room_id", "text"), ("user_id", "text"), ("start_topological", "bigint"),
                 ("start_stream", "bigint"), ("end_topological", "bigint"), ("end_stream", "bigint")]


def _visibility(spark: Any, rooms: Sequence[str] | None):
    events = io.read(spark, _vis_events_query(for_database()), rooms).cache()
    groups = io.read(spark, _groups_query(for_database()), rooms)
    return events, visibility_ranges(events, groups)


def _stream_bounds(rooms: Sequence[str] | None) -> tuple[int, int]:
    from django.db import connection

    where, params = for_database().rooms_filter(rooms)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(min(stream_ordering), 0), coalesce(max(stream_ordering), 0) FROM events {where}",
                       params)
        return cursor.fetchone()


def apply_ranges(stage: io.Staging, rooms: Sequence[str] | None, low: int, high: int) -> tuple[int, int]:
    """Swap staged ranges in for ``rooms`` (all if None) in one transaction, except rooms with
    events outside ``[low, high]`` (persisted after the job read them); (skipped, inserted).

    Only what differs is written: live rows the stage does not hold are deleted, staged rows
    the table does not hold are inserted. A recomputation mostly finds the ranges the persist
    path maintained, so this reads two tables instead of rewriting one with its indexes."""
    cols = ", ".join(n for n, _ in RANGE_COLUMNS)
    keep = "room_id NOT IN (SELECT room_id FROM job_vis_skipped)"
    target = f"r.room_id IN ({', '.join(io.quote(r) for r in rooms)}) AND r.{keep}" if rooms else f"r.{keep}"
    same = ("s.room_id = r.room_id AND s.user_id = r.user_id AND s.start_topological = r.start_topological "
            "AND s.start_stream = r.start_stream AND s.end_topological IS NOT DISTINCT FROM r.end_topological "
            "AND s.end_stream IS NOT DISTINCT FROM r.end_stream")
    # a persisting transaction that writes ranges waits for the swap, or the swap for it
    statements = for_database().lock_tables("room_visibility_ranges")
    statements += [
        (f"ANALYZE {stage.name}", ()),  # its size, for the anti-joins' plans
        ("CREATE TEMPORARY TABLE job_vis_skipped AS SELECT DISTINCT room_id FROM events "
         "WHERE stream_ordering > %s OR stream_ordering < %s", (high, low)),
        (f"DELETE FROM room_visibility_ranges AS r WHERE {target} "
         f"AND NOT EXISTS (SELECT 1 FROM {stage.name} AS s WHERE {same})", ()),
        (f"INSERT INTO room_visibility_ranges ({cols}) SELECT {cols} FROM {stage.name} AS r WHERE r.{keep} "
         f"AND NOT EXISTS (SELECT 1 FROM room_visibility_ranges AS s WHERE {same})", ()),
        ("DROP TABLE job_vis_skipped", ()),
    ]
    *_, skipped, _, inserted, _ = io.swap_in(statements)
    return skipped, inserted


def recompute_visibility(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    """Recompute the visibility ranges and swap them in, room by room. A room that gained
    events while the job ran keeps its incrementally maintained rows (reported as skipped)."""
    low, high = _stream_bounds(rooms)  # before reading: whatever is newer was not seen
    events, ranges = _visibility(spark, rooms)
    stage = io.Staging.create("vis", RANGE_COLUMNS)
    try:
        stage.write(ranges)
        skipped, inserted = apply_ranges(stage, rooms, low, high)
    finally:
        stage.drop()
    rows_in = events.count()
    events.unpersist()
    return Outcome(rows_in=rows_in, rows_out=max(inserted, 0), differences=None,
                   sample=[{"note": f"{skipped} room(s) gained events while the job ran and kept their "
                                    f"incrementally maintained ranges"}] if skipped > 0 else [])


def check_visibility(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    """Compare recomputed visibility with the stored ranges, event by event, over one
    consistent cut; write nothing."""
    with io.consistent_cut():
        return _check_visibility(spark, rooms)


def _check_visibility(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    events, expected = _visibility(spark, rooms)
    found = io.read(spark, RANGES, rooms)
    n, sample = counted_sample(visibility_differences(events, expected, found),
                               lambda d: d.orderBy("room_id", "user_id", "event_id"))
    rows_in = count_events(rooms)  # in the cut: the events read (one row each)
    events.unpersist()
    return Outcome(rows_in=rows_in, rows_out=0, differences=n, sample=sample)


# -- chain cover index ----------------------------------------------------------------------------

def _chain_events_query(dialect: JobDialect) -> io.Query:
    """The state events with their auth events as the stored JSON lists them."""
    return io.Query(
        columns=("room_id", "event_id", "stream_ordering", "type", "state_key", "auth_events"),
        source=f"(SELECT room_id, event_id, stream_ordering, type, state_key, {dialect.auth_events} AS auth_events "
               f"FROM events WHERE state_key IS NOT NULL) AS ev",
        schema="room_id string, event_id string, stream_ordering long, type string, state_key string, "
               "auth_events string",
        partition_column="stream_ordering",
    )


CHAIN_POSITIONS = io.Query(
    columns=("room_id", "event_id", "chain_id", "sequence_number", "id"),
    source="event_auth_chains",
    schema="room_id string, event_id string, chain_id long, sequence_number long, id long",
    partition_column="id",
)

CHAIN_LINKS = io.Query(
    columns=("room_id", "origin_chain_id", "origin_sequence_number", "target_chain_id", "target_sequence_number", "id"),
    source="event_auth_chain_links",
    schema="room_id string, origin_chain_id long, origin_sequence_number long, target_chain_id long, "
           "target_sequence_number long, id long",
    partition_column="id",
)

POSITION_COLUMNS = [("room_id", "text"), ("event_id", "text"), ("chain_id", "bigint"), ("sequence_number", "bigint")]
LINK_COLUMNS = [("room_id", "text"), ("origin_chain_id", "bigint"), ("origin_sequence_number", "bigint"),
                ("target_chain_id", "bigint"), ("target_sequence_number", "bigint")]


def _rebuilt_chain_cover(spark: Any, rooms: Sequence[str] | None):
    """(state events examined, positions, links). The events are read once, straight into the
    per-room pass (not cached: their count is the database's)."""

    rows_in = count_events(rooms, state_only=True)
    positions, links = chain_cover(io.read_by_room(spark, _chain_events_query(for_database()), rooms), by_room=True)
    return rows_in, positions, links


def apply_chain_cover(positions: io.Staging, links: io.Staging, rooms: Sequence[str] | None,
                      low: int, high: int) -> tuple[int, int, int]:
    """Swap a rebuilt index in for ``rooms`` (all if None) in one transaction, except rooms
    with events outside ``[low, high]`` (persisted after the job read them: they keep the
    index the persist path extended). Staged chain numbers start at 1; they are moved above
    every chain ID in use or handed out, and the sequence continues after them.
    (skipped rooms, positions, links)."""
    keep = "room_id NOT IN (SELECT room_id FROM job_chain_skipped)"
    target = f"room_id IN ({', '.join(io.quote(r) for r in rooms)}) AND {keep}" if rooms else keep
    dialect = for_database()
    base = dialect.chain_id_base
    # a persisting transaction that indexes events waits for the swap, or it for them
    statements = dialect.lock_tables("event_auth_chains, event_auth_chain_links")
    offset = len(statements)
    statements += [
        ("CREATE TEMPORARY TABLE job_chain_skipped AS SELECT DISTINCT room_id FROM events "
         "WHERE stream_ordering > %s OR stream_ordering < %s", (high, low)),
        (f"CREATE TEMPORARY TABLE job_chain_base AS SELECT {base} AS base", ()),
        (f"DELETE FROM event_auth_chains WHERE {target}", ()),
        (f"DELETE FROM event_auth_chain_links WHERE {target}", ()),
        (f"INSERT INTO event_auth_chains (room_id, event_id, chain_id, sequence_number) "
         f"SELECT room_id, event_id, chain_id + (SELECT base FROM job_chain_base), sequence_number "
         f"FROM {positions.name} WHERE {keep}", ()),
        (f"INSERT INTO event_auth_chain_links (room_id, origin_chain_id, origin_sequence_number, target_chain_id, "
         f"target_sequence_number) SELECT room_id, origin_chain_id + (SELECT base FROM job_chain_base), "
         f"origin_sequence_number, target_chain_id + (SELECT base FROM job_chain_base), target_sequence_number "
         f"FROM {links.name} WHERE {keep}", ()),
        ("DELETE FROM event_auth_chain_to_calculate WHERE event_id IN (SELECT event_id FROM event_auth_chains)", ()),
        ("DROP TABLE job_chain_skipped", ()),
        ("DROP TABLE job_chain_base", ()),
    ]
    statements += dialect.chain_id_catch_up()
    counts = io.swap_in(statements)
    skipped, inserted_positions, inserted_links = counts[offset], counts[offset + 4], counts[offset + 5]
    return skipped, inserted_positions, inserted_links


def rebuild_chain_cover(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    """Rebuild the chain cover index from the events' auth events and swap it in, room by room.
    A room that gained events while the job ran keeps its incrementally maintained index."""
    low, high = _stream_bounds(rooms)  # before reading: whatever is newer was not seen
    rows_in, positions, links = _rebuilt_chain_cover(spark, rooms)
    staged_positions = io.Staging.create("chain_pos", POSITION_COLUMNS)
    staged_links = io.Staging.create("chain_links", LINK_COLUMNS)
    try:
        staged_positions.write(positions)
        staged_links.write(links)
        skipped, n_positions, n_links = apply_chain_cover(staged_positions, staged_links, rooms, low, high)
    finally:
        staged_positions.drop()
        staged_links.drop()
    return Outcome(rows_in=rows_in, rows_out=max(n_positions, 0) + max(n_links, 0), differences=None,
                   sample=[{"note": f"{skipped} room(s) gained events while the job ran and kept their "
                                    f"incrementally maintained index"}] if skipped > 0 else [])


def check_chain_cover(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    """Rebuild the index and compare it with the stored one (chains named by their first
    event), over one consistent cut; write nothing."""
    with io.consistent_cut():
        return _check_chain_cover(spark, rooms)


def _check_chain_cover(spark: Any, rooms: Sequence[str] | None) -> Outcome:
    rows_in, positions, links = _rebuilt_chain_cover(spark, rooms)
    # the stored positions name both sides' chains (read once, not once per use)
    stored_positions = io.read(spark, CHAIN_POSITIONS, rooms).drop("id").cache()
    stored_links = io.read(spark, CHAIN_LINKS, rooms).drop("id")
    n, sample = counted_sample(chain_cover_differences(positions, links, stored_positions, stored_links),
                               lambda d: d.orderBy("room_id", "event_id", "expected", "found"))
    stored_positions.unpersist()
    return Outcome(rows_in=rows_in, rows_out=0, differences=n, sample=sample)

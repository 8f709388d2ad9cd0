"""Topological ordering recomputed from the stored events: the batch twin of the persist
path's ordering (docs/storage.md, "The persist path").

As in Synapse, an event's topological ordering is its own declared ``depth``: it never
changes, so a ``t`` token handed to a client keeps its meaning whatever arrives later. Only
an event without a depth (the old unsigned test format) gets ``1 + max(ordering of its
prev_events)`` (1 without known prev events), exactly as the persist path computes it. The
job therefore checks and repairs rows that stray from that rule; it never moves an event
whose depth is stored. Rooms are independent: the work is one ``cogroup`` by room
(``rooms.cogroup_rooms``), and within a room an iterative walk (no recursion, no per-hop
Spark join), so a room of a million events is one pass over its rows.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import pandas as pd

from jobs.room_groups import cogroup_rooms

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

MAX_DEPTH = 2**53 - 1

EVENTS_COLUMNS = ("room_id", "event_id", "stream_ordering", "depth")
EDGES_COLUMNS = ("room_id", "event_id", "prev_event_id")
RESULT_SCHEMA = "room_id string, event_id string, topological_ordering long"


def room_orderings(events: pd.DataFrame, edges: pd.DataFrame) -> pd.DataFrame:
    """One room's orderings: pure pandas, also what the single-process baseline runs.

    ``events``: event_id, depth (declared, may be null: then 1 + max over the prev events);
    ``edges``: event_id, prev_event_id.
    An edge to an event not in ``events`` is ignored (a backward extremity). A cycle, which a
    valid room never has, leaves its events at the ordering of the part that resolves.
    """
    ids = events["event_id"].tolist()
    index = {e: i for i, e in enumerate(ids)}
    declared = events["depth"].tolist()
    prevs: list[list[int]] = [[] for _ in ids]
    for e, p in zip(edges["event_id"].tolist(), edges["prev_event_id"].tolist()):
        i, j = index.get(e), index.get(p)
        if i is not None and j is not None and i != j:
            prevs[i].append(j)
    order = [0] * len(ids)  # 0: not computed yet
    on_stack = [False] * len(ids)
    for i, d in enumerate(declared):
        if d is not None and not pd.isna(d):
            order[i] = min(max(int(d), 0), MAX_DEPTH) or -1  # -1 stands for a declared 0
    for root in range(len(ids)):
        if order[root]:
            continue
        stack = [root]
        while stack:
            i = stack[-1]
            if order[i]:
                stack.pop()
                continue
            pending = [j for j in prevs[i] if not order[j] and not on_stack[j]]
            if pending and not on_stack[i]:
                on_stack[i] = True
                stack.extend(pending)
                continue
            stack.pop()
            on_stack[i] = False
            known = [max(order[j], 0) for j in prevs[i] if order[j]]
            order[i] = min(max(known, default=0) + 1, MAX_DEPTH)
    order = [max(o, 0) for o in order]
    room = events["room_id"].iloc[0] if len(events) else None
    return pd.DataFrame({"room_id": [room] * len(ids), "event_id": ids,
                         "topological_ordering": pd.Series(order, dtype="int64")})


def _per_room(events: pd.DataFrame, edges: pd.DataFrame) -> pd.DataFrame:
    return room_orderings(events, edges) if len(events) else events.iloc[0:0]


def rooms_to_walk(events: pd.DataFrame) -> set[str]:
    """Rooms holding an event without a declared depth: only they need the walk over the DAG."""
    return set(events.loc[events["depth"].isna(), "room_id"])


def declared_orderings(events: DataFrame) -> DataFrame:
    """Events that all declare their depth -> (room_id, event_id, topological_ordering): Spark SQL."""
    from pyspark.sql import functions as F

    return events.select("room_id", "event_id", _clamped(F.col("depth")).alias("topological_ordering"))


def _clamped(column: Column) -> Column:
    from pyspark.sql import functions as F

    return F.least(F.greatest(column, F.lit(0)), F.lit(MAX_DEPTH))


def rooms_frame(spark: Any, rooms: Sequence[str]) -> DataFrame:
    """``rooms`` (known on the driver) as a one-column DataFrame to broadcast into joins: a
    local relation, which costs no Spark job, where a ``distinct`` over the events cost one
    of its own in every plan that used it."""
    from pyspark.sql import functions as F

    return F.broadcast(spark.createDataFrame([(r,) for r in rooms], "room_id string"))


def resolved_in_sql(events: DataFrame, edges: DataFrame, cached: list[DataFrame]) -> tuple[DataFrame, list[str]]:
    """Rooms with events without a depth -> (orderings of the rooms Spark SQL settles, the
    rooms it cannot: their IDs, collected on the driver).

    An event without a depth whose prev events in its room all declare theirs (or that has
    none) is ``1 + max(their clamped depths)`` (1 without any): one join and one aggregate
    in the JVM, what the walk would give. A room where such an event has a prev event
    without a depth (a chain of them, or a cycle) is left whole to the walk. The aggregate
    is cached (the rooms left to the walk are read from it, then the orderings) and added to
    ``cached``, for the caller to unpersist once it is done with the orderings."""
    from pyspark.sql import functions as F

    missing = events.where(F.col("depth").isNull()).select("room_id", "event_id")
    prevs = events.select("room_id", F.col("event_id").alias("prev_event_id"), F.col("depth").alias("prev_depth"))
    # the in-room prev events of events without a depth (an edge to an event the room does
    # not hold is ignored, as the walk ignores it; so is an edge to itself)
    known = (edges.where(F.col("event_id") != F.col("prev_event_id"))
             .join(missing, on=["room_id", "event_id"], how="left_semi")
             .join(prevs, on=["room_id", "prev_event_id"], how="inner")
             .groupBy("room_id", "event_id")
             .agg(F.max(F.col("prev_depth").isNull().cast("int")).alias("blocked"),
                  F.max(_clamped(F.col("prev_depth"))).alias("highest"))).cache()
    cached.append(known)
    blocked = sorted(r.room_id for r in known.where(F.col("blocked") == 1).select("room_id").distinct().collect())
    settled = events.join(known, on=["room_id", "event_id"], how="left")
    if blocked:
        settled = settled.join(rooms_frame(events.sparkSession, blocked), on="room_id", how="left_anti")
    orderings = settled.select("room_id", "event_id", F.when(
        F.col("depth").isNull(), F.least(F.coalesce(F.col("highest"), F.lit(0)) + 1, F.lit(MAX_DEPTH))
    ).otherwise(_clamped(F.col("depth"))).alias("topological_ordering"))
    return orderings, blocked


@contextmanager
def topological_ordering(events: DataFrame, edges: DataFrame | None,
                         walk_rooms: Sequence[str] | None = None) -> Iterator[DataFrame]:
    """``events`` (room_id, event_id, stream_ordering, depth) and ``edges`` (room_id,
    event_id, prev_event_id) -> (room_id, event_id, topological_ordering), one row per event,
    to use inside the context (what it caches for the result is released on leaving).

    An event that declares its depth is its ordering: Spark SQL computes those rooms without
    a Python round trip, and the rooms whose events without a depth follow only events with
    one (:func:`resolved_in_sql`). Only the rest go through the per-room walk
    (``cogroup_rooms``), with their edges alone; ``edges`` None: no room needs it (no
    Python at all). ``walk_rooms``: the rooms holding an event without a depth, where the
    caller has collected them already (else they are collected here). Each set of rooms the
    plan splits on is collected on the driver and joined back as a local relation: no Spark
    job recomputes it inside a later plan."""
    from pyspark.sql import functions as F

    events = events.select(*EVENTS_COLUMNS)
    if edges is None:  # the caller knows that every event declares its depth
        yield declared_orderings(events)
        return
    if walk_rooms is None:
        walk_rooms = sorted(r.room_id for r in events.where(F.col("depth").isNull()).select("room_id")
                            .distinct().collect())
    if not walk_rooms:
        yield declared_orderings(events)
        return
    spark = events.sparkSession
    edges = edges.select(*EDGES_COLUMNS)
    walk = rooms_frame(spark, walk_rooms)
    declared = declared_orderings(events.join(walk, on="room_id", how="left_anti"))
    in_walk = events.join(walk, on="room_id", how="left_semi")
    cached: list[DataFrame] = []
    try:
        settled, blocked_rooms = resolved_in_sql(in_walk, edges, cached)
        if not blocked_rooms:  # usually none: then no Python at all
            yield declared.unionByName(settled)
            return
        to_walk = rooms_frame(spark, blocked_rooms)
        walked = cogroup_rooms(in_walk.join(to_walk, on="room_id", how="left_semi"),
                               edges.join(to_walk, on="room_id", how="left_semi"),
                               _per_room, RESULT_SCHEMA)
        yield declared.unionByName(settled).unionByName(walked)
    finally:
        for frame in cached:
            frame.unpersist()


def orderings_in_python(events: Iterable[tuple[Any, ...]], edges: Iterable[tuple[Any, ...]]) -> dict[str, int]:
    """The same computation in one process without Spark (the benchmark's baseline): declared
    depths vectorised in pandas, the walk for the rooms that need it."""
    ev = pd.DataFrame(list(events), columns=list(EVENTS_COLUMNS))
    ed = pd.DataFrame(list(edges), columns=list(EDGES_COLUMNS))
    walk = ev["room_id"].isin(rooms_to_walk(ev))
    declared = ev[~walk]
    out: dict[str, int] = dict(zip(declared["event_id"], declared["depth"].clip(0, MAX_DEPTH).astype("int64")))
    edges_by_room = dict(tuple(ed.groupby("room_id", sort=False)))
    empty = ed.iloc[0:0]
    for room, group in ev[walk].groupby("room_id", sort=False):
        res = room_orderings(group, edges_by_room.get(room, empty))
        out.update(zip(res["event_id"], res["topological_ordering"]))
    return out

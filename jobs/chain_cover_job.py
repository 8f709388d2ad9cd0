"""The chain cover index rebuilt from the events alone, and compared with the stored one: the
batch twin of what the persist path writes (``rooms.storage.chain_index_store``; the algorithm is
``rooms.matrix.chain_index``).

Rooms are independent: per room, the state events in stream order (the order the persist path
indexed them in), their auth events read from the stored JSON, one pass of the pure algorithm.
Chains are numbered 1.. within a room; :func:`chain_cover` then gives each room an offset so
the numbers are unique over the whole result. Two indexes are compared with each chain named
by its first event (:func:`chain_cover_differences`), so chain numbering never counts as a
difference, while any other difference in a position or a link does.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import pandas as pd

from rooms.matrix.chain_index import ChainIndex, IndexEvent, auth_events_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EVENTS_COLUMNS = ("room_id", "event_id", "stream_ordering", "type", "state_key", "auth_events")
#: one row per position (kind 'p': event, chain, seq) or link (kind 'l': chain, seq -> target)
ROOM_SCHEMA = ("kind string, room_id string, event_id string, chain long, seq long, "
               "target_chain long, target_seq long")
POSITION_COLUMNS = ("room_id", "event_id", "chain_id", "sequence_number")
LINK_COLUMNS = ("room_id", "origin_chain_id", "origin_sequence_number", "target_chain_id", "target_sequence_number")


def index_events_of_room(events: pd.DataFrame) -> list[IndexEvent]:
    """The room's state events in stream order, as the index reads them. ``auth_events`` is
    the JSON text of the stored event's ``auth_events`` (null or bad JSON: none)."""
    events = events.sort_values("stream_ordering", kind="stable")
    out = []
    for room_id, event_id, type_, state_key, auth in zip(
            events["room_id"], events["event_id"], events["type"], events["state_key"], events["auth_events"]):
        if state_key is None or (isinstance(state_key, float) and pd.isna(state_key)):
            continue
        try:
            refs = json.loads(auth) if isinstance(auth, str) else []
        except ValueError:
            refs = []
        ids = auth_events_of({"auth_events": refs if isinstance(refs, list) else [], "type": type_,
                              "state_key": state_key}, room_id)
        out.append(IndexEvent(event_id, type_, state_key, ids))
    return out


def room_chain_cover(events: pd.DataFrame) -> pd.DataFrame:
    """One room's index, rebuilt: pure pandas, also the single-process baseline."""
    index = ChainIndex()
    added = index.extend(index_events_of_room(events))
    room = events["room_id"].iloc[0] if len(events) else None
    kinds: list[str] = []
    event_ids: list[str | None] = []
    chains: list[int] = []
    seqs: list[int] = []
    targets: list[int | None] = []
    target_seqs: list[int | None] = []
    for event_id, chain, seq in added.positions:
        kinds.append("p"); event_ids.append(event_id); chains.append(chain); seqs.append(seq)  # noqa: E702
        targets.append(None); target_seqs.append(None)  # noqa: E702
    for chain, seq, target, target_seq in added.links:
        kinds.append("l"); event_ids.append(None); chains.append(chain); seqs.append(seq)  # noqa: E702
        targets.append(target); target_seqs.append(target_seq)  # noqa: E702
    return pd.DataFrame({
        "kind": kinds, "room_id": [room] * len(kinds), "event_id": event_ids,
        "chain": pd.Series(chains, dtype="int64"), "seq": pd.Series(seqs, dtype="int64"),
        "target_chain": pd.Series(targets, dtype="Int64"), "target_seq": pd.Series(target_seqs, dtype="Int64"),
    })


def _empty_rows() -> pd.DataFrame:
    return pd.DataFrame({c.split()[0]: pd.Series([], dtype=object) for c in ROOM_SCHEMA.split(", ")})


def _rooms(pdf: pd.DataFrame) -> pd.DataFrame:
    """Every room of ``pdf`` (whole rooms), one pass each."""
    out = [room_chain_cover(group) for _, group in pdf.groupby("room_id", sort=False)]
    out = [o for o in out if len(o)]
    return pd.concat(out, ignore_index=True) if out else _empty_rows()


def rooms_of_sorted_batches(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Runs in a Python worker: one partition's rows, sorted by room and cut into Arrow
    batches, -> its rooms' index rows. A room can straddle two batches, so the last room of
    each batch waits for the next; only one batch (and one room) is held at a time."""
    pending: list[pd.DataFrame] = []  # rows of rooms that may go on in the next batch
    for pdf in batches:
        if not len(pdf):
            continue
        tail = (pdf["room_id"] == pdf["room_id"].iat[-1]).to_numpy()
        if not tail.all():
            out = _rooms(pd.concat([*pending, pdf[~tail]], ignore_index=True) if pending else pdf[~tail])
            pending = []
            if len(out):
                yield out
        pending.append(pdf[tail])
    if pending:
        out = _rooms(pd.concat(pending, ignore_index=True))
        if len(out):
            yield out


def chain_cover(events: DataFrame, by_room: bool = False) -> tuple[DataFrame, DataFrame]:
    """``events`` (room_id, event_id, stream_ordering, type, state_key, auth_events JSON) ->
    (positions (room_id, event_id, chain_id, sequence_number), links (room_id,
    origin_chain_id, origin_sequence_number, target_chain_id, target_sequence_number)), chain
    IDs unique over all rooms (from 1).

    ``by_room``: each partition of ``events`` already holds whole rooms (``io.read_by_room``);
    otherwise they are hashed into one partition per core first. Each partition is sorted by
    room in the JVM and streamed through :func:`rooms_of_sorted_batches` (``mapInPandas``):
    no shuffle of the rows between the read and the Python pass."""
    from pyspark.sql import functions as F

    events = events.select(*EVENTS_COLUMNS)
    if not by_room:
        events = events.repartition(max(1, events.sparkSession.sparkContext.defaultParallelism), "room_id")
    rows = events.sortWithinPartitions("room_id").mapInPandas(rooms_of_sorted_batches, schema=ROOM_SCHEMA)
    rows = rows.cache()
    # one row per room: numbered on the driver, joined back as a broadcast
    counts = sorted((r.room_id, r.n) for r in rows.where(F.col("kind") == "p").groupBy("room_id")
                    .agg(F.max("chain").alias("n")).collect())
    firsts: list[tuple[str, int]] = []
    total = 0
    for room_id, n in counts:
        firsts.append((room_id, total))
        total += n
    offsets = events.sparkSession.createDataFrame(firsts, "room_id string, offset long")
    rows = rows.join(F.broadcast(offsets), on="room_id", how="left")
    positions = rows.where(F.col("kind") == "p").select(
        "room_id", "event_id", (F.col("chain") + F.col("offset")).alias("chain_id"),
        F.col("seq").alias("sequence_number"))
    links = rows.where(F.col("kind") == "l").select(
        "room_id", (F.col("chain") + F.col("offset")).alias("origin_chain_id"),
        F.col("seq").alias("origin_sequence_number"),
        (F.col("target_chain") + F.col("offset")).alias("target_chain_id"),
        F.col("target_seq").alias("target_sequence_number"))
    return positions, links


def _named(positions: DataFrame, links: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Positions as (room, event, chain's first event, seq) and links with both ends named so."""
    from pyspark.sql import functions as F

    roots = positions.where(F.col("sequence_number") == 1).select(
        "chain_id", F.col("event_id").alias("root"))
    named_positions = positions.join(roots, on="chain_id", how="left").select(
        "room_id", "event_id", F.coalesce("root", F.concat(F.lit("#"), F.col("chain_id").cast("string"))).alias("root"),
        "sequence_number")
    o, t = roots.alias("o"), roots.alias("t")
    named_links = (links.alias("l")
                   .join(o, F.col("l.origin_chain_id") == F.col("o.chain_id"), "left")
                   .join(t, F.col("l.target_chain_id") == F.col("t.chain_id"), "left")
                   .select(F.col("l.room_id").alias("room_id"),
                           F.concat_ws(" ", F.coalesce(F.col("o.root"), F.lit("?")),
                                       F.col("l.origin_sequence_number").cast("string"), F.lit("->"),
                                       F.coalesce(F.col("t.root"), F.lit("?")),
                                       F.col("l.target_sequence_number").cast("string")).alias("link")))
    return named_positions, named_links


def chain_cover_differences(expected_positions: DataFrame, expected_links: DataFrame,
                            stored_positions: DataFrame, stored_links: DataFrame) -> DataFrame:
    """Every position and link on one side only, chains named by their first event: rows of
    (room_id, event_id, user_id null, expected, found). A position reads ``first-event seq``;
    a link ``first-event seq -> first-event seq`` with the origin chain's first event as
    ``event_id``."""
    from pyspark.sql import functions as F

    ep, el = _named(expected_positions, expected_links)
    sp, sl = _named(stored_positions, stored_links)
    e, s = ep.alias("e"), sp.alias("s")
    position_diffs = (
        e.join(s, on="event_id", how="full_outer")
        .where(~(F.col("e.root").eqNullSafe(F.col("s.root"))
                 & F.col("e.sequence_number").eqNullSafe(F.col("s.sequence_number"))))
        .select(F.coalesce(F.col("e.room_id"), F.col("s.room_id")).alias("room_id"), "event_id",
                F.lit(None).cast("string").alias("user_id"),
                F.concat_ws(" ", F.col("e.root"), F.col("e.sequence_number").cast("string")).alias("expected"),
                F.concat_ws(" ", F.col("s.root"), F.col("s.sequence_number").cast("string")).alias("found")))
    position_diffs = position_diffs.select(
        "room_id", "event_id", "user_id",
        F.when(F.col("expected") == "", None).otherwise(F.col("expected")).alias("expected"),
        F.when(F.col("found") == "", None).otherwise(F.col("found")).alias("found"))
    # links on one side only, with their multiplicity: one count per (room, link) on each
    # side, in one aggregate over both (two exceptAlls each shuffled both sides)
    tagged = (el.select("room_id", "link", F.lit(1).alias("e"), F.lit(0).alias("s"))
              .unionByName(sl.select("room_id", "link", F.lit(0).alias("e"), F.lit(1).alias("s"))))
    counted = tagged.groupBy("room_id", "link").agg(F.sum("e").alias("e"), F.sum("s").alias("s")).where(
        F.col("e") != F.col("s"))
    link_diffs = counted.select(
        "room_id", F.split("link", " ").getItem(0).alias("event_id"), F.lit(None).cast("string").alias("user_id"),
        F.when(F.col("e") > F.col("s"), F.concat(F.lit("link "), F.col("link"))).alias("expected"),
        F.when(F.col("s") > F.col("e"), F.concat(F.lit("link "), F.col("link"))).alias("found"),
        F.explode(F.sequence(F.lit(1), F.abs(F.col("e") - F.col("s")).cast("int"))).alias("_n")).drop("_n")
    return position_diffs.unionByName(link_diffs)


def chain_cover_in_python(events: Iterable[tuple[Any, ...]]
                          ) -> tuple[list[tuple[str, str, int, int]], list[tuple[str, int, int, int, int]]]:
    """The same computation in one process without Spark (the benchmark's baseline):
    (positions, links) rows with per-room chain numbers made unique by an offset."""
    ev = pd.DataFrame(list(events), columns=list(EVENTS_COLUMNS))
    positions, links = [], []
    offset = 0
    for room, group in sorted(ev.groupby("room_id", sort=False), key=lambda g: g[0]):
        res = room_chain_cover(group)
        p = res[res["kind"] == "p"]
        n = int(p["chain"].max()) if len(p) else 0
        positions += [(room, e, c + offset, s) for e, c, s in zip(p["event_id"], p["chain"], p["seq"])]
        l_ = res[res["kind"] == "l"]
        links += [(room, c + offset, s, int(t) + offset, int(ts))
                  for c, s, t, ts in zip(l_["chain"], l_["seq"], l_["target_chain"], l_["target_seq"])]
        offset += n
    return positions, links

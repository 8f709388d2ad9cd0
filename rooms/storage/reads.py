"""The reads of the room event store, each filtered by visibility for the requesting user.

Visibility is decided inside the query from ``room_visibility_ranges``, so limits count
visible events only: a range of the user's or of ``*``'s covers the event's (topological,
stream) key, or one of ``*shared``'s does and the key is before the user's latest join in
the room (``J``, looked up in ``room_memberships``: nothing copies the shared eras into the
user's ranges; docs/storage.md, "Visibility"). Outliers and rejected events are never
returned; redacted events come back pruned. Events are returned as their stored JSON bytes
(lossless), in :class:`EventRow`.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from django.db import transaction

from rooms.matrix.room_versions import UnknownRoomVersion, room_version
from rooms.storage.caches import StorageCaches, storage_caches
from rooms.storage.change_cache import StreamChangeCache
from rooms.storage.incoming_events import StateKey, StateMap
from rooms.storage.redactions import client_json
from rooms.storage.sql import array, fetch_all, in_array, is_sqlite, json_list, store_cursor, text_list
from rooms.storage.tokens import RoomStreamToken

MAX_LIMIT = 1000


def latest_join(room: str) -> str:
    """SQL: the key ``(topological, stream)`` of %(user)s's latest join in room ``room`` (no
    row: never joined). The (room_id, user_id) index finds the user's few member events."""
    return f"""(SELECT j.topological_ordering AS jt, j.event_stream_ordering AS js FROM room_memberships j
            WHERE j.room_id = {room} AND j.user_id = %(user)s AND j.membership = 'join'
            ORDER BY j.topological_ordering DESC, j.event_stream_ordering DESC LIMIT 1)"""


def _covers(holders: str) -> str:
    return f"""EXISTS (
    SELECT 1 FROM room_visibility_ranges v
    WHERE v.room_id = e.room_id AND v.user_id {holders}
      AND (v.start_topological, v.start_stream) <= (e.topological_ordering, e.stream_ordering)
      AND (v.end_topological IS NULL
           OR (e.topological_ordering, e.stream_ordering) <= (v.end_topological, v.end_stream)))"""


def visible_clause(room: str = "e.room_id") -> str:
    """SQL: the event row ``e`` (of room ``room``) is visible to %(user)s: a range of theirs or
    of ``*`` covers it, or one of ``*shared`` does and it is before their latest join."""
    return f"""({_covers("IN (%(user)s, '*')")}
    OR ((e.topological_ordering, e.stream_ordering) < (SELECT jt, js FROM {latest_join(room)} lj)
        AND {_covers("= '*shared'")}))"""


#: the event row ``e`` is visible to %(user)s
VISIBLE = visible_clause()

#: the redaction column is the room version of a redacted event (pruned by its version's
#: rules), NULL for the others: the room is looked up only for the few redacted rows
REDACTED_VERSION = ("CASE WHEN e.redacted THEN coalesce((SELECT r.room_version FROM rooms r "
                    "WHERE r.room_id = e.room_id), '1') END")
_COLUMNS = ("e.event_id, e.room_id, e.topological_ordering, e.stream_ordering, e.json, "
            + REDACTED_VERSION + " AS redacted, e.type, e.state_key")
#: the same columns read back from a subquery ``y`` of :data:`_COLUMNS`
_Y_COLUMNS = ("y.event_id, y.room_id, y.topological_ordering, y.stream_ordering, y.json, y.redacted, "
              "y.type, y.state_key")
_MAX = 2**63 - 1


def _least(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    """SQL: the smaller of two (topological, stream) keys, as its two columns."""
    return _pick(a, b, "<")


def _greatest(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    """SQL: the larger of two (topological, stream) keys, as its two columns."""
    return _pick(a, b, ">")


def _pick(a: tuple[str, str], b: tuple[str, str], op: str) -> tuple[str, str]:
    first = f"({a[0]}, {a[1]}) {op} ({b[0]}, {b[1]})"
    return (f"CASE WHEN {first} THEN {a[0]} ELSE {b[0]} END", f"CASE WHEN {first} THEN {a[1]} ELSE {b[1]} END")


#: a page's token as the inclusive bound of a walk: the events at or before ``(t, s)`` going
#: back; after it going forward, at or after the next key ``(%(ft)s, %(fs)s)``
#: (:func:`_key_after`)
_TOKEN_BOUND = {"b": ("%(t)s", "%(s)s"), "f": ("%(ft)s", "%(fs)s")}


def _key_after(topological: int, stream: int) -> tuple[int, int] | None:
    """The smallest 64-bit (topological, stream) key after this one (None: it is the last),
    computed here: ``s + 1`` in SQL overflows for a token at the end of the key space."""
    if stream < _MAX:
        return topological, stream + 1
    if topological < _MAX:
        return topological + 1, -_MAX - 1
    return None


def visible_events(room: str, *, order: str, event_filter: str = "", range_filter: str = "",
                   limit: str = "%(limit)s", from_token: bool = False, since: str | None = None,
                   late: str | None = None) -> str:
    """SQL: the first ``limit`` events of room ``room`` (an SQL expression) visible to
    %(user)s, in ``order`` -- ``b`` (history, newest first), ``f`` (oldest first) or ``s``
    (stream ordering, newest first); with ``from_token`` (``b`` and ``f``), only those at or
    before the key ``(%(t)s, %(s)s)`` going back, after it going forward. Order ``s`` also
    takes ``since`` and ``late`` (:func:`_visible_in_stream_order`).

    It walks the user's, ``*``'s and ``*shared``'s visibility ranges (the last clipped
    before the user's latest join) and reads each one as an index range scan of
    ``(room_id, topological_ordering, stream_ordering)`` -- never the whole room, and no
    reliance on the planner guessing how many of a room's events a user can see (it guessed
    "all of a small room", then sorted every event of a 100,000-event room).
    """
    if order == "s":
        if late is None:
            raise ValueError("order 's' takes late: the room's rooms.late_stream (room_late_stream), read once per room")
        return _visible_in_stream_order(room, event_filter=event_filter, range_filter=range_filter, limit=limit,
                                        since=since, late=late)
    d = {"b": "DESC", "f": "ASC"}[order]
    range_start = ("v.start_topological", "v.start_stream")
    range_end = (f"coalesce(v.end_topological, {_MAX})", f"coalesce(v.end_stream, {_MAX})")

    def clip(start: tuple[str, str], end: tuple[str, str]) -> tuple[tuple[str, str], tuple[str, str]]:
        # The token and the range bound the scan on the same side: one bound, the tighter of
        # the two. Given both, the index scan started from the range's (a big room's newest
        # event, going back) and filtered its way down to the token: 5,500 index pages for a
        # page of 20 in a 688,000-event room (docs/benchmarks.md).
        if not from_token:
            return start, end
        if order == "b":
            return start, _least(end, _TOKEN_BOUND["b"])
        return _greatest(start, _TOKEN_BOUND["f"]), end

    def walk(who: str, end: tuple[str, str] = range_end, extra: str = "") -> str:
        # One holder's ranges are disjoint, so its ranges in order, each range's events in
        # order, are all its events in order: the walk stops at the limit (an incremental
        # sort per range) instead of reading ``limit`` events from every range and sorting
        # them all -- a member of a big room held one range per shared-history era, 66 of
        # them, and read 1,050 events for a page of 20 (``*shared`` holds them now, walked
        # the same way).
        lo, hi = clip(range_start, end)
        return f"""(
            SELECT x.* FROM room_visibility_ranges v CROSS JOIN LATERAL (
                SELECT {_COLUMNS} FROM events e
                WHERE e.room_id = v.room_id
                  AND (e.topological_ordering, e.stream_ordering) >= ({lo[0]}, {lo[1]})
                  AND (e.topological_ordering, e.stream_ordering) <= ({hi[0]}, {hi[1]})
                  AND NOT e.outlier AND NOT e.rejected {event_filter}
                ORDER BY e.topological_ordering {d}, e.stream_ordering {d} LIMIT {limit}) x
            WHERE v.room_id = {room} AND v.user_id = {who} {range_filter} {extra}
            ORDER BY v.start_topological {d}, v.start_stream {d}, x.topological_ordering {d}, x.stream_ordering {d}
            LIMIT {limit})"""

    # ``*shared``'s ranges up to the user's latest join ``j`` (none if they never joined: the
    # walk is not even started), each range's end clipped to just before it: one upper
    # bound for the index scan (two, and a backwards walk of an open range would start at
    # the room's newest event and filter its way down to the join)
    before_join = _least(range_end, ("j.jt", "j.js - 1"))
    shared = f"""(
            SELECT s.* FROM {latest_join(room)} j CROSS JOIN LATERAL
            {walk("'*shared'", before_join, "AND (v.start_topological, v.start_stream) < (j.jt, j.js)")} s)"""
    # the user's events, the world's ('*', world-readable history) and the shared eras
    # before their join overlap: each walk gives its first ``limit``, and the first
    # ``limit`` of all three without duplicates are the answer
    return f"""(
        SELECT DISTINCT ON (w.topological_ordering, w.stream_ordering) w.* FROM (
            {walk("%(user)s")}
            UNION ALL
            {walk("'*'")}
            UNION ALL
            {shared}) w
        ORDER BY w.topological_ordering {d}, w.stream_ordering {d} LIMIT {limit})"""


def room_late_stream(room: str) -> str:
    """SQL: ``rooms.late_stream`` of room ``room`` (an SQL expression); NULL when the room has
    no row, as when it has no mark."""
    return f"(SELECT r.late_stream FROM rooms r WHERE r.room_id = {room})"


def _visible_in_stream_order(room: str, *, event_filter: str, range_filter: str, limit: str, late: str,
                             since: str | None = None) -> str:
    """:func:`visible_events` newest first by stream ordering (incremental sync: ``event_filter``
    bounds the stream window). Ranges are ordered by (topological, stream), not by stream
    (a fork or backfilled event sits in an old range with a new stream ordering): every
    range is read within the window and the rows sorted. The ranges read are the user's,
    ``*``'s, and ``*shared``'s up to the user's latest join, clipped before it.

    ``since``: the window's exclusive lower bound (an SQL expression). ``*shared``'s walks
    can only find an event of the window before the join by key when the join is in the
    window, or when the room stored an event behind an earlier one after ``since``
    (``rooms.late_stream``); otherwise they are skipped (the walks were 30 % of incremental
    sync's query at 10 M events: docs/benchmarks.md).

    ``late``: the room's ``rooms.late_stream`` (:func:`room_late_stream`) as an SQL
    expression the caller reads once per room: the query names it in three places, and a
    look-up in each was three index probes of ``rooms`` per room."""
    # The range bounds are a filter (``+ 0`` keeps them out of the index condition): the
    # walk goes down the (room_id, stream_ordering) index within the window and stops at the
    # limit. As an index condition of (room_id, topological_ordering, stream_ordering) they
    # made it read every entry of the range -- all of a big room's events since the user
    # joined -- and sort them.
    # A range's walk covers only the stream orderings its events can have, not the whole
    # window. A range ends at an event's key (``RangeSet.close_at``; the visibility job's
    # ends) or just before one, k (``remove_point``; the clip at the join: ``end_stream`` is
    # k's minus 1), and starts at an event's key or just after one. An event inside the
    # range by key that was stored after the end's event (or k) in the stream, or before the
    # start's, would make one of the two sit behind the other, which marks
    # ``rooms.late_stream`` at least at the later stream ordering of the two
    # (``RoomContext.note_order``). So the range's events have stream orderings at most the
    # greater of ``end_stream`` and the mark, and at least ``start_stream`` while the mark is
    # below ``start_stream - 1``. Without those bounds, each of a big room's 1,287 closed
    # world-readable ranges read the ~68,000 events of a 10 % window down to its start: 44 s
    # for one sync (docs/benchmarks.md).
    # the ranges that end before the window are not walked at all (``event_filter`` holds
    # ``> since`` too: this only spares their index probes, 1,287 + 2,204 in that big room)
    in_window = "" if since is None else f"\n            WHERE greatest(r.end_stream, r.late) > {since}"

    def walks(ranges: str, extra: str = "") -> str:
        return f"""SELECT x.* FROM ({ranges}) r CROSS JOIN LATERAL (
            SELECT {_COLUMNS} FROM events e
            WHERE e.room_id = r.room_id AND e.stream_ordering <= greatest(r.end_stream, r.late)
              AND e.stream_ordering >= CASE WHEN r.late IS NULL THEN r.start_stream
                                            WHEN r.start_stream <= r.late THEN {-_MAX - 1}
                                            WHEN r.start_stream - 1 > r.late THEN r.start_stream
                                            ELSE {-_MAX - 1} END
              AND (e.topological_ordering + 0, e.stream_ordering) >= (r.start_topological, r.start_stream)
              AND (e.topological_ordering + 0, e.stream_ordering) <= (r.end_topological, r.end_stream)
              AND NOT e.outlier AND NOT e.rejected {event_filter} {extra}
            ORDER BY e.stream_ordering DESC LIMIT {limit}) x{in_window}"""

    own = f"""SELECT v.room_id, v.start_topological, v.start_stream,
                   coalesce(v.end_topological, {_MAX}) AS end_topological,
                   coalesce(v.end_stream, {_MAX}) AS end_stream, {late} AS late
            FROM room_visibility_ranges v
            WHERE v.room_id = {room} AND v.user_id IN (%(user)s, '*') {range_filter}"""
    before_join = f"(coalesce(v.end_topological, {_MAX}), coalesce(v.end_stream, {_MAX})) < (j.jt, j.js)"
    shared = f"""SELECT v.room_id, v.start_topological, v.start_stream,
                   CASE WHEN {before_join} THEN coalesce(v.end_topological, {_MAX}) ELSE j.jt END AS end_topological,
                   CASE WHEN {before_join} THEN coalesce(v.end_stream, {_MAX}) ELSE j.js - 1 END AS end_stream,
                   {late} AS late
            FROM {latest_join(room)} j JOIN room_visibility_ranges v
                 ON v.room_id = {room} AND v.user_id = '*shared'
                    AND (v.start_topological, v.start_stream) < (j.jt, j.js) {range_filter}"""
    if since is not None:
        shared += f"""
            WHERE j.js > {since} OR {since} < 0
               OR {late} > {since}"""
    # The user's and the world's walks first. Only what is newer than their limit-th event
    # can still make the page, so ``*shared``'s walks stop there: going down the window they
    # pass every event after the user's join before the first one before it (a user who
    # joined inside the window: ~4,000 rows read and dropped per sync, docs/benchmarks.md).
    # That bound is the stream ordering the answer already reaches, not the
    # join's: by key, events before the join may come later in the stream (forks, backfill).
    floor = f"""coalesce((SELECT DISTINCT o.stream_ordering FROM ow o ORDER BY o.stream_ordering DESC
                          OFFSET ({limit}) - 1 LIMIT 1), CAST({-_MAX - 1} AS BIGINT))"""
    return f"""(
        WITH ow AS MATERIALIZED ({walks(own)})
        SELECT DISTINCT ON (z.stream_ordering) z.* FROM (
            SELECT * FROM ow
            UNION ALL
            {walks(shared, f"AND e.stream_ordering > {floor}")}) z
        ORDER BY z.stream_ordering DESC LIMIT {limit})"""


def visible_events_sqlite(room: str, *, order: str, event_filter: str = "", limit: str = "%(limit)s") -> str:
    """SQLite's :func:`visible_events` (no LATERAL, no DISTINCT ON): the room's events in
    ``order`` along the (room_id, topological_ordering, stream_ordering) index, each checked
    with :func:`visible_clause` (the latest join looked up once: it names the room, not the
    row), up to ``limit`` (one room per query: the syncs loop over rooms)."""
    direction = {"b": "DESC", "f": "ASC", "s": "DESC"}[order]
    key = ("e.stream_ordering {d}" if order == "s"
           else "e.topological_ordering {d}, e.stream_ordering {d}").format(d=direction)
    return f"""(
        SELECT {_COLUMNS} FROM events e
        WHERE e.room_id = {room} AND NOT e.outlier AND NOT e.rejected {event_filter} AND {visible_clause(room)}
        ORDER BY {key} LIMIT {limit})"""



class NotFound(LookupError):
    """No such event or room for this user (unknown, or not visible to them)."""


@dataclass(slots=True)
class EventRow:
    event_id: str
    room_id: str
    topological_ordering: int
    stream_ordering: int
    json: bytes
    type: str = ""
    #: None for an event that is not a state event
    state_key: str | None = None

    @property
    def token(self) -> RoomStreamToken:
        return RoomStreamToken(self.stream_ordering, self.topological_ordering)


@contextlib.contextmanager
def _timeline_cursor(using: str) -> Iterator[Any]:
    """A cursor for the timeline queries, in a transaction planned without bitmap scans and
    with sorts only where nothing else gives the order.

    The planner cannot know how many events a visibility range holds (it guesses a
    handful), so it reads a range with a bitmap scan and sorts it -- every event of a big
    room's open range. Without bitmap scans it walks the (room, topological, stream) index
    in order and stops at the limit: 71 -> 13 ms for 100 rooms x 20 events. For the same
    reason it sorts all the events a user's ranges yield rather than sorting range by range
    and stopping at the limit (an incremental sort; see :func:`visible_events`):
    ``enable_sort = off`` makes it take the incremental sort, and leaves the sorts nothing
    else can replace (their inflated cost would start JIT compilation: ``jit = off``). (SQLite
    has neither; its transaction gives the reads one snapshot as well.)
    """
    with transaction.atomic(using=using), store_cursor(using) as cur:
        if not is_sqlite(cur):
            cur.execute("SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off; SET LOCAL jit = off")
        yield cur


def _hashed_id_rooms(cur: Any, caches: StorageCaches, room_ids: Iterable[str]) -> set[str]:
    """Which of ``room_ids`` hold events carrying no ``event_id`` field (authorized rooms of
    v3+: the ID is a hash). Cached per room (a room's version never changes); the rooms not
    cached yet are read in one query."""
    rooms = set(room_ids)
    known = caches.hashed_id_rooms.get_many(rooms)
    hashed = {room_id for room_id, is_hashed in known.items() if is_hashed}
    missing = [room_id for room_id in rooms if room_id not in known]
    if missing:
        cur.execute(f"SELECT room_id, room_version, authorized FROM rooms WHERE {in_array(cur, 'room_id')}",
                    [array(cur, missing)])
        found = {room_id: bool(authorized) and _ids_are_hashes(version) for room_id, version, authorized in cur.fetchall()}
        for room_id in missing:
            if found.get(room_id, False):
                hashed.add(room_id)
            caches.hashed_id_rooms.put(room_id, found.get(room_id, False))
    return hashed


def _ids_are_hashes(version: str | None) -> bool:
    if version is None:
        return False
    try:
        return room_version(version).event_ids_are_hashes
    except UnknownRoomVersion:
        return False


def with_event_id(raw: bytes, event_id: str) -> bytes:
    """``raw`` (a JSON object) with ``event_id`` first: clients need the ID, which v3+ PDUs do
    not carry. Spliced in, the rest of the bytes untouched."""
    # v3+ IDs are "$" and unpadded base64: nothing to escape (json.dumps for anything else).
    # Checked with str methods, not a regular expression: a sync splices ~1,700 of them.
    if event_id.isascii() and event_id.isprintable() and '"' not in event_id and "\\" not in event_id:
        quoted = b'"' + event_id.encode() + b'"'
    else:
        quoted = json.dumps(event_id).encode()
    if raw[:1] == b"{" and raw[1:2] not in (b"}", b" ", b"\t", b"\n", b"\r"):
        # stored compact (every row this store writes): one copy of the bytes, not three
        return b"".join((b'{"event_id":', quoted, b",", memoryview(raw)[1:]))
    body = raw.lstrip()
    return b'{"event_id":' + quoted + (b"," if body[1:].lstrip()[:1] != b"}" else b"") + body[1:]


def _rows(rows: Iterable[Sequence[Any]], cur: Any, caches: StorageCaches, *, prefixed: bool = False) -> list[EventRow]:
    """Rows of :data:`_COLUMNS` (after one leading column if ``prefixed``) as :class:`EventRow` objects:
    pruned when redacted, with the ``event_id`` spliced in where the room's events lack it.
    A sync returns ~2,000 of them: one pass, no per-row copies."""
    rows = rows if isinstance(rows, list) else list(rows)
    hashed = _hashed_id_rooms(cur, caches, (r[prefixed + 1] for r in rows)) if rows else set()
    out: list[EventRow] = []
    append = out.append
    for r in rows:
        if prefixed:
            _, event_id, room_id, topological, stream, raw, redacted, event_type, state_key = r
        else:
            event_id, room_id, topological, stream, raw, redacted, event_type, state_key = r
        if redacted:
            raw = client_json(bytes(raw), redacted)
        if room_id in hashed:
            raw = with_event_id(raw, event_id)
        append(EventRow(event_id, room_id, topological, stream, bytes(raw), event_type, state_key))
    return out


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")
    return limit


def current_token(cursor: Any) -> int:
    """The highest stream position below which every event has committed (never look past it)."""
    cursor.execute("SELECT coalesce(max(stream_ordering), 0) FROM events")
    top = cursor.fetchone()[0]
    cursor.execute("SELECT stream_ids FROM stream_reservations WHERE stream_name = 'events'")
    pending = [i for (ids,) in cursor.fetchall() for i in json_list(ids)]
    return min([top] + [i - 1 for i in pending]) if pending else top


# -- single events and state ------------------------------------------------------------------

def _visible(cursor: Any, event_id: str, user_id: str) -> bool:
    cursor.execute(f"SELECT 1 FROM events e WHERE e.event_id = %(event)s AND NOT e.outlier AND NOT e.rejected "
                   f"AND {VISIBLE}", {"event": event_id, "user": user_id})
    return cursor.fetchone() is not None


def get_event(event_id: str, *, user_id: str | None = None, runtime: Any = None) -> EventRow:
    caches = storage_caches(runtime)
    with store_cursor(caches.using) as cur:
        cur.execute(f"SELECT {_COLUMNS} FROM events e WHERE e.event_id = %s AND NOT e.outlier AND NOT e.rejected",
                    [event_id])
        row = cur.fetchone()
        if row is None or (user_id is not None and not _visible(cur, event_id, user_id)):
            raise NotFound(f"event {event_id} not found")
        return _rows([row], cur, caches)[0]


def state_at_event(event_id: str, *, user_id: str | None = None, runtime: Any = None) -> StateMap:
    """The room state after ``event_id`` (before it, for a rejected event), walking the delta
    chain of its state group; groups and event->group are cached (they never change)."""
    caches = storage_caches(runtime)
    with store_cursor(caches.using) as cur:
        if user_id is not None and not _visible(cur, event_id, user_id):
            raise NotFound(f"event {event_id} not found")
        group = caches.event_group.get(event_id)
        if group is None:
            cur.execute("SELECT state_group FROM event_to_state_groups WHERE event_id = %s", [event_id])
            row = cur.fetchone()
            if row is None:
                raise NotFound(f"no state known at {event_id} (unknown event or outlier)")
            group = row[0]
            caches.event_group.put(event_id, group)
        return caches.state.get_state(cur, group)


# -- room history -----------------------------------------------------------------------------

def room_messages(room_id: str, user_id: str, *, from_token: RoomStreamToken | None = None,
                  direction: str = "b", limit: int = 10, runtime: Any = None) -> dict[str, Any]:
    """A page of the room's history in (topological, stream) order, from a token.

    Backwards the next token is ``t{last.topo}-{last.stream - 1}``, forwards
    ``t{last.topo}-{last.stream}``; ``end`` is None when the history is exhausted.
    """
    if direction not in ("b", "f"):
        raise ValueError("dir must be 'b' or 'f'")
    limit = _limit(limit)
    params: dict[str, Any] = {"room": room_id, "user": user_id, "limit": limit + 1}
    bound = range_bound = ""
    by_key = from_token is not None and from_token.topological is not None
    if from_token is not None:
        params["s"] = from_token.stream
        params["t"] = from_token.topological
        if by_key and direction == "f":
            after = _key_after(from_token.topological, from_token.stream)
            if after is None:  # nothing can come after the last key
                return {"chunk": [], "start": from_token, "end": None}
            params["ft"], params["fs"] = after
        if from_token.topological is None:
            bound = "AND e.stream_ordering <= %(s)s" if direction == "b" else "AND e.stream_ordering > %(s)s"
        elif direction == "b":
            bound = "AND (e.topological_ordering, e.stream_ordering) <= (%(t)s, %(s)s)"
            range_bound = "AND (v.start_topological, v.start_stream) <= (%(t)s, %(s)s)"
        else:
            bound = "AND (e.topological_ordering, e.stream_ordering) > (%(t)s, %(s)s)"
            range_bound = ("AND (coalesce(v.end_topological, %s), coalesce(v.end_stream, %s)) > (%%(t)s, %%(s)s)"
                           % (_MAX, _MAX))
    caches = storage_caches(runtime)
    with _timeline_cursor(caches.using) as cur:
        if is_sqlite(cur):
            page = visible_events_sqlite("%(room)s", order=direction, event_filter=bound)
        else:
            # the token bounds each walk's index scan (from_token), not a filter after it
            page = visible_events("%(room)s", order=direction, range_filter=range_bound,
                                  event_filter="" if by_key else bound, from_token=by_key)
        rows = _rows(fetch_all(cur, "SELECT * FROM " + page + " y", params), cur, caches)
    more = len(rows) > limit
    rows = rows[:limit]
    end = None
    if rows and more:
        last = rows[-1]
        end = RoomStreamToken(last.stream_ordering - 1 if direction == "b" else last.stream_ordering,
                              last.topological_ordering)
    start = from_token
    if start is None and rows:
        first = rows[0]
        start = RoomStreamToken(first.stream_ordering, first.topological_ordering)
    return {"chunk": rows, "start": start, "end": end}


def room_known(room_id: str, runtime: Any = None) -> bool:
    """Whether the store holds any event of the room (its ``rooms`` row): an unknown room is
    "not found", where a known one whose events a user may not see is an empty page."""
    with store_cursor(storage_caches(runtime).using) as cur:
        return bool(fetch_all(cur, "SELECT 1 FROM rooms WHERE room_id = %(room)s", {"room": room_id}))


def topological_events(room_id: str, *, user_id: str | None = None, from_token: RoomStreamToken | None = None,
                       limit: int = 100, runtime: Any = None) -> dict[str, Any]:
    """The room's events oldest first in (topological, stream) order -- the order federation
    needs. Without ``user_id`` it is the server's view (every accepted event)."""
    if user_id is not None:
        return room_messages(room_id, user_id, from_token=from_token, direction="f", limit=limit, runtime=runtime)
    limit = _limit(limit)
    params: dict[str, Any] = {"room": room_id, "limit": limit + 1}
    bound = ""
    if from_token is not None:
        params.update(t=from_token.topological if from_token.topological is not None else -1, s=from_token.stream)
        bound = "AND (e.topological_ordering, e.stream_ordering) > (%(t)s, %(s)s)"
    caches = storage_caches(runtime)
    with _timeline_cursor(caches.using) as cur:
        rows = _rows(fetch_all(
            cur, f"SELECT {_COLUMNS} FROM events e WHERE e.room_id = %(room)s AND NOT e.outlier AND NOT e.rejected "
                 f"{bound} ORDER BY e.topological_ordering, e.stream_ordering LIMIT %(limit)s", params), cur, caches)
    more = len(rows) > limit
    rows = rows[:limit]
    end = rows[-1].token if rows and more else None
    return {"chunk": rows, "start": from_token, "end": end}


# -- sync -------------------------------------------------------------------------------------

#: the user's ``rooms`` most recently active joined rooms. Each room's ``last_stream`` is
#: looked up by key (a correlated subquery): joined to ``rooms``, the planner hash-joined
#: the user's rooms against a scan of every room (10,000 at 1 M events).
_MY_ROOMS = """SELECT room_id, last_stream FROM (
                    SELECT c.room_id, (SELECT r.last_stream FROM rooms r WHERE r.room_id = c.room_id) AS last_stream
                    FROM current_state_events c
                    WHERE c.type = 'm.room.member' AND c.state_key = %(user)s AND c.membership = 'join') j
                WHERE last_stream IS NOT NULL ORDER BY last_stream DESC, room_id LIMIT %(rooms)s"""


def initial_sync(user_id: str, *, limit: int = 20, rooms: int = 100, runtime: Any = None) -> dict[str, Any]:
    """The latest ``limit`` visible events of each of the user's ``rooms`` most recently active
    joined rooms: one query on PostgreSQL (rooms chosen and events fetched with a LATERAL
    join), one per room on SQLite."""
    limit, rooms = _limit(limit), _limit(rooms)
    caches = storage_caches(runtime)
    with _timeline_cursor(caches.using) as cur:
        now = current_token(cur)
        params = {"user": user_id, "rooms": rooms, "now": now, "limit": limit + 1}
        in_window = "AND e.stream_ordering <= %(now)s"
        if is_sqlite(cur):
            cur.execute(_MY_ROOMS, params)
            rows = _per_room(cur, [(room_id, last_stream) for room_id, last_stream in cur.fetchall()], params,
                             order="b", event_filter=in_window)
        else:
            rows = fetch_all(cur, f"""WITH my_rooms AS (
                    {_MY_ROOMS})
                SELECT m.last_stream, {_Y_COLUMNS} FROM my_rooms m CROSS JOIN LATERAL
                    {visible_events("m.room_id", order="b", event_filter=in_window)} y
                ORDER BY m.last_stream DESC, m.room_id""", params)
        out = _with_state(cur, caches, _group_timelines(cur, caches, rows, limit, historic=True), since=None, now=now)
    return {"next_batch": RoomStreamToken(now), "rooms": out, "membership_changes": []}


def _per_room(cur: Any, rooms: Sequence[tuple[str, Any]], params: dict[str, Any], *, order: str,
              event_filter: str) -> list[tuple[Any, ...]]:
    """SQLite's LATERAL join: one query per (room, prefix), each row prefixed with ``prefix``
    (the column the PostgreSQL query puts first) so :func:`_group_timelines` reads both alike."""
    sql = "SELECT * FROM " + visible_events_sqlite("%(room)s", order=order, event_filter=event_filter) + " y"
    out: list[tuple[Any, ...]] = []
    for room_id, prefix in rooms:
        cur.execute(sql, {**params, "room": room_id})
        out.extend((prefix, *r) for r in cur.fetchall())
    return out


def _group_timelines(cur: Any, caches: StorageCaches, rows: Sequence[Sequence[Any]], limit: int, *,
                     historic: bool) -> dict[str, dict[str, Any]]:
    # Each room's rows newest first, up to ``limit + 1``: the extra one only says "limited".
    # Grouped as they are, and only the rows returned made events, oldest first (a sync
    # makes ~2,000 of them: no dict per row, no work for the extra ones).
    per_room: dict[str, list[Sequence[Any]]] = {}
    for r in rows:
        room_rows = per_room.get(r[2])  # the event's room (after the leading column)
        if room_rows is None:
            per_room[r[2]] = [r]
        else:
            room_rows.append(r)
    kept: list[Sequence[Any]] = []
    for room_rows in per_room.values():
        kept.extend(reversed(room_rows[:limit]))  # oldest first, as clients expect
    events = _rows(kept, cur, caches, prefixed=True)
    out: dict[str, dict[str, Any]] = {}
    start = 0
    for room_id, room_rows in per_room.items():
        end = start + min(len(room_rows), limit)
        first = events[start]
        out[room_id] = {
            "events": events[start:end],
            "limited": len(room_rows) > limit,
            "prev_batch": (RoomStreamToken(first.stream_ordering - 1, first.topological_ordering) if historic
                           else RoomStreamToken(first.stream_ordering - 1)),
        }
        start = end
    return out


# -- a sync's state blocks ------------------------------------------------------------------------

#: state Synapse leaves out of a sync's ``state`` (MSC2261: aliases are not room state to clients)
_NOT_SYNCED = frozenset({"m.room.aliases"})


def state_block(*, start: StateMap, end: StateMap, previous: StateMap, timeline: StateMap,
                start_keys: Iterable[StateKey] | None, end_keys: Iterable[StateKey]) -> StateMap:
    """A room's ``state`` in a sync answer, as Synapse computes it (``_calculate_state``):
    the state events of ``start`` (after the timeline's first event) and of ``end`` (after the
    room's last event up to the answer's position) that are not in ``previous`` (after the
    room's last event up to ``since``; empty for an initial sync) nor the last of their key
    in the ``timeline``. The client overlays it on what it had and then the timeline.

    ``start_keys``/``end_keys``: the keys where ``start``/``end`` may differ from
    ``previous`` (None: all of ``start``'s), so a gap costs what changed in it. ``end``'s
    event wins a key both give (Synapse leaves that to a set's order)."""
    drop = set(timeline.values())
    out: StateMap = {}
    for source, keys in ((start, start_keys), (end, end_keys)):
        for key in (source if keys is None else keys):
            event_id = source.get(key)
            if event_id is None or event_id in drop or previous.get(key) == event_id or key[0] in _NOT_SYNCED:
                continue
            out[key] = event_id
    return out


def _last_group(room: str, at: str) -> str:
    """SQL: the state group of room ``room``'s last event at or before stream position ``at``
    (outliers and rejected events aside: Synapse's ``get_state_ids_at``)."""
    return f"""(SELECT g.state_group FROM event_to_state_groups g WHERE g.event_id = (
        SELECT e.event_id FROM events e WHERE e.room_id = {room} AND e.stream_ordering <= {at}
          AND NOT e.outlier AND NOT e.rejected ORDER BY e.stream_ordering DESC LIMIT 1))"""


def _group_columns(room: str, first: str, end: str, since: bool) -> str:
    return (f"(SELECT g.state_group FROM event_to_state_groups g WHERE g.event_id = {first}), "
            f"{_last_group(room, '%(since)s') if since else 'NULL'}, {_last_group(room, end)}")


def _newly_joined(cur: Any, user_id: str, rooms: set[str], since: int) -> set[str]:
    """Which of ``rooms`` (where the user joined after ``since``) they were not joined to at
    ``since``: Synapse's newly joined rooms, whose state is told whole."""
    cur.execute(f"SELECT room_id, membership FROM room_memberships WHERE user_id = %s AND event_stream_ordering <= %s "
                f"AND {in_array(cur, 'room_id')} ORDER BY event_stream_ordering", [user_id, since, array(cur, rooms)])
    at_since = dict(cur.fetchall())  # (the latest per room wins)
    return {room_id for room_id in rooms if at_since.get(room_id) != "join"}


def _with_state(cur: Any, caches: StorageCaches, timelines: dict[str, dict[str, Any]], *, since: int | None,
                now: int, ends: dict[str, int] | None = None,
                fresh: set[str] | frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """Each room's answer in Matrix's shape, ``{"timeline": {...}, "state": {"events": [...]}}``,
    its state block from three state groups per room (the timeline's first event's, and the
    room's at ``since`` and at its end: ``now``, or ``ends[room]`` for a room the user left,
    so nothing after their leave is told; one query for all rooms, one per room on SQLite)
    and the deltas between them; the state events read in one query. A ``fresh`` room (joined
    since the token) gets its whole state, as in an initial sync."""
    if not timelines:
        return {}
    ends = ends or {}
    params: dict[str, Any] = {"since": since}
    firsts = {room_id: t["events"][0].event_id for room_id, t in timelines.items()}
    if is_sqlite(cur):
        groups = []
        for room_id, first in firsts.items():
            cur.execute(f"SELECT %(room)s, {_group_columns('%(room)s', '%(first)s', '%(end)s', since is not None)}",
                        {**params, "room": room_id, "first": first, "end": ends.get(room_id, now)})
            groups.extend(cur.fetchall())
    else:
        rooms_sql, params["rooms"] = text_list(cur, list(firsts), "%(rooms)s")
        firsts_sql, params["firsts"] = text_list(cur, list(firsts.values()), "%(firsts)s")
        params["ends"] = ",".join(str(ends.get(room_id, now)) for room_id in firsts)
        groups = fetch_all(cur, f"""SELECT m.room_id, {_group_columns("m.room_id", "m.first_id", "m.end_at",
                                                                      since is not None)}
            FROM unnest({rooms_sql}, {firsts_sql}, CAST(string_to_array(%(ends)s, ',') AS bigint[]))
                 AS m(room_id, first_id, end_at)""", params)
    store = caches.state
    blocks: dict[str, StateMap] = {}
    for room_id, first_group, previous_group, end_group in groups:
        timeline: StateMap = {(e.type, e.state_key): e.event_id for e in timelines[room_id]["events"]
                              if e.state_key is not None}
        if first_group is None or end_group is None:  # (no state known: nothing to say)
            blocks[room_id] = {}
            continue
        if (since is not None and previous_group is not None and room_id not in fresh
                and first_group == previous_group == end_group):
            blocks[room_id] = {}  # no state changed in the gap: nothing read
            continue
        start, end = store.get_state(cur, first_group), store.get_state(cur, end_group)
        if since is None or previous_group is None or room_id in fresh:
            blocks[room_id] = state_block(start=start, end=end, previous={}, timeline=timeline, start_keys=None,
                                          end_keys=store.changed_keys(cur, first_group, end_group))
        else:
            blocks[room_id] = state_block(
                start=start, end=end, previous=store.get_state(cur, previous_group), timeline=timeline,
                start_keys=store.changed_keys(cur, previous_group, first_group),
                end_keys=store.changed_keys(cur, previous_group, end_group))
    wanted = sorted({e for block in blocks.values() for e in block.values()})
    events: dict[str, EventRow] = {}
    if wanted:
        if is_sqlite(cur):
            sql, param = f"SELECT {_COLUMNS} FROM events e WHERE {in_array(cur, 'e.event_id')}", array(cur, wanted)
        else:
            # one index probe per ID (``OFFSET 0`` keeps the lateral subquery a loop): as
            # ``event_id = ANY(...)`` the planner, expecting thousands of rows, scanned the
            # whole table
            ids, param = text_list(cur, wanted)
            sql = (f"SELECT x.* FROM unnest({ids}) AS w(event_id) CROSS JOIN LATERAL ("
                   f"SELECT {_COLUMNS} FROM events e WHERE e.event_id = w.event_id OFFSET 0) x")
        events = {row.event_id: row for row in _rows(fetch_all(cur, sql, [param]), cur, caches)}
    return {room_id: {"timeline": timeline_,
                      "state": {"events": [events[e] for _, e in sorted(blocks.get(room_id, {}).items())
                                           if e in events]}}
            for room_id, timeline_ in timelines.items()}


def _rooms_changed(cur: Any, cache: StreamChangeCache, rooms: set[str], since: int) -> set[str]:
    """The ``rooms`` with a live event after stream position ``since``. The change cache
    answers without a query when it reaches back that far; before its horizon it can only say
    "all of them" (Synapse's semantics), and a sync from an old token then read every joined
    room (300 rooms for a typical power user at 10 M events, half of them with nothing new:
    docs/benchmarks.md), so the rooms' ``last_stream`` column decides instead."""
    if since >= cache.earliest_known_position:
        return cache.get_entities_changed(rooms, since)
    if not rooms:
        return set()
    cur.execute(f"SELECT room_id FROM rooms WHERE {in_array(cur, 'room_id')} AND last_stream > %s",
                [array(cur, rooms), since])
    return {r[0] for r in cur.fetchall()}


def incremental_sync(user_id: str, since: RoomStreamToken, *, limit: int = 10,
                     runtime: Any = None) -> dict[str, Any]:
    """What is new for the user after ``since``: visible events in rooms they are in (rooms
    with no change since then are skipped by the room change cache without a query) and their
    membership changes in any room (invites included)."""
    limit = _limit(limit)
    caches = storage_caches(runtime)
    change = caches.change
    with _timeline_cursor(caches.using) as cur:
        now = current_token(cur)
        change.refresh(cur, now)
        assert change.rooms is not None and change.members is not None
        cur.execute("SELECT room_id FROM current_state_events WHERE type = 'm.room.member' AND state_key = %s "
                    "AND membership = 'join'", [user_id])
        joined = {r[0] for r in cur.fetchall()}
        #: the rooms the user is not in now: their state ends at the user's last membership
        #: change (a leave, a ban, an invite), not at ``now``
        ends: dict[str, int] = {}
        memberships = []
        if change.members.has_entity_changed(user_id, since.stream):
            changes = fetch_all(
                cur, "SELECT m.room_id, m.event_id, m.membership, m.event_stream_ordering, e.json, "
                     f"{REDACTED_VERSION}, e.type, e.state_key "
                     "FROM room_memberships m JOIN events e USING (event_id) WHERE m.user_id = %s "
                     "AND m.event_stream_ordering > %s AND m.event_stream_ordering <= %s "
                     "ORDER BY m.event_stream_ordering", [user_id, since.stream, now])
            # one _rows for them all: its rooms' look-up is one query (per change, a power
            # user's ~170 joins in the window cost a query each)
            events = _rows([(eid, room_id, 0, stream, raw, redacted, event_type, state_key)
                            for room_id, eid, _, stream, raw, redacted, event_type, state_key in changes], cur, caches)
            for (room_id, eid, membership, stream, *_), event in zip(changes, events):
                memberships.append({"room_id": room_id, "event_id": eid, "membership": membership,
                                    "stream_ordering": stream, "event": event.json})
                if room_id not in joined or room_id in ends:
                    ends[room_id] = stream
                joined.add(room_id)  # left or invited since: the events up to then may be visible
        joins = {m["room_id"] for m in memberships if m["membership"] == "join"} - set(ends)
        newly_joined = _newly_joined(cur, user_id, joins, since.stream) if joins else set()
        changed = sorted(_rooms_changed(cur, change.rooms, joined, since.stream))
        out: dict[str, dict[str, Any]] = {}
        if changed and since.stream < now:
            params = {"user": user_id, "since": since.stream, "now": now, "limit": limit + 1}
            new_events = "AND e.stream_ordering > %(since)s AND e.stream_ordering <= %(now)s"
            if is_sqlite(cur):
                rows = _per_room(cur, [(r, r) for r in changed], params, order="s", event_filter=new_events)
            else:
                # each room's mark read once, beside it (``rm``), not by each of the places
                # that name it: 37,623 -> 21,991 buffers for a power user's 622 changed
                # rooms at 10 M
                rows = fetch_all(
                    cur, f"""SELECT m.room_id, {_Y_COLUMNS} FROM unnest(%(rooms)s::text[]) AS m(room_id)
                    CROSS JOIN LATERAL (SELECT {room_late_stream("m.room_id")} AS late_stream OFFSET 0) rm
                    CROSS JOIN LATERAL {visible_events("m.room_id", order="s", event_filter=new_events,
                                                       since="%(since)s", late="rm.late_stream")} y""",
                    {**params, "rooms": changed})
            timelines = _group_timelines(cur, caches, rows, limit, historic=False)
            for room_id in newly_joined & timelines.keys():
                timelines[room_id]["limited"] = True  # (Synapse's: the history before the join is a gap)
            out = _with_state(cur, caches, timelines, since=since.stream, now=now, ends=ends, fresh=newly_joined)
    return {"next_batch": RoomStreamToken(now), "rooms": out, "membership_changes": memberships,
            "rooms_checked": len(changed)}


def sync(user_id: str, *, since: RoomStreamToken | None = None, limit: int = 10, rooms: int = 100,
         runtime: Any = None) -> dict[str, Any]:
    if since is None:
        return initial_sync(user_id, limit=limit, rooms=rooms, runtime=runtime)
    return incremental_sync(user_id, since, limit=limit, runtime=runtime)

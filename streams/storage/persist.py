"""``persist_events``: the one write path of room events.

One call = one transaction inside the stream-ID context of the ``events`` writer (or the
``backfill`` writer, whose IDs are negative): orderings, DAG edges and extremities, state
groups, current state and membership, visibility ranges, redactions, and the ``events``
stream rows (``ev`` and ``state``), so replication sees the events when the transaction
completes. Any bad event raises :class:`BadEvent` and nothing is written.

Speed: a batch costs a fixed number of statements whatever its size (look-ups by
``= ANY(array)``, inserts by ``unnest``; on SQLite ``json_each`` and ``executemany``, see
``sql.py``); per-room context (current state, extremities,
visibility ranges) stays in memory between batches and is checked against the ``rooms`` row,
so the common case -- a new message at the end of a room -- reads and writes almost nothing
beyond its own rows. Design notes: docs/storage.md.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..matrix.chain_cover import IndexEvent
from ..models import CurrentStateDelta, Event
from .authorization import MatrixEvents, ResolvedStates, RoomInfos, authorize, redaction_applies, resolve_state
from .chain_cover import ChainEvent, index_events
from .events import (
    CREATE,
    HISTORY_VISIBILITY,
    MEMBER,
    BadEvent,
    IncomingEvent,
    ParsedEvent,
    RoomInfo,
    StateKey,
    StateMap,
    parse_events,
)
from .redactions import mark_redacted
from .sql import array, delete_rows, for_update, in_array, insert_rows, is_sqlite, pipeline, store_cursor
from .state_groups import NewGroup, StateGroupStore, resolve
from .visibility import (
    ANYONE,
    SHARED_ERAS,
    RangeSet,
    grants,
    normalise_visibility,
    shared_era,
    visible_to_member,
)

Key = tuple[int, int]
HV_KEY: StateKey = (HISTORY_VISIBILITY, "")


@dataclass
class PersistedEvent:
    event_id: str
    room_id: str
    stream_ordering: int
    topological_ordering: int
    state_group: int | None


@dataclass
class RoomContext:
    """What the persist path knows about a room between batches (valid while the ``rooms`` row
    still says ``version``)."""

    room_id: str
    head: Key | None = None
    last_stream: int = 0
    min_depth: int | None = None
    current_group: int | None = None
    current_chain: int | None = None
    #: current state, owned by this context (changed in place on the fast path)
    current: StateMap = field(default_factory=dict)
    memberships: dict[str, str] = field(default_factory=dict)
    visibility: str = "shared"
    #: forward extremities: event_id -> (key, state group after it)
    forward: dict[str, tuple[Key, int | None]] = field(default_factory=dict)
    #: visibility ranges per user (``*`` and ``*shared`` included)
    ranges: dict[str, RangeSet] = field(default_factory=dict)
    #: each user's latest join key
    last_join: dict[str, Key] = field(default_factory=dict)
    #: the room's version and whether its events are authorized (None: no create event yet)
    info: RoomInfo | None = None

    @property
    def version(self) -> tuple[Any, ...]:
        return (self.head, self.current_group, self.last_stream)

    def user_ranges(self, user: str) -> RangeSet:
        rs = self.ranges.get(user)
        if rs is None:
            rs = self.ranges[user] = RangeSet()
        return rs


class _EventFacts:
    """event_id -> (membership, history_visibility value) of state events, cached: the
    visibility rules need them for whatever state an event is checked against."""

    def __init__(self, size: int = 500_000) -> None:
        self._d: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        self.size = size

    def put(self, event_id: str, membership: str | None, visibility: str | None) -> None:
        self._d[event_id] = (membership, visibility)
        if len(self._d) > self.size:
            for _ in range(self.size // 10):
                self._d.popitem(last=False)

    def ensure(self, cursor: Any, event_ids: Sequence[str]) -> None:
        # least recently *used* goes first (a room's members are asked about again and again;
        # by insertion order they aged out of the cache and were read back batch after batch)
        d = self._d
        missing = []
        for e in set(event_ids):
            if e in d:
                d.move_to_end(e)
            else:
                missing.append(e)
        if not missing:
            return
        import json

        cursor.execute(
            "SELECT event_id, membership, CASE WHEN type = %s THEN json END FROM events WHERE "
            + in_array(cursor, "event_id"), [HISTORY_VISIBILITY, array(cursor, missing)],
        )
        for eid, membership, raw in cursor.fetchall():
            vis = None
            if raw is not None:
                content = json.loads(bytes(raw)).get("content") or {}
                vis = normalise_visibility(content.get("history_visibility"))
            self.put(eid, membership, vis)

    def membership(self, event_id: str | None) -> str | None:
        if event_id is None:
            return None
        return self._d.get(event_id, (None, None))[0]

    def visibility(self, event_id: str | None) -> str:
        if event_id is None:
            return "shared"
        return self._d.get(event_id, (None, "shared"))[1] or "shared"


class EventPersister:
    """Persists batches of events for one process (it holds the caches)."""

    def __init__(self, room_cache_size: int = 20_000) -> None:
        self.state = StateGroupStore()
        self.facts = _EventFacts()
        self.room_infos = RoomInfos()
        self.matrix = MatrixEvents(self.room_infos)
        self.resolved = ResolvedStates()
        self._rooms: OrderedDict[str, RoomContext] = OrderedDict()
        self._room_cache_size = room_cache_size
        self._lock = threading.Lock()
        #: called after commit with [(room_id, stream)], [(user_id, stream)] (change caches)
        self.on_commit: list[Callable[[list[tuple[str, int]], list[tuple[str, int]]], None]] = []

    # -- entry point ------------------------------------------------------------------------

    def persist(self, items: Sequence[IncomingEvent | bytes | str], writer: Any, *, backfill: bool) -> list[PersistedEvent]:
        with self._lock:
            self.room_infos.using = writer.using
            try:
                events = parse_events(items, self.room_infos)
            except BaseException:
                self.room_infos.discard()
                raise
            if not events:
                return []
            touched_rooms = {ev.room_id for ev in events}
            try:
                with writer.transaction(len(events)) as ids:
                    batch = _Batch(self, events, ids, backfill, writer)
                    batch.run()
            except BaseException:
                for room_id in touched_rooms:  # in-memory changes went with the rollback
                    self._rooms.pop(room_id, None)
                self.state.discard_pending()
                self.room_infos.discard()
                self.matrix.end_transaction(committed=False)
                self.resolved.clear()
                raise
            self.room_infos.commit()
            self.matrix.end_transaction(committed=True)
        room_changes = [(r, s) for r, s in batch.room_changes.items()]
        member_changes = [(u, s) for u, s in batch.member_changes.items()]
        for callback in self.on_commit:
            callback(room_changes, member_changes)
        return [PersistedEvent(ev.event_id, ev.room_id, ev.stream_ordering, ev.topological_ordering,
                               ev.state_group_after) for ev in events]

    # -- room contexts ----------------------------------------------------------------------

    def _cached(self, room_id: str) -> RoomContext | None:
        ctx = self._rooms.get(room_id)
        if ctx is not None:
            self._rooms.move_to_end(room_id)
        return ctx

    def _keep(self, ctx: RoomContext) -> None:
        self._rooms[ctx.room_id] = ctx
        self._rooms.move_to_end(ctx.room_id)
        while len(self._rooms) > self._room_cache_size:
            self._rooms.popitem(last=False)

    def load_rooms(self, cursor: Any, room_ids: Sequence[str]) -> dict[str, RoomContext]:
        """Contexts of ``room_ids`` (rows locked for this transaction); stale ones reloaded."""
        cursor.execute(
            "SELECT room_id, head_topological, head_stream, last_stream, current_state_group, min_depth, "
            "room_version, authorized "
            f"FROM rooms WHERE {in_array(cursor, 'room_id')} ORDER BY room_id{for_update(cursor)}",
            [array(cursor, room_ids)],
        )
        rows = {r[0]: r for r in cursor.fetchall()}
        out: dict[str, RoomContext] = {}
        stale: list[str] = []
        for room_id in room_ids:
            row = rows.get(room_id)
            if row is None:
                ctx = RoomContext(room_id, info=self.room_infos.get(room_id))
                ctx.ranges[SHARED_ERAS] = RangeSet()
                out[room_id] = ctx
                continue
            head = (row[1], row[2])
            ctx = self._cached(room_id)
            if ctx is None or ctx.version != (head, row[4], row[3]):
                ctx = RoomContext(room_id, head=head, last_stream=row[3], current_group=row[4], min_depth=row[5])
                stale.append(room_id)
            ctx.info = self.room_infos.get(room_id)
            if ctx.info is None and row[6] is not None:
                self.room_infos.load([room_id], cursor)
                ctx.info = self.room_infos.get(room_id)
            out[room_id] = ctx
        if stale:
            self._load_room_details(cursor, {r: out[r] for r in stale})
        return out

    def _load_room_details(self, cursor: Any, contexts: dict[str, RoomContext]) -> None:
        rooms = array(cursor, contexts)
        in_rooms = in_array(cursor, "room_id")
        cursor.execute(
            "SELECT room_id, type, state_key, event_id, membership FROM current_state_events WHERE " + in_rooms,
            [rooms],
        )
        hv_events = []
        for room_id, t, k, eid, membership in cursor.fetchall():
            ctx = contexts[room_id]
            ctx.current[(t, k)] = eid
            if t == MEMBER and membership is not None:
                ctx.memberships[k] = membership
                self.facts.put(eid, membership, None)
            elif t == HISTORY_VISIBILITY and k == "":
                hv_events.append(eid)
        self.facts.ensure(cursor, hv_events)
        for ctx in contexts.values():
            ctx.visibility = self.facts.visibility(ctx.current.get(HV_KEY))
        cursor.execute(
            "SELECT f.room_id, f.event_id, e.topological_ordering, e.stream_ordering, g.state_group "
            "FROM event_forward_extremities f JOIN events e USING (event_id) "
            "LEFT JOIN event_to_state_groups g USING (event_id) WHERE " + in_array(cursor, "f.room_id"), [rooms],
        )
        for room_id, eid, topo, stream, group in cursor.fetchall():
            contexts[room_id].forward[eid] = ((topo, stream), group)
        cursor.execute(
            "SELECT room_id, user_id, start_topological, start_stream, end_topological, end_stream "
            f"FROM room_visibility_ranges WHERE {in_rooms} "
            "ORDER BY room_id, user_id, start_topological, start_stream", [rooms],
        )
        for room_id, user, st, ss, et, es in cursor.fetchall():
            contexts[room_id].user_ranges(user).ranges.append([(st, ss), None if et is None else (et, es)])
        if is_sqlite(cursor):  # no DISTINCT ON: the first row of each (room, user) by a window
            cursor.execute(
                "SELECT room_id, user_id, topological_ordering, event_stream_ordering FROM ("
                "SELECT room_id, user_id, topological_ordering, event_stream_ordering, ROW_NUMBER() OVER ("
                "PARTITION BY room_id, user_id ORDER BY topological_ordering DESC, event_stream_ordering DESC) AS n "
                f"FROM room_memberships WHERE {in_rooms} AND membership = 'join') WHERE n = 1", [rooms],
            )
        else:
            cursor.execute(
                "SELECT DISTINCT ON (room_id, user_id) room_id, user_id, topological_ordering, event_stream_ordering "
                "FROM room_memberships WHERE room_id = ANY(%s) AND membership = 'join' "
                "ORDER BY room_id, user_id, topological_ordering DESC, event_stream_ordering DESC", [rooms],
            )
        for room_id, user, topo, stream in cursor.fetchall():
            contexts[room_id].last_join[user] = (topo, stream)
        for ctx in contexts.values():
            ctx.ranges.setdefault(SHARED_ERAS, RangeSet())
            if ctx.current_group is not None:
                ctx.current_chain = self.state.chain_length(cursor, ctx.current_group)


class _Batch:
    """The work of one ``persist_events`` call, inside its transaction."""

    def __init__(self, persister: EventPersister, events: list[ParsedEvent], ids: Sequence[int],
                 backfill: bool, writer: Any) -> None:
        self.p = persister
        self.events = events
        self.ids = ids
        self.backfill = backfill
        self.writer = writer
        self.by_id = {ev.event_id: ev for ev in events}
        self.groups: list[NewGroup] = []
        self.deltas: dict[str, list[dict[str, Any]]] = {}
        self.current_rows: dict[tuple[str, str, str], tuple[str, str | None, int]] = {}
        self.touched_ranges: set[tuple[str, str]] = set()
        self.fwd_changed: set[str] = set()
        self.room_changes: dict[str, int] = {}
        self.member_changes: dict[str, int] = {}
        self.now_ms = int(time.time() * 1000)

    # -- the transaction ------------------------------------------------------------------

    def run(self) -> None:
        with store_cursor(self.writer.using) as cur:
            self.cur = cur
            self.p.matrix.cursor = cur
            self._load_known()
            self.rooms = self.p.load_rooms(cur, sorted({ev.room_id for ev in self.events}))
            # What each state event of the batch says (membership, visibility value), outliers
            # included: a later event of the same batch may have them in its state, and they
            # are not in the database yet for the facts cache to load.
            for ev in self.events:
                if ev.is_state and (ev.type == MEMBER or (ev.type, ev.state_key) == HV_KEY):
                    self.p.facts.put(ev.event_id, ev.membership, normalise_visibility(
                        ev.body["content"].get("history_visibility")) if ev.type != MEMBER else None)
            for ev, sid in zip(self.events, self.ids):
                ex = ev.extra.get("ex_outlier")
                ev.stream_ordering = sid if ex is None else ex[3]
                ev.extra["stream_id"] = sid
                self._order(ev)
                if ex is not None:
                    ev.topological_ordering = ex[2]
                if not ev.outlier:
                    self._state_and_visibility(ev)
                elif ev.matrix is not None:  # an outlier: only its own auth events (spec step 4)
                    self._authorize(ev, None)
            self._redactions()
            # nothing below reads a result: send it all in one pipeline (one network wait)
            with pipeline(cur):
                self._write()

    def _load_known(self) -> None:
        wanted = set(self.by_id)
        for ev in self.events:
            wanted.update(ev.prev_events)
            if ev.redacts:
                wanted.add(ev.redacts)
            if ev.state_before:
                wanted.update(ev.state_before.values())
        self.cur.execute(
            "SELECT e.event_id, e.room_id, e.topological_ordering, e.stream_ordering, e.outlier, e.rejected, "
            "g.state_group FROM events e LEFT JOIN event_to_state_groups g USING (event_id) "
            "WHERE " + in_array(self.cur, "e.event_id"), [array(self.cur, wanted)],
        )
        self.known = {r[0]: r for r in self.cur.fetchall()}
        for eid, ev in self.by_id.items():
            row = self.known.get(eid)
            if row is None:
                continue
            if row[4] and not row[5] and not ev.outlier:
                # a stored outlier, now with its place in the room: de-outliered (Synapse's
                # ex_outlier) -- it keeps its row and stream ordering, and gains its state
                ev.extra["ex_outlier"] = row
                continue
            raise BadEvent(eid, "an event with this event_id is already stored")
        for ev in self.events:
            if ev.state_before:
                unknown = sorted(e for e in ev.state_before.values() if e not in self.known and e not in self.by_id)
                if unknown:
                    raise BadEvent(ev.event_id, f"state_before names events we do not have {unknown[:5]} "
                                                f"(persist them first, as outliers)")
        # redactions that arrived before their targets
        self.cur.execute(
            "SELECT r.redacts, e.room_id, r.event_id FROM redactions r JOIN events e ON e.event_id = r.event_id "
            f"WHERE {in_array(self.cur, 'r.redacts')} AND NOT e.rejected", [array(self.cur, self.by_id)],
        )
        for target, room_id, redaction_id in self.cur.fetchall():
            ev = self.by_id[target]
            if ev.room_id == room_id and ev.type != CREATE and self._redaction_applies(
                    self.p.matrix.get(redaction_id) if ev.matrix is not None else None, ev.matrix):
                ev.redacted = True

    def _prev_info(self, ev: ParsedEvent, prev_id: str) -> tuple[Key, int | None, bool] | None:
        """(key, state group after, usable for state) of a prev event, or None if unknown."""
        if prev_id in self.by_id:
            prev = self.by_id[prev_id]
            if prev.stream_ordering == 0:
                raise BadEvent(ev.event_id, f"prev_event {prev_id} comes later in the batch")
            if prev.room_id != ev.room_id:
                raise BadEvent(ev.event_id, f"prev_event {prev_id} is in another room")
            return prev.key, prev.state_group_after, not prev.outlier
        row = self.known.get(prev_id)
        if row is None:
            return None
        if row[1] != ev.room_id:
            raise BadEvent(ev.event_id, f"prev_event {prev_id} is in another room")
        return (row[2], row[3]), row[6], not row[4]

    def _order(self, ev: ParsedEvent) -> None:
        infos = [self._prev_info(ev, p) for p in ev.prev_events]
        ev.extra["prevs"] = infos
        known = [i for i in infos if i is not None]
        if ev.depth is not None:
            ev.topological_ordering = ev.depth
        elif len(known) == len(infos) or ev.outlier:
            ev.topological_ordering = min(max((i[0][0] for i in known), default=0) + 1, 2**53 - 1)
        else:
            raise BadEvent(ev.event_id, "no 'depth' and prev_events we do not have")

    # -- state --------------------------------------------------------------------------------

    def _state_and_visibility(self, ev: ParsedEvent) -> None:
        ctx = self.rooms[ev.room_id]
        cur = self.cur
        infos = ev.extra["prevs"]
        usable = [i for i in infos if i is not None and i[2]]
        state_known = len(usable) == len(infos)
        if ev.state_before is None and not state_known:
            if not self.backfill and not ev.rejected_reason:
                missing = [p for p, i in zip(ev.prev_events, infos) if i is None or not i[2]]
                raise BadEvent(ev.event_id, f"unknown prev_events {missing} (send state_before, or persist them first)")
            raise BadEvent(ev.event_id, "prev_events we do not have: a backfilled event then needs state_before")
        # the state before the event
        before_map: StateMap
        if ev.state_before is not None:
            before_map = ev.state_before
            g = self.p.state.new_group(cur, room_id=ev.room_id, event_id=ev.event_id, parent=None,
                                       parent_chain_length=None, delta={}, full_state=lambda: before_map)
            self.groups.append(g)
            before_group: int | None = g.id
            before_chain: int | None = 1
            self.p.state.remember(g.id, before_map)
        else:
            groups = {i[1] for i in usable}
            if not usable:
                before_group, before_chain, before_map = None, None, {}
            elif len(groups) == 1:
                before_group = next(iter(groups))
                if before_group == ctx.current_group and before_group is not None:
                    before_map, before_chain = ctx.current, ctx.current_chain
                elif before_group is None:
                    before_map, before_chain = {}, None
                else:
                    before_map = self.p.state.get_state(cur, before_group)
                    before_chain = self.p.state.chain_length(cur, before_group)
            else:
                resolved = self._resolve(ctx, [(i[0], i[1]) for i in usable])
                # the parent of the new group: any prev's group will do (the latest by key keeps
                # deltas small); its number says nothing about order
                base_key, base_group = max((i[0], i[1]) for i in usable)
                base_map = self._state_of(ctx, base_group)
                added = {k: v for k, v in resolved.items() if base_map.get(k) != v}
                dropped = any(k not in resolved for k in base_map)  # a delta cannot remove a key
                if not added and not dropped:
                    before_group, before_map = base_group, base_map
                    before_chain = self.p.state.chain_length(cur, base_group) if base_group is not None else None
                else:
                    parent = None if dropped else base_group
                    g = self.p.state.new_group(
                        cur, room_id=ev.room_id, event_id=ev.event_id, parent=parent,
                        parent_chain_length=self.p.state.chain_length(cur, parent) if parent else None,
                        delta=added, full_state=lambda: resolved)
                    self.groups.append(g)
                    self.p.state.remember(g.id, resolved)
                    before_group, before_chain, before_map = g.id, g.chain_length, resolved
        ev.state_group_before = before_group
        if ev.matrix is not None:
            self._authorize(ev, before_map)
        live = not self.backfill
        fast = (live and not ev.rejected_reason and before_group == ctx.current_group
                and (before_group is not None or ctx.head is None) and (ctx.head is None or ev.key > ctx.head))
        accepted = not ev.rejected_reason
        # the state after it
        key = (ev.type, ev.state_key) if ev.is_state else None
        if key is not None and accepted:
            self.p.facts.put(ev.event_id, ev.membership, normalise_visibility(
                ev.body["content"].get("history_visibility")) if key == HV_KEY else None)
        # the facts the visibility rules need about the state before the event
        if not fast:
            self.p.facts.ensure(cur, [e for (t, _), e in before_map.items() if t == MEMBER or (t, _) == HV_KEY])
        vis_before = ctx.visibility if fast else self.p.facts.visibility(before_map.get(HV_KEY))
        member_before = None
        if ev.type == MEMBER:
            member_before = (ctx.memberships.get(ev.state_key) if fast
                             else self.p.facts.membership(before_map.get((MEMBER, ev.state_key))))
        if key is not None and accepted:
            delta = {key: ev.event_id}
            if fast:
                def full() -> StateMap:
                    return ctx.current  # already includes the new key (set below before any read)
                prev_current = ctx.current.get(key)
                ctx.current[key] = ev.event_id
                g = self.p.state.new_group(cur, room_id=ev.room_id, event_id=ev.event_id, parent=before_group,
                                           parent_chain_length=before_chain, delta=delta, full_state=full,
                                           hint=len(self.events))
                after_map = ctx.current
            else:
                after_map = dict(before_map)
                after_map[key] = ev.event_id
                g = self.p.state.new_group(cur, room_id=ev.room_id, event_id=ev.event_id, parent=before_group,
                                           parent_chain_length=before_chain, delta=delta,
                                           full_state=lambda: after_map, hint=len(self.events))
                self.p.state.remember(g.id, after_map)
            self.groups.append(g)
            ev.state_group_after, after_chain = g.id, g.chain_length
        else:
            after_map, ev.state_group_after, after_chain = before_map, before_group, before_chain
        if not accepted:
            return
        # ordering bookkeeping
        if live:
            ctx.head = ev.key if ctx.head is None or ev.key > ctx.head else ctx.head
            ctx.last_stream = max(ctx.last_stream, ev.stream_ordering)
            self.room_changes[ev.room_id] = ev.stream_ordering
            for p in ev.prev_events:
                ctx.forward.pop(p, None)
            ctx.forward[ev.event_id] = (ev.key, ev.state_group_after)
            self.fwd_changed.add(ev.room_id)
        elif ctx.head is None:
            ctx.head = ev.key
        ctx.min_depth = ev.topological_ordering if ctx.min_depth is None else min(ctx.min_depth, ev.topological_ordering)
        if ev.type == MEMBER:
            if ev.stream_ordering > 0:
                self.member_changes[ev.state_key] = ev.stream_ordering
            if ev.membership == "join":
                prev_join = ctx.last_join.get(ev.state_key)
                if prev_join is None or ev.key > prev_join:
                    ctx.last_join[ev.state_key] = ev.key
        # current state and visibility
        if fast:
            ctx.current_group, ctx.current_chain = ev.state_group_after, after_chain
            if key is not None:
                self._current_changed(ev, key, ev.event_id, prev_current)
                if ev.type == MEMBER:
                    ctx.memberships[ev.state_key] = ev.membership
            self._visibility_fast(ctx, ev, vis_before, member_before)
            if key == HV_KEY:
                ctx.visibility = self.p.facts.visibility(ev.event_id)
        else:
            if live:
                self._recompute_current(ctx, ev)
            self._visibility_point(ctx, ev, before_map, after_map, vis_before, member_before)

    def _authorize(self, ev: ParsedEvent, before: StateMap | None) -> None:
        """The verdict of an event of an authorized room (``before``: the state before it;
        None for an outlier, checked against its own auth events only)."""
        if not ev.rejected_reason:
            ev.rejected_reason = authorize(ev.matrix, before, self.p.matrix)
        self.p.matrix.add(ev.matrix, rejected=bool(ev.rejected_reason))

    def _resolve(self, ctx: RoomContext, prevs: list[tuple[Key, int | None]]) -> StateMap:
        """The state at a fork of the prevs' ``(key, state group after)``: Matrix state
        resolution in an authorized room (v2, or v2.1 from room v12; the same groups resolve
        the same way, so the result is cached by them); the older unsigned format (and room
        v1) keeps the stand-in."""
        info = ctx.info
        if info is not None and info.authorized and info.version is not None:
            groups = [g for _, g in prevs]
            cacheable = None not in groups
            if cacheable:
                cached = self.p.resolved.get(groups)  # type: ignore[arg-type]
                if cached is not None:
                    return cached
            resolved = resolve_state(info.version, [self._state_of(ctx, g) for _, g in prevs], self.p.matrix)
            if resolved is not None:
                if cacheable:
                    self.p.resolved.put(groups, resolved)  # type: ignore[arg-type]
                return resolved
        return resolve([(k, self._state_of(ctx, g)) for k, g in prevs])

    def _state_of(self, ctx: RoomContext, group: int | None) -> StateMap:
        if group is None:
            return {}
        if group == ctx.current_group:
            return ctx.current
        return self.p.state.get_state(self.cur, group)

    def _current_changed(self, ev: ParsedEvent, key: StateKey, event_id: str | None, prev: str | None) -> None:
        """Current state changed at ``ev``: a row of current_state_events and a ``state`` row."""
        membership = self.p.facts.membership(event_id) if key[0] == MEMBER else None
        self.current_rows[(ev.room_id, key[0], key[1])] = (event_id, membership, ev.stream_ordering)
        self.deltas.setdefault(ev.event_id, []).append(
            {"room_id": ev.room_id, "type": key[0], "state_key": key[1], "event_id": event_id,
             "prev_event_id": prev})

    def _recompute_current(self, ctx: RoomContext, ev: ParsedEvent) -> None:
        """After an event off the room's linear head: current state = the resolved state of the
        forward extremities; open visibility ranges follow it."""
        if len(ctx.forward) == 1:
            ((eid, (k, group)),) = ctx.forward.items()
            new = dict(self._state_of(ctx, group))
            chain = self.p.state.chain_length(self.cur, group) if group is not None else None
        else:
            new = self._resolve(ctx, list(ctx.forward.values()))
            group, chain = None, None
        old = ctx.current
        changed: dict[StateKey, str | None] = {k: v for k, v in new.items() if old.get(k) != v}
        changed.update({k: None for k in old if k not in new})  # only after a fork: a key can go
        self.p.facts.ensure(self.cur, [v for v in changed.values() if v is not None])
        old_vis = ctx.visibility
        ctx.current, ctx.current_group, ctx.current_chain = new, group, chain
        for k, eid in changed.items():
            self._current_changed(ev, k, eid, old.get(k))
            if k[0] == MEMBER:
                if eid is None:
                    ctx.memberships.pop(k[1], None)
                else:
                    ctx.memberships[k[1]] = self.p.facts.membership(eid) or "leave"
        ctx.visibility = self.p.facts.visibility(new.get(HV_KEY))
        users = {k[1] for k in changed if k[0] == MEMBER}
        if old_vis != ctx.visibility:
            users.update(u for u, m in ctx.memberships.items() if m == "invite")
        for u in users:
            self._set_open(ctx, u, grants(ctx.memberships.get(u), ctx.visibility), ev.key)
        self._set_open(ctx, ANYONE, ctx.visibility == "world_readable", ev.key)
        self._set_open(ctx, SHARED_ERAS, shared_era(ctx.visibility), ev.key)

    def _set_open(self, ctx: RoomContext, user: str, should: bool, k: Key) -> None:
        # events up to the head stay as they were decided; the event itself is decided next
        rs = ctx.user_ranges(user)
        at_head = ctx.head is None or ctx.head <= k
        if rs.is_open and not should:
            rs.close_at((k[0], k[1] - 1) if at_head else ctx.head)
            self.touched_ranges.add((ctx.room_id, user))
        elif should and not rs.is_open:
            rs.add(k if at_head else (ctx.head[0], ctx.head[1] + 1), None)
            self.touched_ranges.add((ctx.room_id, user))

    # -- visibility ---------------------------------------------------------------------------

    def _switch(self, ctx: RoomContext, user: str, before: bool, after: bool, k: Key) -> None:
        """A rule flips at event ``k`` for ``user``: the event is visible if it held before or after."""
        if before == after:
            return
        rs = ctx.user_ranges(user)
        if after and not rs.is_open:
            rs.add(k, None)
        elif before and not after:
            if not rs.covers(k):
                rs.add(k, k)
            rs.close_at(k)
        self.touched_ranges.add((ctx.room_id, user))

    def _joined(self, ctx: RoomContext, user: str, k: Key) -> None:
        """``user`` joins at ``k``: the shared-history eras before it become visible."""
        rs = ctx.user_ranges(user)
        for start, end in ctx.user_ranges(SHARED_ERAS).clipped_before(k):
            rs.add(start, end)
        self.touched_ranges.add((ctx.room_id, user))

    def _visibility_fast(self, ctx: RoomContext, ev: ParsedEvent, vis: str, member_before: str | None) -> None:
        k = ev.key
        if ctx.head == k and len(ctx.forward) == 1 and ev.type == CREATE:
            self._switch(ctx, SHARED_ERAS, False, shared_era(vis), k)
            self._switch(ctx, ANYONE, False, vis == "world_readable", k)
        if ev.type == MEMBER:
            u = ev.state_key
            rs = ctx.user_ranges(u)
            own = visible_to_member(vis_values=(vis,), membership_after=ev.membership,
                                    own_change=(ev.membership, member_before))
            after_open = grants(ev.membership, vis)
            if own and not rs.covers(k):
                rs.add(k, None if after_open else k)
            elif not own and rs.covers(k):
                rs.remove_point(k)
            if rs.is_open and not after_open:
                rs.close_at(k)
            elif after_open and not rs.is_open:
                rs.add(k, None)
            self.touched_ranges.add((ctx.room_id, u))
            if ev.membership == "join":
                self._joined(ctx, u, k)
        elif (ev.type, ev.state_key) == HV_KEY:
            new = normalise_visibility(ev.body["content"].get("history_visibility"))
            for u, m in ctx.memberships.items():
                if m == "invite":
                    self._switch(ctx, u, vis == "invited", new == "invited", k)
            self._switch(ctx, ANYONE, vis == "world_readable", new == "world_readable", k)
            self._switch(ctx, SHARED_ERAS, shared_era(vis), shared_era(new), k)

    def _visibility_point(self, ctx: RoomContext, ev: ParsedEvent, before_map: StateMap, after_map: StateMap,
                          vis_before: str, member_before: str | None) -> None:
        """An event persisted off the head (backfill, forks): decide it for every user."""
        k = ev.key
        self.p.facts.ensure(self.cur, [e for (t, s), e in after_map.items() if t == MEMBER or (t, s) == HV_KEY])
        vis_after = self.p.facts.visibility(after_map.get(HV_KEY))
        vis_values = (vis_after, vis_before) if (ev.type, ev.state_key) == HV_KEY else (vis_after,)
        members = {s: self.p.facts.membership(e) for (t, s), e in after_map.items() if t == MEMBER}
        candidates = set(members) | set(ctx.last_join) | {u for u in ctx.ranges if not u.startswith("*")}
        for u in candidates:
            own = (ev.membership, member_before) if ev.type == MEMBER and ev.state_key == u else None
            later = ctx.last_join.get(u)
            want = visible_to_member(vis_values=vis_values, membership_after=members.get(u), own_change=own,
                                     joins_later=later is not None and later > k)
            self._point(ctx, u, want, k)
        self._point(ctx, ANYONE, "world_readable" in vis_values, k)
        self._point(ctx, SHARED_ERAS, any(shared_era(v) for v in vis_values), k)
        if ev.type == MEMBER and ev.membership == "join":
            self._joined(ctx, ev.state_key, k)

    def _point(self, ctx: RoomContext, user: str, want: bool, k: Key) -> None:
        rs = ctx.ranges.get(user)
        has = rs is not None and rs.covers(k)
        if want and not has:
            ctx.user_ranges(user).add(k, k)
        elif has and not want:
            rs.remove_point(k)
        else:
            return
        self.touched_ranges.add((ctx.room_id, user))

    # -- redactions ---------------------------------------------------------------------------

    def _redactions(self) -> None:
        self.redaction_rows = []
        stored_targets = []
        for ev in self.events:
            if ev.redacts is None or ev.rejected_reason or "ex_outlier" in ev.extra:
                continue
            self.redaction_rows.append((ev.event_id, ev.redacts, self.now_ms))
            target = self.by_id.get(ev.redacts)
            if target is not None:
                if target.room_id == ev.room_id and target.type != CREATE and \
                        self._redaction_applies(ev.matrix, target.matrix):
                    target.redacted = True
            elif ev.redacts in self.known and self.known[ev.redacts][1] == ev.room_id:
                if ev.matrix is None or self._redaction_applies(ev.matrix, self.p.matrix.get(ev.redacts)):
                    stored_targets.append(ev.redacts)
        self.redacted_stored = stored_targets

    def _redaction_applies(self, redaction: Any, target: Any) -> bool:
        """Legacy rooms: any redaction in the room applies. Authorized rooms: the spec's check
        (redact level in the redaction's auth events, or the target's own server)."""
        if redaction is None and target is None:
            return True
        if redaction is None or target is None:
            return False
        return redaction_applies(redaction, target, self.p.matrix)

    # -- writing --------------------------------------------------------------------------------

    def _write(self) -> None:
        cur = self.cur
        facts = []
        ex_outliers = [ev for ev in self.events if "ex_outlier" in ev.extra]
        # a de-outliered event that is now rejected changes nothing (as in Synapse)
        skip = {ev.event_id for ev in ex_outliers if ev.rejected_reason}
        for ev in self.events:
            if "ex_outlier" in ev.extra:
                facts.append([] if self.backfill else
                             [(CurrentStateDelta, d) for d in self.deltas.get(ev.event_id, ())])
                continue
            values = {
                "topological_ordering": ev.topological_ordering, "depth": ev.topological_ordering,
                "event_id": ev.event_id, "room_id": ev.room_id, "type": ev.type, "state_key": ev.state_key,
                "sender": ev.sender, "membership": ev.membership, "redacts": ev.redacts,
                "relates_to": ev.relates_to, "rejected": bool(ev.rejected_reason), "outlier": ev.outlier,
                "received_ts": self.now_ms, "json": ev.raw, "redacted": ev.redacted,
            }
            rows = [(Event, values)]
            if not self.backfill:
                rows.extend((CurrentStateDelta, d) for d in self.deltas.get(ev.event_id, ()))
            facts.append(rows)
        self.writer.insert_rows(self.ids, facts)
        done = [ev for ev in ex_outliers if ev.event_id not in skip]
        if done:
            cur.execute("UPDATE events SET outlier = FALSE WHERE " + in_array(cur, "event_id"),
                        [array(cur, [ev.event_id for ev in done])])
            insert_rows(cur, "ex_outlier_stream", ["event_stream_ordering", "event_id", "state_group", "instance_name"],
                        ["bigint", "text", "bigint", "text"],
                        [(ev.extra["stream_id"], ev.event_id, ev.state_group_after, self.writer.generator.instance_name)
                         for ev in done])
        mark_redacted(cur, self.redacted_stored)
        insert_rows(cur, "redactions", ["event_id", "redacts", "received_ts"], ["text", "text", "bigint"],
                    self.redaction_rows)
        insert_rows(cur, "rejections", ["event_id", "reason", "last_check"], ["text", "text", "text"],
                    [(ev.event_id, ev.rejected_reason, str(self.now_ms)) for ev in self.events
                     if ev.rejected_reason and "ex_outlier" not in ev.extra])
        self.p.state.write(cur, self.groups)
        # auth edges, and the chain cover index of the same auth graph (rejected events and
        # outliers too: they are in it, as in Synapse's)
        insert_rows(cur, "event_auth", ["event_id", "auth_id", "room_id"], ["text", "text", "text"],
                    [(ev.event_id, a, ev.room_id) for ev in self.events
                     if ev.matrix is not None and "ex_outlier" not in ev.extra
                     for a in dict.fromkeys(ev.matrix.auth_event_ids)])
        index_events(cur, [ChainEvent(ev.room_id, IndexEvent(ev.event_id, ev.type, ev.state_key, ev.matrix.auth_event_ids))
                           for ev in self.events if ev.matrix is not None and ev.state_key is not None
                           and "ex_outlier" not in ev.extra])
        insert_rows(cur, "event_to_state_groups", ["event_id", "state_group"], ["text", "bigint"],
                    [(ev.event_id, ev.state_group_after) for ev in self.events
                       if not ev.outlier and ev.state_group_after is not None and ev.event_id not in skip])
        accepted = [ev for ev in self.events if not ev.outlier and not ev.rejected_reason]
        insert_rows(cur, "event_edges", ["event_id", "prev_event_id", "room_id"], ["text", "text", "text"],
                    [(ev.event_id, p, ev.room_id) for ev in accepted for p in dict.fromkeys(ev.prev_events)])
        insert_rows(cur, "room_memberships",
                    ["event_id", "user_id", "sender", "room_id", "membership", "event_stream_ordering",
                       "topological_ordering"], ["text", "text", "text", "text", "text", "bigint", "bigint"],
                    [(ev.event_id, ev.state_key, ev.sender, ev.room_id, ev.membership, ev.stream_ordering,
                        ev.topological_ordering) for ev in accepted if ev.type == MEMBER])
        # backward extremities: prevs we do not have (as accepted, non-outlier events)
        have = {ev.event_id for ev in accepted}
        missing = {}
        for ev in accepted:
            for p in ev.prev_events:
                if p in have:
                    continue
                row = self.known.get(p)
                if row is None or row[4]:
                    missing[(p, ev.room_id)] = None
        cur.execute("DELETE FROM event_backward_extremities WHERE " + in_array(cur, "event_id"),
                    [array(cur, self.by_id)])
        insert_rows(cur, "event_backward_extremities", ["event_id", "room_id"], ["text", "text"], list(missing),
                    suffix="ON CONFLICT DO NOTHING")
        if self.fwd_changed:
            rooms = sorted(self.fwd_changed)
            cur.execute("DELETE FROM event_forward_extremities WHERE " + in_array(cur, "room_id"), [array(cur, rooms)])
            insert_rows(cur, "event_forward_extremities", ["event_id", "room_id"], ["text", "text"],
                        [(eid, r) for r in rooms for eid in self.rooms[r].forward])
        gone = [(r, t, k) for (r, t, k), (e, _, _) in self.current_rows.items() if e is None]
        delete_rows(cur, "current_state_events", ["room_id", "type", "state_key"], ["text", "text", "text"], gone)
        if len(gone) < len(self.current_rows):
            insert_rows(
                cur, "current_state_events",
                ["room_id", "type", "state_key", "event_id", "membership", "event_stream_ordering"],
                ["text", "text", "text", "text", "text", "bigint"],
                [(r, t, k, e, m, s) for (r, t, k), (e, m, s) in self.current_rows.items() if e is not None],
                suffix="ON CONFLICT (room_id, type, state_key) DO UPDATE SET event_id = EXCLUDED.event_id, "
                       "membership = EXCLUDED.membership, event_stream_ordering = EXCLUDED.event_stream_ordering",
            )
        if self.touched_ranges:
            pairs = sorted(self.touched_ranges)
            delete_rows(cur, "room_visibility_ranges", ["room_id", "user_id"], ["text", "text"], pairs)
            rows = []
            for r, u in pairs:
                for start, end in self.rooms[r].user_ranges(u).ranges:
                    rows.append((r, u, start[0], start[1], None if end is None else end[0],
                                 None if end is None else end[1]))
            insert_rows(cur, "room_visibility_ranges",
                        ["room_id", "user_id", "start_topological", "start_stream", "end_topological", "end_stream"],
                        ["text", "text", "bigint", "bigint", "bigint", "bigint"], rows)
        room_rows = []
        for ctx in self.rooms.values():
            head = ctx.head or (0, 0)
            info = ctx.info
            room_rows.append((ctx.room_id, head[0], head[1], ctx.last_stream, ctx.current_group, ctx.min_depth,
                              info.version.identifier if info is not None and info.version is not None else None,
                              bool(info is not None and info.authorized)))
        insert_rows(
            cur, "rooms", ["room_id", "head_topological", "head_stream", "last_stream", "current_state_group",
                           "min_depth", "room_version", "authorized"],
            ["text", "bigint", "bigint", "bigint", "bigint", "bigint", "text", "boolean"], room_rows,
            suffix="ON CONFLICT (room_id) DO UPDATE SET head_topological = EXCLUDED.head_topological, "
                   "head_stream = EXCLUDED.head_stream, last_stream = EXCLUDED.last_stream, "
                   "current_state_group = EXCLUDED.current_state_group, min_depth = EXCLUDED.min_depth, "
                   "room_version = coalesce(rooms.room_version, EXCLUDED.room_version), "
                   "authorized = (rooms.authorized OR EXCLUDED.authorized)",
        )
        for ctx in self.rooms.values():
            self.p._keep(ctx)


#: one persister (and its caches) per stream runtime; dropped with the runtime
_PERSISTERS: "weakref.WeakKeyDictionary[Any, EventPersister]" = weakref.WeakKeyDictionary()
_PERSISTERS_LOCK = threading.Lock()


def persister_for(runtime: Any) -> EventPersister:
    """The persister of a stream runtime (one per process and database)."""
    with _PERSISTERS_LOCK:
        p = _PERSISTERS.get(runtime)
        if p is None:
            p = _PERSISTERS[runtime] = EventPersister()
            from . import reads

            p.on_commit.append(reads.change_caches_for(runtime.using).record)
        return p


def persist_events(events: Sequence[IncomingEvent | bytes | str], *, backfill: bool = False,
                   runtime: Any = None) -> list[PersistedEvent]:
    """Persist ``events`` (raw JSON bytes/str or :class:`IncomingEvent`) in one transaction.

    ``backfill``: old history fetched from the past: negative stream orderings (the
    ``backfill`` stream), no change to forward extremities or current state.
    """
    if runtime is None:
        from ..runtime import runtime as process_runtime

        runtime = process_runtime()
    writer = runtime.writer("backfill" if backfill else "events")
    return persister_for(runtime).persist(events, writer, backfill=backfill)

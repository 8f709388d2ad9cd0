"""The planner's reads, all made by the loader on the open transaction: the :class:`Snapshot`
of a batch (a fixed number of queries whatever its size) with what the plan will ask for
prefetched into the batch's views (:func:`prefetch`), and what a plan missed
(:func:`load_needed`); :class:`BatchReader`, the :class:`PlanReader` over those views and
the persister's caches, holds no cursor (docs/storage.md, "The persist path").
"""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Callable, Iterable, Sequence

from rooms.storage.authorization import MatrixEvents, ResolvedStates, RoomAuthChains, RoomInfosBatch
from rooms.storage.incoming_events import HISTORY_VISIBILITY, MEMBER, ParsedEvent, StateMap
from rooms.storage.plan_needs import AUTH_CHAINS, CHAIN_LENGTHS, EVENTS, FACTS, GROUP_CHAINS, STATES, NeedsData
from rooms.storage.plan_snapshot import CacheDelta, Extremity, KnownEvent, RoomContext, Snapshot, WaitingRedaction
from rooms.storage.plan_visibility import HV_KEY
from rooms.storage.sql import array, for_update, in_array, is_sqlite
from rooms.storage.state_deltas import GroupLineage
from rooms.storage.state_groups import NewGroup, StateGroupStore
from rooms.storage.visibility_ranges import SHARED_ERAS, RangeSet, normalise_visibility


def _load_facts(cursor: Any, event_ids: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """(membership, history visibility value) of stored events."""
    cursor.execute(
        "SELECT event_id, membership, CASE WHEN type = %s THEN json END FROM events WHERE "
        + in_array(cursor, "event_id"), [HISTORY_VISIBILITY, array(cursor, event_ids)],
    )
    out: dict[str, tuple[str | None, str | None]] = {}
    for eid, membership, raw in cursor.fetchall():
        vis = None
        if raw is not None:
            content = json.loads(bytes(raw)).get("content") or {}
            vis = normalise_visibility(content.get("history_visibility"))
        out[eid] = (membership, vis)
    return out


class EventFacts:
    """event_id -> (membership, history_visibility value) of state events, cached: the
    visibility rules need them for whatever state an event is checked against. A batch
    reads and learns through an :class:`EventFactsBatch`, applied once it commits."""

    def __init__(self, size: int = 500_000) -> None:
        self._d: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        self.size = size

    def put(self, event_id: str, membership: str | None, visibility: str | None) -> None:
        self._d[event_id] = (membership, visibility)
        if len(self._d) > self.size:
            for _ in range(self.size // 10):
                self._d.popitem(last=False)

    def get(self, event_id: str) -> tuple[str | None, str | None] | None:
        return self._d.get(event_id)

    def batch(self) -> EventFactsBatch:
        return EventFactsBatch(self)

    def apply(self, delta: dict[str, tuple[str | None, str | None]], used: Iterable[str] = ()) -> None:
        """A committed batch's facts; ``used``: the cached ones it read (least recently *used*
        goes first: a room's members are asked about again and again; by insertion order
        they aged out of the cache and were read back batch after batch)."""
        d = self._d
        for e in used:
            if e in d:
                d.move_to_end(e)
        for event_id, (membership, visibility) in delta.items():
            self.put(event_id, membership, visibility)

    def cached(self) -> dict[str, tuple[str | None, str | None]]:
        return dict(self._d)


class EventFactsBatch:
    """One batch's view of :class:`EventFacts`: what it learns (its own events' facts, the
    stored ones the loader read for it) is its own. A fact neither learned nor cached
    raises :class:`~rooms.storage.plan_needs.NeedsData` (:meth:`ensure`): the view holds no
    cursor, :meth:`load` reads them."""

    def __init__(self, base: EventFacts) -> None:
        self.base = base
        #: stored events' facts read for this batch (kept across its plans)
        self.loaded: dict[str, tuple[str | None, str | None]] = {}
        self.absent: set[str] = set()
        self.reset()

    def reset(self) -> None:
        """What a plan learned dropped (a new plan of the batch starts from what was loaded)."""
        self.own: dict[str, tuple[str | None, str | None]] = {}
        self.used: set[str] = set()

    def put(self, event_id: str, membership: str | None, visibility: str | None) -> None:
        self.own[event_id] = (membership, visibility)

    def learn(self, event_id: str, membership: str | None, visibility: str | None) -> None:
        """A stored event's facts, read by the loader."""
        self.loaded[event_id] = (membership, visibility)

    def missing(self, event_ids: Iterable[str]) -> list[str]:
        """Those of ``event_ids`` with no facts known (marking the cached ones used)."""
        own, loaded, cached = self.own, self.loaded, self.base._d
        missing = []
        for e in set(event_ids):
            if e in own or e in loaded:
                continue
            if e in cached:
                self.used.add(e)
            else:
                missing.append(e)
        return missing

    def ensure(self, event_ids: Iterable[str]) -> None:
        missing = self.missing(event_ids)
        if missing:
            raise NeedsData(FACTS, missing)

    def load(self, cursor: Any, event_ids: Iterable[str]) -> None:
        """Read the facts of the stored events not known yet (one query)."""
        missing = self.missing(event_ids)
        if missing:
            found = _load_facts(cursor, missing)
            # an event not stored has none: (None, None) for this batch (not asked again), not cached
            self.absent.update(e for e in missing if e not in found)
            self.loaded.update(dict.fromkeys(missing, (None, None)))
            self.loaded.update(found)

    def _get(self, event_id: str) -> tuple[str | None, str | None] | None:
        facts = self.own.get(event_id)
        if facts is not None:
            return facts
        facts = self.loaded.get(event_id)
        return facts if facts is not None else self.base.get(event_id)

    def membership(self, event_id: str | None) -> str | None:
        if event_id is None:
            return None
        facts = self._get(event_id)
        return None if facts is None else facts[0]

    def visibility(self, event_id: str | None) -> str:
        if event_id is None:
            return "shared"
        facts = self._get(event_id)
        return "shared" if facts is None else facts[1] or "shared"

    def delta(self) -> dict[str, tuple[str | None, str | None]]:
        """What the batch learned and read (its own facts winning)."""
        absent = self.absent
        loaded = {e: f for e, f in self.loaded.items() if e not in absent} if absent else self.loaded
        return {**loaded, **self.own}


class BatchReader:
    """:class:`~rooms.storage.plan_snapshot.PlanReader` for one batch: batch views of the
    persister's caches (state groups, event facts, parsed Matrix events, resolutions, auth
    chains, group lineage) and no cursor. What the loader read for the batch is kept in
    the views; a miss raises :class:`~rooms.storage.plan_needs.NeedsData` (:func:`load_needed`
    reads it, and the batch is planned again after :meth:`reset`). The caches are only read.
    :meth:`delta` is everything the batch learned, for the persister to apply once it commits."""

    def __init__(self, state: StateGroupStore, facts: EventFacts, matrix: MatrixEvents,
                 resolved: ResolvedStates, chains: RoomAuthChains, lineage: GroupLineage,
                 room_infos: RoomInfosBatch) -> None:
        self.room_infos = room_infos
        self.state = state.batch()
        self.facts = facts.batch()
        self.matrix = matrix.batch(room_infos)
        self.resolved = resolved.batch()
        self.chains = chains.batch()
        self.lineage = lineage.batch()

    def reset(self) -> None:
        """What a plan decided dropped; what was loaded for the batch kept (before a new plan)."""
        self.state.reset()
        self.facts.reset()
        self.matrix.reset()
        self.resolved = self.resolved.base.batch()
        self.chains.reset()
        self.lineage = self.lineage.base.batch()

    def state_of_group(self, group: int) -> StateMap:
        return self.state.get_state(group)

    def chain_length(self, group: int) -> int:
        return self.state.chain_length(group)

    def new_group(self, gid: int, *, room_id: str, event_id: str, parent: int | None,
                  parent_chain_length: int | None, delta: StateMap, full_state: Callable[[], StateMap]) -> NewGroup:
        return self.state.new_group(gid, room_id=room_id, event_id=event_id, parent=parent,
                                    parent_chain_length=parent_chain_length, delta=delta, full_state=full_state)

    def remember_state(self, group: int, state: StateMap) -> None:
        self.state.remember(group, state)

    def load_facts(self, event_ids: Iterable[str]) -> None:
        self.facts.ensure(event_ids)

    def put_facts(self, event_id: str, membership: str | None, visibility: str | None) -> None:
        self.facts.put(event_id, membership, visibility)

    def membership(self, event_id: str | None) -> str | None:
        return self.facts.membership(event_id)

    def visibility(self, event_id: str | None) -> str:
        return self.facts.visibility(event_id)

    def delta(self, unused_group_ids: list[int]) -> CacheDelta:
        """What the batch learned and planned, to be applied to the caches after commit."""
        return CacheDelta(groups=self.state.delta(unused_group_ids), facts=self.facts.delta(),
                          facts_used=self.facts.used, matrix=self.matrix.delta(),
                          resolved=self.resolved.delta(), chains=self.chains.delta(),
                          lineage=self.lineage.delta(), room_infos=self.room_infos.delta())


def load_needed(cursor: Any, reader: BatchReader, needs: NeedsData, replans: int = 0) -> None:
    """Read what a plan missed (``needs``) into the batch's views, on the open transaction.
    ``replans``: how many times the batch was planned again already; missed events come
    with more levels of their auth events each time (none the first: an auth rule asks for
    one event; a walk of the auth graph asks level by level, so a deep walk costs a number of
    plans logarithmic in its depth, not linear)."""
    kind = needs.kind
    if kind in (STATES, CHAIN_LENGTHS, GROUP_CHAINS):
        reader.state.load(cursor, needs)
    elif kind == FACTS:
        reader.facts.load(cursor, needs.keys)  # type: ignore[arg-type]
    elif kind == EVENTS:
        reader.matrix.load(cursor, needs.keys, auth_depth=2 ** min(replans, 10) - 1)  # type: ignore[arg-type]
    elif kind == AUTH_CHAINS:
        reader.chains.load(cursor, needs.keys)  # type: ignore[arg-type]
    else:  # pragma: no cover (NeedsData checks its kind)
        raise ValueError(kind)


class RoomContexts:
    """The room contexts a persister keeps between batches (least recently used dropped).
    A batch plans on forks of them (:meth:`RoomContext.fork`); the persister keeps the
    batch's contexts once it commits."""

    def __init__(self, size: int = 20_000) -> None:
        self._d: OrderedDict[str, RoomContext] = OrderedDict()
        self.size = size

    def get(self, room_id: str) -> RoomContext | None:
        return self._d.get(room_id)

    def keep(self, ctx: RoomContext) -> None:
        self._d[ctx.room_id] = ctx
        self._d.move_to_end(ctx.room_id)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def drop(self, room_id: str) -> None:
        self._d.pop(room_id, None)

    def cached(self) -> dict[str, RoomContext]:
        return dict(self._d)


def load_snapshot(cursor: Any, reader: BatchReader, events: Sequence[ParsedEvent], contexts: RoomContexts,
                  group_ids: list[int], *, backfill: bool = False) -> Snapshot:
    """What planning ``events`` starts from: the stored events they refer to, the redactions
    waiting for them, their rooms' contexts (rows locked for this transaction; the cached
    ones as they are, the planner forks them), and the state group IDs reserved for them;
    and, into the reader's views, what the plan will ask of the database in the usual
    cases (:func:`prefetch`)."""
    known, waiting = _load_known(cursor, events)
    rooms = load_rooms(cursor, reader, sorted({ev.room_id for ev in events}), contexts)
    snapshot = Snapshot(rooms=rooms, known=known, waiting_redactions=waiting, group_ids=group_ids)
    prefetch(cursor, reader, events, snapshot, backfill=backfill)
    return snapshot


def prefetch(cursor: Any, reader: BatchReader, events: Sequence[ParsedEvent], snapshot: Snapshot, *,
             backfill: bool = False) -> None:
    """Read what the plan of ``events`` will ask for, where it can be known before planning:
    the stored auth events (one query: each event asking for its own cost a round trip per
    miss, and at 100,000 rooms the members' events outgrow the cache), the stored
    redactions and redaction targets the batch's redactions are checked with, and for
    events off their room's current state (forks, backfill) the chain lengths and states
    of their prevs' stored groups, and the room's auth chain index if the event merges
    branches in different states (or, live, starts a branch off a state other than the
    current one). Whatever else the plan misses it asks for (``NeedsData``), and is
    planned again."""
    by_id = {ev.event_id: ev for ev in events}
    known = snapshot.known
    wanted: set[str] = set()
    for ev in events:
        if ev.matrix is None:
            continue
        wanted.update(a for a in ev.matrix.auth_event_ids if a not in by_id)
        if ev.redacts is not None and ev.redacts in known and ev.redacts not in by_id:
            wanted.add(ev.redacts)
    for w in snapshot.waiting_redactions:
        target = by_id.get(w.target)
        if target is not None and target.matrix is not None:
            wanted.add(w.redaction_id)
    if wanted:
        reader.matrix.load(cursor, wanted)
    groups: set[int] = set()
    merging: set[str] = set()
    branched: set[str] = set()  # prevs of the batch's events (a second reference: a branch)
    for ev in events:
        if ev.outlier or ev.state_before is not None:
            continue
        ctx = snapshot.rooms[ev.room_id]
        mine = {row.state_group for row in (known.get(p) for p in ev.prev_events)
                if row is not None and not row.outlier and row.state_group is not None}
        recent = {u[0] for u in ctx.undo}
        groups.update(g for g in mine if g != ctx.current_group and g not in recent)
        # state resolution may ask for the room's auth chains: at a merge of branches in
        # different states (or whose states are planned in this batch), and (live) after a
        # new branch, when current state is resolved from the forward extremities
        if not backfill:
            for p in ev.prev_events:
                if p in branched or (ctx.current_group is not None and p in known and p not in ctx.forward):
                    merging.add(ev.room_id)
                branched.add(p)
        if len(mine) > 1 or (len(ev.prev_events) > 1 and any(p in by_id for p in ev.prev_events)):
            merging.add(ev.room_id)
    if groups:
        reader.state.load_chain_lengths(cursor, groups)
        reader.state.load_states(cursor, groups)
    indexed = [r for r in merging if (info := snapshot.rooms[r].info) is not None and info.authorized
               and reader.chains.base.room_index(r) is None]
    if indexed:
        reader.chains.load(cursor, indexed)


def _load_known(cur: Any, events: Sequence[ParsedEvent]) -> tuple[dict[str, KnownEvent], list[WaitingRedaction]]:
    ids = [ev.event_id for ev in events]
    wanted = set(ids)
    for ev in events:
        wanted.update(ev.prev_events)
        if ev.redacts:
            wanted.add(ev.redacts)
        if ev.state_before:
            wanted.update(ev.state_before.values())
    cur.execute(
        "SELECT e.event_id, e.room_id, e.topological_ordering, e.stream_ordering, e.outlier, e.rejected, "
        "g.state_group FROM events e LEFT JOIN event_to_state_groups g USING (event_id) "
        "WHERE " + in_array(cur, "e.event_id"), [array(cur, wanted)],
    )
    known = {r[0]: KnownEvent(r[0], r[1], r[2], r[3], bool(r[4]), bool(r[5]), r[6]) for r in cur.fetchall()}
    cur.execute(
        "SELECT r.redacts, e.room_id, r.event_id FROM redactions r JOIN events e ON e.event_id = r.event_id "
        f"WHERE {in_array(cur, 'r.redacts')} AND NOT e.rejected", [array(cur, ids)],
    )
    waiting = [WaitingRedaction(target, room_id, redaction_id) for target, room_id, redaction_id in cur.fetchall()]
    return known, waiting


def load_rooms(cursor: Any, reader: BatchReader, room_ids: Sequence[str], contexts: RoomContexts) -> dict[str, RoomContext]:
    """Contexts of ``room_ids`` (rows locked for this transaction): the cached ones as they
    are (the planner forks them), stale ones reloaded."""
    room_infos = reader.room_infos
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
            ctx = RoomContext(room_id, info=room_infos.get(room_id))
            ctx.ranges[SHARED_ERAS] = RangeSet()
            out[room_id] = ctx
            continue
        head = (row[1], row[2])
        cached = contexts.get(room_id)
        if cached is None or cached.version != (head, row[4], row[3]):
            ctx = RoomContext(room_id, head=head, last_stream=row[3], current_group=row[4], min_depth=row[5])
            stale.append(room_id)
        else:
            ctx = cached
        info = room_infos.get(room_id)
        if info is None and row[6] is not None:
            room_infos.load([room_id], cursor)
            info = room_infos.get(room_id)
        if ctx.info != info:
            if ctx is cached:  # the cached context is not changed before the batch commits
                ctx = ctx.fork()
            ctx.info = info
        out[room_id] = ctx
    if stale:
        _load_room_details(cursor, reader, {r: out[r] for r in stale})
    return out


def _load_room_details(cursor: Any, reader: BatchReader, contexts: dict[str, RoomContext]) -> None:
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
            reader.facts.learn(eid, membership, None)
        elif t == HISTORY_VISIBILITY and k == "":
            hv_events.append(eid)
    reader.facts.load(cursor, hv_events)
    for ctx in contexts.values():
        ctx.visibility = reader.visibility(ctx.current.get(HV_KEY))
    cursor.execute(
        "SELECT f.room_id, f.event_id, e.topological_ordering, e.stream_ordering, g.state_group "
        "FROM event_forward_extremities f JOIN events e USING (event_id) "
        "LEFT JOIN event_to_state_groups g USING (event_id) WHERE " + in_array(cursor, "f.room_id"), [rooms],
    )
    for room_id, eid, topo, stream, group in cursor.fetchall():
        contexts[room_id].forward[eid] = Extremity((topo, stream), group)
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
    reader.state.load_chain_lengths(cursor, [c.current_group for c in contexts.values() if c.current_group is not None])
    for ctx in contexts.values():
        for rs in ctx.ranges.values():
            rs.stored = len(rs.ranges)  # as the rows hold them
        ctx.ranges.setdefault(SHARED_ERAS, RangeSet())
        ctx.remark()
        if ctx.current_group is not None:
            ctx.current_chain = reader.chain_length(ctx.current_group)

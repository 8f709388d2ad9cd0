"""The persist path's bridge to the Matrix core (streams/matrix/): which rooms are
authorized and of which version, the events the auth rules and state resolution read (parsed
once, cached, loaded from the database on a miss), and the three decisions the store takes
with them -- an event's verdict, the state at a fork, whether a redaction takes effect.

Everything here is read through a cursor handed in by the caller (the persist transaction);
the core itself stays pure. Design notes: docs/storage.md ("Authorization and state
resolution").
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Iterable, Mapping, Sequence

from ..matrix.auth import (
    AuthFailed,
    MissingAuthEvent,
    auth_state_from,
    auth_types_for_event,
    check_against_auth_events,
    check_state_dependent,
    redaction_takes_effect,
)
from ..matrix.chain_cover import ChainIndex, IndexEvent, NotIndexed
from ..matrix.event_format import Event as MatrixEvent
from ..matrix.event_format import parse_event as parse_pdu
from ..matrix.room_versions import RoomVersion, UnknownRoomVersion, room_version
from ..matrix.state_res import (
    AuthGraphFacts,
    SplitSets,
    UnsupportedStateRes,
    apply_changes,
    conflicted_subgraph,
    resolve_changes,
    split,
    split_differing,
)
from ..matrix.state_res import auth_difference as walked_difference
from .chain_cover import load_room
from .events import BadEvent, RoomInfo, StateKey, StateMap
from .sql import array, in_array, store_cursor
from .state_deltas import GroupLineage, Resolution
from .state_groups import _LRU


class RoomInfos:
    """room_id -> :class:`RoomInfo` (a room's version never changes: cached for good; the
    entries of a batch that rolls back are dropped with :meth:`discard`)."""

    def __init__(self) -> None:
        self._d: dict[str, RoomInfo] = {}
        self._batch: list[str] = []
        #: rooms looked up in this call and not found (not asked again until it ends)
        self._unknown: set[str] = set()
        self._lock = threading.Lock()
        self.using = "default"

    def __call__(self, body: dict) -> RoomInfo | None:
        room_id = body.get("room_id")
        if not isinstance(room_id, str):
            return None
        info = self._d.get(room_id)
        if info is None and room_id not in self._unknown:
            self.load([room_id])
            info = self._d.get(room_id)
            if info is None:
                self._unknown.add(room_id)
        return info

    def get(self, room_id: str) -> RoomInfo | None:
        return self._d.get(room_id)

    def load(self, room_ids: Sequence[str], cursor: Any = None) -> None:
        if cursor is None:
            with store_cursor(self.using) as cur:
                return self.load(room_ids, cur)
        cursor.execute("SELECT room_id, room_version, authorized FROM rooms WHERE " + in_array(cursor, "room_id"),
                       [array(cursor, list(room_ids))])
        for room_id, version_id, authorized in cursor.fetchall():
            if version_id is None:
                continue  # a room whose create event we have not seen yet
            try:
                version: RoomVersion | None = room_version(version_id)
            except UnknownRoomVersion:
                version = None
            self._d[room_id] = RoomInfo(version, bool(authorized))

    def created(self, room_id: str, info: RoomInfo) -> None:
        """A create event of the batch names its room's version."""
        if room_id not in self._d:
            self._d[room_id] = info
            self._batch.append(room_id)
        self._unknown.discard(room_id)

    def commit(self) -> None:
        self._batch.clear()
        self._unknown.clear()

    def discard(self) -> None:
        for room_id in self._batch:
            self._d.pop(room_id, None)
        self._batch.clear()
        self._unknown.clear()


class _Rejected:
    """The rejected events, as the core asks about them (``event_id in rejected``)."""

    def __init__(self, events: "MatrixEvents") -> None:
        self._events = events

    def __contains__(self, event_id: object) -> bool:
        entry = self._events.entry(event_id)  # type: ignore[arg-type]
        return entry is not None and entry[1]

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0


class MatrixEvents(Mapping[str, MatrixEvent]):
    """event_id -> the core's ``Event`` (and whether it was rejected): a bounded cache in front
    of the ``events`` table, filled by the persist path as it goes. A miss reads the row with
    the cursor of the open transaction (:attr:`cursor`), so events persisted by another
    process are seen too."""

    def __init__(self, rooms: RoomInfos, size: int = 300_000) -> None:
        self.rooms = rooms
        self.size = size
        self._d: OrderedDict[str, tuple[MatrixEvent, bool]] = OrderedDict()
        self._missing: set[str] = set()
        self._batch: list[str] = []
        self.cursor: Any = None
        self.rejected = _Rejected(self)
        self.loads = 0

    # -- Mapping ----------------------------------------------------------------------------

    def entry(self, event_id: str) -> tuple[MatrixEvent, bool] | None:
        entry = self._d.get(event_id)
        if entry is not None:
            # least recently *used*, not inserted, goes first: a room's create, power levels
            # and join rules are read for every event of the room and must not age out
            # (they did at 200,000 events, and every later read was a query)
            self._d.move_to_end(event_id)
        elif event_id not in self._missing and self.cursor is not None:
            self.ensure([event_id])
            entry = self._d.get(event_id)
        return entry

    def __getitem__(self, event_id: str) -> MatrixEvent:
        entry = self.entry(event_id)
        if entry is None:
            raise KeyError(event_id)
        return entry[0]

    def get(self, event_id: str, default: Any = None) -> Any:  # type: ignore[override]
        entry = self.entry(event_id)
        return default if entry is None else entry[0]

    def __contains__(self, event_id: object) -> bool:
        return self.entry(event_id) is not None  # type: ignore[arg-type]

    def __iter__(self):
        return iter(list(self._d))

    def __len__(self) -> int:
        return len(self._d)

    # -- filling ----------------------------------------------------------------------------

    def add(self, event: MatrixEvent, rejected: bool) -> None:
        if event.state_key is None:
            # Only state events are auth events (and so walked by state resolution); messages
            # -- most events -- pushed them out of the cache: a small room's member event is
            # read again only when that member next speaks there, ~100,000 events later at
            # 1 M events. A message asked for (a redaction's target) is loaded on a miss.
            self._missing.discard(event.event_id)
            return
        self._d[event.event_id] = (event, rejected)
        self._d.move_to_end(event.event_id)
        self._missing.discard(event.event_id)
        self._batch.append(event.event_id)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def ensure(self, event_ids: Iterable[str]) -> None:
        """Load the events not cached yet, in one query (unknown ones are remembered as
        unknown until the transaction ends)."""
        missing = [e for e in set(event_ids) if e not in self._d and e not in self._missing]
        if not missing or self.cursor is None:
            return
        cur = self.cursor
        self.loads += 1
        cur.execute("SELECT event_id, room_id, json, rejected FROM events WHERE " + in_array(cur, "event_id"),
                    [array(cur, missing)])
        found = cur.fetchall()
        rooms = {r[1] for r in found if self.rooms.get(r[1]) is None}
        if rooms:
            self.rooms.load(sorted(rooms), cur)
        for event_id, room_id, raw, rejected in found:
            info = self.rooms.get(room_id)
            if info is None or not info.authorized or info.version is None:
                continue
            try:
                event = parse_pdu(json.loads(bytes(raw)), info.version, stored_id=event_id)
            except Exception:  # stored before checks existed: not an event the core can read
                continue
            if event.event_id != event_id:
                continue
            self._d[event_id] = (event, bool(rejected))
        self._missing.update(e for e in missing if e not in self._d)

    def end_transaction(self, committed: bool) -> None:
        self.cursor = None
        self._missing.clear()
        if not committed:
            for event_id in self._batch:
                self._d.pop(event_id, None)
        self._batch.clear()


# -- the decisions ----------------------------------------------------------------------------

def _ensure(events: Mapping[str, MatrixEvent], ids: Iterable[str]) -> None:
    ensure = getattr(events, "ensure", None)  # MatrixEvents: load in one query what is missing
    if ensure is not None:
        ensure(ids)


def authorize(event: MatrixEvent, before: StateMap | None, events: Mapping[str, MatrixEvent],
              rejected: Any = None) -> str | None:
    """The rejection reason of ``event``, or None if it is accepted: rules 1-3 and the rest
    against its own auth events, then (``before`` given: not an outlier) the rules against
    the state before it. An auth event we do not have is a :class:`BadEvent` (fetch it and
    persist it first, as an outlier).

    Pure given its inputs: ``events`` may be a plain dict (``rejected``: the IDs rejected so
    far) or the persister's :class:`MatrixEvents` (which knows both)."""
    if rejected is None:
        rejected = getattr(events, "rejected", ())
    _ensure(events, event.auth_event_ids)
    try:
        check_against_auth_events(event, events.get, rejected)
        if before is not None and not (event.type == "m.room.create" and event.state_key == ""):
            chosen = {before[k] for k in auth_types_for_event(event) if k in before}
            if chosen != set(event.auth_event_ids):  # the same auth state gives the same verdict
                _ensure(events, chosen)
                check_state_dependent(event, auth_state_from(event, before, events.get))
    except AuthFailed as e:
        return f"auth_error: {e}"
    except MissingAuthEvent as e:
        raise BadEvent(event.event_id, f"auth event {e} is not stored (persist it first, as an outlier)") from None
    return None


def resolve_state(version: RoomVersion, state_sets: Sequence[Mapping[StateKey, str]],
                  events: Mapping[str, MatrixEvent], rejected: Any = None,
                  graph_facts: AuthGraphFacts | None = None) -> dict[StateKey, str] | None:
    """The resolved state of ``state_sets`` (v2 / v2.1 by ``version``); None for a version
    the core cannot resolve (v1: the caller keeps its stand-in). ``events``/``rejected`` as
    for :func:`authorize`; ``graph_facts`` (e.g. :meth:`RoomAuthChains.graph_facts`) answers
    the auth difference without walking."""
    changes = resolve_state_changes(version, state_sets, events, rejected, graph_facts)
    if changes is None:
        return None
    return apply_changes(state_sets[0] if state_sets else {}, changes)


def resolve_state_changes(version: RoomVersion, state_sets: Sequence[Mapping[StateKey, str]],
                          events: Mapping[str, MatrixEvent], rejected: Any = None,
                          graph_facts: AuthGraphFacts | None = None,
                          differing: Iterable[StateKey] | None = None) -> dict[StateKey, str | None] | None:
    """:func:`resolve_state` as changes to the first set (``state_res.resolve_changes``:
    None values remove a key); ``differing``: the keys outside which the sets agree (from
    the state groups' deltas), so nothing walks whole sets."""
    if rejected is None:
        rejected = getattr(events, "rejected", ())
    if len(state_sets) > 1:
        # what resolution reads first: the events of the conflicted keys
        if differing is None:
            _, conflicted = split(state_sets)
        else:
            differing = set(differing)
            conflicted = split_differing(state_sets, differing)
        _ensure(events, set().union(*conflicted.values()))
    try:
        return resolve_changes(version, state_sets, events, rejected, graph_facts=graph_facts,
                               differing=differing)
    except UnsupportedStateRes:
        return None


class ResolvedStates:
    """(state groups) -> the state they resolve to, for the persist path.

    The inputs of a resolution are immutable: state groups never change, nor do the events
    in them or their verdicts. So the same groups always resolve to the same state, and a
    fork asks for the same resolution twice or more -- current state when the second
    forward extremity appears (and after each message on a branch: a message does not change
    its branch's group), then the state before the event that merges the branches -- each
    time a walk of the room's whole auth history. Bounded by total keys; whatever a
    rolled-back transaction put here is dropped with :meth:`clear` (on SQLite its group IDs
    are taken again)."""

    def __init__(self, size_keys: int = 500_000) -> None:
        self._lru = _LRU(size_keys, weigh=lambda entry: len(entry.state) + 1)
        self.hits = 0
        self.misses = 0

    def scale(self, factor: float) -> None:
        """The cache's bound times ``factor`` (:meth:`EventPersister.scale_caches`)."""
        self._lru.size = int(self._lru.size * factor)

    def get(self, groups: Iterable[int]) -> Resolution | None:
        """The cached resolution of ``groups``. Its state is shared, never changed: the planner
        changes in place only a current state that is its group's (copied from the group's
        state), never a resolved one (copies of a big room's state were most of a fork)."""
        entry = self._lru.get(frozenset(groups))
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        return entry  # type: ignore[no-any-return]

    def put(self, groups: Iterable[int], resolution: Resolution) -> None:
        self._lru.put(frozenset(groups), resolution)

    def clear(self) -> None:
        self._lru.clear()


class RoomAuthChains:
    """room_id -> a chain cover index of the room's auth graph in memory, so that state
    resolution's auth difference is read from chains and links (Synapse's way) instead of a
    walk over the room's whole auth history, which is what a cache miss cost in big rooms.

    A room's index is loaded from the stored one (``event_auth_chains``/``_links``) the first
    time a resolution in the room asks, then kept current with every state event the persist
    path plans there (:meth:`add`, in stream order: rejected ones and outliers too, as stored).
    Any valid cover of the same graph gives the same answers, so its chain numbers need not
    be the stored ones. An event it has no position for (persisted by another writer, or
    waiting for an auth event) makes it reload the room once; if that does not place it the
    auth difference is walked (and the room is not reloaded again for the next
    :attr:`RELOAD_AFTER` transactions: an event whose auth events never arrive would have it
    reload a big room at every fork). A rolled-back transaction drops the rooms it touched.
    Bounded by total positions (least recently used rooms go)."""

    RELOAD_AFTER = 100
    #: groups remembered as wholly placed, per room; rooms remembered; how far up the
    #: group tree a checked group is looked for (a big room changes its state ~50 times
    #: between forks)
    CHECKED_GROUPS = 256
    CHECKED_HOPS = 1_000
    CHECKED_ROOMS = 20_000

    def __init__(self, size_positions: int = 600_000) -> None:
        self.size = size_positions
        self._transactions = 0
        #: room -> the transaction count when a reload last left an event unplaced
        self._unplaced: dict[str, int] = {}
        self._rooms: OrderedDict[str, ChainIndex] = OrderedDict()
        #: the rooms' positions in all (kept as they change: summing them at every load was
        #: 5% of the persist path with 100,000 rooms cached)
        self._positions = 0
        #: the open transaction's state events per room, in order (a load adds them)
        self._batch: dict[str, list[IndexEvent]] = {}
        self.cursor: Any = None
        self.loads = 0
        self.walks = 0
        #: room -> (its index, the groups whose states it places whole, most recent last)
        self._checked: dict[str, tuple[ChainIndex, OrderedDict[int, None]]] = {}

    def add(self, room_id: str, event: IndexEvent) -> None:
        """A state event planned in the open transaction."""
        self._batch.setdefault(room_id, []).append(event)
        index = self._rooms.get(room_id)
        if index is not None:
            before = len(index.positions)
            index.extend([event])
            self._positions += len(index.positions) - before

    def index(self, room_id: str, reload: bool = False) -> ChainIndex:
        index = None if reload else self._rooms.get(room_id)
        if index is not None:
            self._rooms.move_to_end(room_id)
            return index
        self.loads += 1
        index = load_room(self.cursor, room_id) if self.cursor is not None else ChainIndex()
        index.extend(self._batch.get(room_id, ()))
        self._drop(room_id)
        self._rooms[room_id] = index
        self._positions += len(index.positions)
        while self._positions > self.size and len(self._rooms) > 1:
            self._drop(next(iter(self._rooms)))
        return index

    def _drop(self, room_id: str) -> None:
        index = self._rooms.pop(room_id, None)
        if index is not None:
            self._positions -= len(index.positions)

    def graph_facts(self, room_id: str, events: Mapping[str, MatrixEvent], groups: Sequence[int | None] = (),
                    lineage: GroupLineage | None = None) -> AuthGraphFacts:
        """``graph_facts`` for :func:`resolve_state` in ``room_id``: the auth difference from
        the index; the v2.1 conflicted subgraph (only ancestors of the conflicted events) is
        walked. ``groups``: the state sets' groups; with ``lineage``, whether the events the
        sets share are all placed is known from the groups' ancestors' deltas
        (:meth:`placed`), not by looking at every event of a big state."""
        def difference_from(index: ChainIndex, state_sets: Sequence[Mapping[StateKey, str]]) -> set[str]:
            placed = isinstance(state_sets, SplitSets) and bool(groups) and \
                self.placed(room_id, index, groups, state_sets, lineage)
            return index.state_difference(state_sets, common_placed=placed)

        def facts(state_sets, conflicted_ids):
            difference = None
            try:
                difference = difference_from(self.index(room_id), state_sets)
            except NotIndexed:
                last = self._unplaced.get(room_id)
                if last is None or self._transactions - last >= self.RELOAD_AFTER:
                    try:
                        difference = difference_from(self.index(room_id, reload=True), state_sets)
                    except NotIndexed:
                        self._unplaced[room_id] = self._transactions
            if difference is None:
                self.walks += 1
                difference = walked_difference([set(s.values()) for s in state_sets], events)
            subgraph = None if conflicted_ids is None else conflicted_subgraph(conflicted_ids, events)
            return difference, subgraph
        return facts

    def placed(self, room_id: str, index: ChainIndex, groups: Sequence[int | None],
               states: Sequence[Mapping[StateKey, str]], lineage: GroupLineage | None) -> bool:
        """Whether every event the state sets share has a position in ``index`` -- true if
        every event of one set's state does. Known for the groups checked before against the
        same index (positions are never taken back), and for a group whose ancestor was, from
        the deltas since; else one pass over each state, remembered. (The rooms' checked
        groups are kept along its group tree as forks and state events extend it.)"""
        checked = self._checked.get(room_id)
        if checked is None or checked[0] is not index:
            checked = self._checked[room_id] = (index, OrderedDict())
            if len(self._checked) > self.CHECKED_ROOMS:
                self._checked.pop(next(iter(self._checked)))
        done = checked[1]
        positions = index.positions
        for group in groups:
            if group is None:
                continue
            path: list[int] = []
            g: int | None = group
            while g is not None and g not in done and lineage is not None and len(path) < self.CHECKED_HOPS:
                entry = lineage.get(g)
                if entry is None:
                    g = None
                    break
                path.append(g)
                g = entry.parent
            if g is None or g not in done:
                continue
            for p in reversed(path):
                if any(e is not None and e not in positions for e in lineage.get(p).delta.values()):  # type: ignore[union-attr]
                    break
                done[p] = None
            else:
                self._trim(done)
                return True
        placed = False
        for group, state in zip(groups, states):
            if group is not None and positions.keys() >= set(state.values()):
                done[group] = None
                placed = True
        self._trim(done)
        return placed

    def _trim(self, done: OrderedDict[int, None]) -> None:
        while len(done) > self.CHECKED_GROUPS:
            done.popitem(last=False)

    def end_transaction(self, committed: bool) -> None:
        self.cursor = None
        self._transactions += 1
        if len(self._unplaced) > 10_000:
            self._unplaced.clear()
        if not committed:
            self._checked.clear()  # its groups never existed (on SQLite their IDs are taken again)
            for room_id in self._batch:
                self._drop(room_id)
        self._batch.clear()


def redaction_applies(redaction: MatrixEvent, target: MatrixEvent, events: MatrixEvents) -> bool:
    """Whether an accepted redaction prunes ``target``: v1-2 decided it in the auth rules;
    from v3 the sender needs the redact level in the redaction's own auth events, or the
    target's server (the spec's "handling redactions", Synapse's recheck)."""
    state = {}
    for auth_id in redaction.auth_event_ids:
        entry = events.entry(auth_id)
        if entry is not None and not entry[1]:
            state[entry[0].key] = entry[0]
    return redaction_takes_effect(redaction, target, state)

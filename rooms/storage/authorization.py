"""The persist path's bridge to the Matrix core (rooms/matrix/): which rooms are
authorized and of which version, the events the auth rules and state resolution read (parsed
once, cached, loaded from the database on a miss), and the three decisions the store takes
with them -- an event's verdict, the state at a fork, whether a redaction takes effect.

What the batch views here read from the database, the loader reads for them through the
open transaction's cursor (``load``); the views themselves hold none, and the core stays
pure. Design notes: docs/storage.md ("Authorization and state
resolution").
"""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

from rooms.matrix.auth_rules import (
    AuthFailed,
    MissingAuthEvent,
    auth_state_from,
    auth_types_for_event,
    check_against_auth_events,
    check_state_dependent,
    redaction_takes_effect,
)
from rooms.matrix.chain_index import ChainIndex, IndexEvent, NotIndexed
from rooms.matrix.event_format import Event as MatrixEvent
from rooms.matrix.event_format import parse_pdu
from rooms.matrix.room_versions import RoomVersion, UnknownRoomVersion, room_version
from rooms.matrix.state_res import (
    AuthGraphFacts,
    SplitSets,
    UnsupportedStateRes,
    apply_changes,
    conflicted_subgraph,
    resolve_changes,
    split,
    split_differing,
)
from rooms.matrix.state_res import auth_difference as walked_difference
from rooms.storage.chain_index_store import load_room
from rooms.storage.incoming_events import BadEvent, RoomInfo, StateKey, StateMap
from rooms.storage.plan_needs import AUTH_CHAINS, EVENTS, NeedsData
from rooms.storage.sql import array, in_array, store_cursor
from rooms.storage.state_deltas import LineageReads, Resolution
from rooms.storage.state_groups import _LRU


def _load_room_infos(cursor: Any, room_ids: Sequence[str]) -> dict[str, RoomInfo]:
    """The stored rooms' versions and whether they are authorized (rooms whose create event
    is not stored yet are left out)."""
    cursor.execute("SELECT room_id, room_version, authorized FROM rooms WHERE " + in_array(cursor, "room_id"),
                   [array(cursor, list(room_ids))])
    out: dict[str, RoomInfo] = {}
    for room_id, version_id, authorized in cursor.fetchall():
        if version_id is None:
            continue  # a room whose create event we have not seen yet
        try:
            version: RoomVersion | None = room_version(version_id)
        except UnknownRoomVersion:
            version = None
        out[room_id] = RoomInfo(version, bool(authorized))
    return out


class RoomInfos:
    """room_id -> :class:`RoomInfo` (a room's version never changes: cached for good). A batch
    reads and learns through a :class:`RoomInfosBatch`, applied once it commits."""

    def __init__(self) -> None:
        self._d: dict[str, RoomInfo] = {}
        self.using = "default"

    def get(self, room_id: str) -> RoomInfo | None:
        return self._d.get(room_id)

    def batch(self, using: str) -> RoomInfosBatch:
        return RoomInfosBatch(self, using)

    def apply(self, delta: dict[str, RoomInfo]) -> None:
        for room_id, info in delta.items():
            self._d.setdefault(room_id, info)

    def cached(self) -> dict[str, RoomInfo]:
        return dict(self._d)


class RoomInfosBatch:
    """One batch's view of :class:`RoomInfos`: the rooms it loads or creates are its own."""

    def __init__(self, base: RoomInfos, using: str) -> None:
        self.base = base
        self.using = using
        self.own: dict[str, RoomInfo] = {}
        #: rooms looked up and not found (not asked again in this batch)
        self._unknown: set[str] = set()

    def __call__(self, body: dict[str, Any]) -> RoomInfo | None:
        room_id = body.get("room_id")
        if not isinstance(room_id, str):
            return None
        info = self.get(room_id)
        if info is None and room_id not in self._unknown:
            self.load([room_id])
            info = self.get(room_id)
            if info is None:
                self._unknown.add(room_id)
        return info

    def get(self, room_id: str) -> RoomInfo | None:
        info = self.own.get(room_id)
        return info if info is not None else self.base.get(room_id)

    def load(self, room_ids: Sequence[str], cursor: Any = None) -> None:
        if cursor is None:
            with store_cursor(self.using) as cur:
                return self.load(room_ids, cur)
        self.own.update(_load_room_infos(cursor, room_ids))

    def created(self, room_id: str, info: RoomInfo) -> None:
        """A create event of the batch names its room's version."""
        if self.get(room_id) is None:
            self.own[room_id] = info
        self._unknown.discard(room_id)

    def delta(self) -> dict[str, RoomInfo]:
        return dict(self.own)


class _Rejected:
    """The rejected events, as the core asks about them (``event_id in rejected``)."""

    def __init__(self, events: MatrixEvents | MatrixEventsBatch) -> None:
        self._events = events

    def __contains__(self, event_id: object) -> bool:
        entry = self._events.entry(event_id)  # type: ignore[arg-type]
        return entry is not None and entry[1]

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _ByEntry(Mapping[str, MatrixEvent]):
    """Matrix events by ID, read through :meth:`entry` (the event and whether it was rejected):
    the cache and a batch's view of it answer alike."""

    def entry(self, event_id: str) -> tuple[MatrixEvent, bool] | None:
        raise NotImplementedError

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


class MatrixEvents(_ByEntry):
    """event_id -> the core's ``Event`` (and whether it was rejected): a bounded cache in front
    of the ``events`` table. A batch reads through a :class:`MatrixEventsBatch` (a miss is
    read by the loader in the open transaction, so events persisted by another process are
    seen too); what it planned or loaded is added with :meth:`apply` once it commits."""

    def __init__(self, rooms: RoomInfos, size: int = 300_000) -> None:
        self.rooms = rooms
        self.size = size
        self._d: OrderedDict[str, tuple[MatrixEvent, bool]] = OrderedDict()
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
        return entry

    def __iter__(self) -> Iterator[str]:
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
            return
        self._put(event.event_id, (event, rejected))

    def _put(self, event_id: str, entry: tuple[MatrixEvent, bool]) -> None:
        self._d[event_id] = entry
        self._d.move_to_end(event_id)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def batch(self, rooms: RoomInfosBatch) -> MatrixEventsBatch:
        return MatrixEventsBatch(self, rooms)

    def apply(self, delta: MatrixEventsDelta) -> None:
        """A committed batch's state events and the events it loaded."""
        for event_id, entry in delta.entries.items():
            self._put(event_id, entry)
        self.loads += delta.loads

    def cached(self) -> dict[str, tuple[MatrixEvent, bool]]:
        return dict(self._d)


class MatrixEventsDelta(NamedTuple):
    entries: dict[str, tuple[MatrixEvent, bool]]
    loads: int


class MatrixEventsBatch(_ByEntry):
    """One batch's view of :class:`MatrixEvents`: the events it plans are its own, the
    stored ones the loader read for it (:meth:`load`, on the open transaction) are kept
    across its plans; the cache under it is only read. The view holds no cursor: an event
    it does not have raises :class:`~rooms.storage.plan_needs.NeedsData`."""

    def __init__(self, base: MatrixEvents, rooms: RoomInfosBatch) -> None:
        self.base = base
        self.rooms = rooms
        #: stored events read for this batch, and those asked for and not in the table
        self.loaded: dict[str, tuple[MatrixEvent, bool]] = {}
        self.absent: set[str] = set()
        self.rejected = _Rejected(self)
        self.loads = 0
        self.reset()

    def reset(self) -> None:
        """The events a plan added dropped (a new plan of the batch starts from what was loaded)."""
        self.own: dict[str, tuple[MatrixEvent, bool]] = {}

    def entry(self, event_id: str) -> tuple[MatrixEvent, bool] | None:
        entry = self.own.get(event_id)
        if entry is not None:
            return entry
        cached = self.base._d  # (``MatrixEvents.entry`` inlined: the auth rules ask ~10 times an event)
        entry = cached.get(event_id)
        if entry is not None:
            cached.move_to_end(event_id)
            return entry
        entry = self.loaded.get(event_id)
        if entry is None and event_id not in self.absent:
            raise NeedsData(EVENTS, [event_id])
        return entry

    def __iter__(self) -> Iterator[str]:
        mine = {**self.loaded, **self.own}
        return iter(list(mine) + [e for e in self.base if e not in mine])

    def __len__(self) -> int:
        mine = {**self.loaded, **self.own}
        return len(mine) + sum(1 for e in self.base if e not in mine)

    def add(self, event: MatrixEvent, rejected: bool) -> None:
        """An event planned in this batch (only state events are kept: see ``MatrixEvents.add``)."""
        if event.state_key is not None:
            self.own[event.event_id] = (event, rejected)

    def missing(self, event_ids: Iterable[str]) -> list[str]:
        """Those of ``event_ids`` the batch neither has nor knows to be absent."""
        own, cached, loaded, absent = self.own, self.base._d, self.loaded, self.absent
        return [e for e in set(event_ids) if e not in own and e not in cached and e not in loaded and e not in absent]

    def ensure(self, event_ids: Iterable[str]) -> None:
        """Raise :class:`NeedsData` for all the events of ``event_ids`` not known yet at once
        (before a rule asks for them one by one)."""
        missing = self.missing(event_ids)
        if missing:
            raise NeedsData(EVENTS, missing)

    def load(self, cursor: Any, event_ids: Iterable[str], auth_depth: int = 0) -> None:
        """Read the stored events not known yet, in one query (unknown ones are remembered as
        unknown for the rest of the batch); ``auth_depth``: also their auth events, that many
        levels up (what a walk of the auth graph reads next), a query per level."""
        missing = self.missing(event_ids)
        for level in range(auth_depth + 1):
            if not missing:
                return
            found = self._load(cursor, missing)
            if level < auth_depth:
                missing = self.missing({a for e in found for a in self.loaded[e][0].auth_event_ids})

    def _load(self, cursor: Any, missing: list[str]) -> list[str]:
        cur = cursor
        self.loads += 1
        cur.execute("SELECT event_id, room_id, json, rejected FROM events WHERE " + in_array(cur, "event_id"),
                    [array(cur, missing)])
        found = cur.fetchall()
        rooms = {r[1] for r in found if self.rooms.get(r[1]) is None}
        if rooms:
            self.rooms.load(sorted(rooms), cur)
        loaded = self.loaded
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
            loaded[event_id] = (event, bool(rejected))
        self.absent.update(e for e in missing if e not in loaded)
        return [e for e in missing if e in loaded]

    def delta(self) -> MatrixEventsDelta:
        """The events the batch planned and read, for the cache once it commits."""
        return MatrixEventsDelta({**self.loaded, **self.own}, self.loads)


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

    def batch(self) -> ResolvedStatesBatch:
        return ResolvedStatesBatch(self)

    def apply(self, delta: dict[frozenset[int], Resolution]) -> None:
        """A committed batch's resolutions (its groups exist now)."""
        for groups, resolution in delta.items():
            self._lru.put(groups, resolution)

    def cached(self) -> dict[Any, Any]:
        return dict(self._lru._d)


class ResolvedStatesBatch:
    """One batch's view of :class:`ResolvedStates`: its resolutions are its own (they may
    name groups it planned, which exist only once it commits)."""

    def __init__(self, base: ResolvedStates) -> None:
        self.base = base
        self.own: dict[frozenset[int], Resolution] = {}

    def get(self, groups: Iterable[int]) -> Resolution | None:
        key = frozenset(groups)
        own = self.own.get(key)
        return own if own is not None else self.base.get(key)

    def put(self, groups: Iterable[int], resolution: Resolution) -> None:
        self.own[frozenset(groups)] = resolution

    def delta(self) -> dict[frozenset[int], Resolution]:
        return dict(self.own)


class RoomAuthChains:
    """room_id -> a chain cover index of the room's auth graph in memory, so that state
    resolution's auth difference is read from chains and links (Synapse's way) instead of a
    walk over the room's whole auth history, which is what a cache miss cost in big rooms.

    A batch asks through a :class:`RoomAuthChainsBatch`: a room's index is loaded from the
    stored one (``event_auth_chains``/``_links``) the first time a resolution in the room
    asks, and extended with every state event the batch plans there (rejected ones and
    outliers too, as stored). Any valid cover of the same graph gives the same answers, so
    its chain numbers need not be the stored ones. An event it has no position for
    (persisted by another writer, or waiting for an auth event) makes it reload the room
    once; if that does not place it the auth difference is walked (and the room is not
    reloaded again for the next :attr:`RELOAD_AFTER` transactions: an event whose auth
    events never arrive would have it reload a big room at every fork). What a batch
    loaded and added is kept here by :meth:`apply` once it commits. Bounded by total
    positions (least recently used rooms go)."""

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
        self.loads = 0
        self.walks = 0
        #: room -> (its index, the groups whose states it places whole, most recent last)
        self._checked: dict[str, tuple[ChainIndex, OrderedDict[int, None]]] = {}

    def batch(self, stored: bool = True) -> RoomAuthChainsBatch:
        """A view for one batch (``stored=False``: a planner with no database under it)."""
        return RoomAuthChainsBatch(self, stored)

    def room_index(self, room_id: str) -> ChainIndex | None:
        """The cached index of ``room_id`` (None: not loaded)."""
        return self._rooms.get(room_id)

    def _drop(self, room_id: str) -> None:
        index = self._rooms.pop(room_id, None)
        if index is not None:
            self._positions -= len(index.positions)

    def _keep(self, room_id: str, index: ChainIndex) -> None:
        self._drop(room_id)
        self._rooms[room_id] = index
        self._positions += len(index.positions)

    def apply(self, delta: ChainsDelta) -> None:
        """A committed batch: the rooms' indexes it built (loaded, or copied and extended)
        replace the cached ones; the other cached rooms it added events to are extended."""
        for room_id, index in delta.indexes.items():
            self._keep(room_id, index)
        for room_id, events in delta.added.items():
            if room_id in delta.indexes:
                continue
            index = self._rooms.get(room_id)
            if index is not None:
                before = len(index.positions)
                index.extend(events)
                self._positions += len(index.positions) - before
                self._rooms.move_to_end(room_id)
        for room_id in delta.used:
            if room_id in self._rooms:
                self._rooms.move_to_end(room_id)
        while self._positions > self.size and len(self._rooms) > 1:
            self._drop(next(iter(self._rooms)))
        self._unplaced.update(delta.unplaced)
        for room_id, checked in delta.checked.items():
            self._checked.pop(room_id, None)
            self._checked[room_id] = checked
            if len(self._checked) > self.CHECKED_ROOMS:
                self._checked.pop(next(iter(self._checked)))
        self.loads += delta.loads
        self.walks += delta.walks
        self._transactions += 1
        if len(self._unplaced) > 10_000:
            self._unplaced.clear()

    def cached(self) -> dict[str, Any]:
        """What tests compare: each room's positions and links, the throttle and the checks."""
        return {"rooms": {r: (dict(i.positions), {o: {t: list(p) for t, p in d.items()} for o, d in i.links.items()})
                          for r, i in self._rooms.items()},
                "positions": self._positions, "unplaced": dict(self._unplaced),
                "checked": {r: (id(i), list(c)) for r, (i, c) in self._checked.items()}}


class ChainsDelta(NamedTuple):
    """What one batch adds to :class:`RoomAuthChains`."""

    added: dict[str, list[IndexEvent]]  #: its state events per room, in order
    indexes: dict[str, ChainIndex]  #: the rooms' indexes it built (with its events)
    used: set[str]  #: cached rooms it read
    unplaced: dict[str, int]
    checked: dict[str, tuple[ChainIndex, OrderedDict[int, None]]]
    loads: int
    walks: int


class RoomAuthChainsBatch:
    """One batch's view of :class:`RoomAuthChains`: a cached index is read as it is while the
    batch has no state event in its room, else the batch works on its own copy (extended
    with its events). The cache under it is only read. A room's stored index is read by the
    loader (:meth:`load`, kept across the batch's plans): the view holds no cursor, and a
    room it has no index for raises :class:`~rooms.storage.plan_needs.NeedsData`.
    ``stored=False``: nothing is stored (a test's planner without a database): a room's
    index starts from the batch's events."""

    def __init__(self, base: RoomAuthChains, stored: bool = True) -> None:
        self.base = base
        self.stored = stored
        #: rooms' stored indexes read in this transaction (never extended: copied first)
        self.loaded: dict[str, ChainIndex] = {}
        self.loads = 0
        self.reset()

    def reset(self) -> None:
        """What a plan added dropped (a new plan of the batch starts from what was loaded)."""
        self.added: dict[str, list[IndexEvent]] = {}
        self.indexes: dict[str, ChainIndex] = {}
        #: the rooms whose index in ``indexes`` is the stored one (loaded in this transaction)
        self.fresh: set[str] = set()
        self.used: set[str] = set()
        self.unplaced: dict[str, int] = {}
        self.checked: dict[str, tuple[ChainIndex, OrderedDict[int, None]]] = {}
        self.walks = 0

    def add(self, room_id: str, event: IndexEvent) -> None:
        """A state event planned in this batch."""
        self.added.setdefault(room_id, []).append(event)
        index = self.indexes.get(room_id)
        if index is not None:
            index.extend([event])

    def load(self, cursor: Any, room_ids: Iterable[str]) -> None:
        """The rooms' stored indexes, as they are in the open transaction."""
        for room_id in sorted(set(room_ids) - set(self.loaded)):
            self.loads += 1
            self.loaded[room_id] = load_room(cursor, room_id)

    def index(self, room_id: str, reload: bool = False) -> ChainIndex:
        """The room's index with the batch's events; ``reload``: not the cached one (it
        lacks an event): the stored one, as this transaction sees it."""
        index = self.indexes.get(room_id)
        if index is not None and (not reload or room_id in self.fresh):
            return index
        if not reload and room_id not in self.loaded:
            cached = self.base._rooms.get(room_id)
            if cached is not None:
                self.used.add(room_id)
                added = self.added.get(room_id)
                if not added:
                    return cached
                index = cached.copy()
                index.extend(added)
                self.indexes[room_id] = index
                return index
        if self.stored:
            stored = self.loaded.get(room_id)
            if stored is None:
                raise NeedsData(AUTH_CHAINS, [room_id])
            index = stored.copy()
            self.fresh.add(room_id)
        else:
            self.loads += 1
            index = ChainIndex()
        index.extend(self.added.get(room_id, ()))
        self.indexes[room_id] = index
        return index

    def graph_facts(self, room_id: str, events: Mapping[str, MatrixEvent], groups: Sequence[int | None] = (),
                    lineage: LineageReads | None = None) -> AuthGraphFacts:
        """``graph_facts`` for :func:`resolve_state` in ``room_id``: the auth difference from
        the index; the v2.1 conflicted subgraph (only ancestors of the conflicted events) is
        walked. ``groups``: the state sets' groups; with ``lineage``, whether the events the
        sets share are all placed is known from the groups' ancestors' deltas
        (:meth:`placed`), not by looking at every event of a big state."""
        def difference_from(index: ChainIndex, state_sets: Sequence[Mapping[StateKey, str]]) -> set[str]:
            placed = isinstance(state_sets, SplitSets) and bool(groups) and \
                self.placed(room_id, index, groups, state_sets, lineage)
            return index.state_difference(state_sets, common_placed=placed)

        def facts(state_sets: Sequence[Mapping[StateKey, str]],
                  conflicted_ids: set[str] | None) -> tuple[set[str], set[str] | None]:
            difference = None
            try:
                difference = difference_from(self.index(room_id), state_sets)
            except NotIndexed:
                last = self.unplaced.get(room_id, self.base._unplaced.get(room_id))
                if last is None or self.base._transactions - last >= self.base.RELOAD_AFTER:
                    try:
                        difference = difference_from(self.index(room_id, reload=True), state_sets)
                    except NotIndexed:
                        self.unplaced[room_id] = self.base._transactions
            if difference is None:
                self.walks += 1
                difference = walked_difference([set(s.values()) for s in state_sets], events)
            subgraph = None if conflicted_ids is None else conflicted_subgraph(conflicted_ids, events)
            return difference, subgraph
        return facts

    def _checked_for(self, room_id: str, index: ChainIndex) -> OrderedDict[int, None]:
        """The groups known to be placed whole in ``index`` (this batch's copy of them)."""
        checked = self.checked.get(room_id)
        if checked is None or checked[0] is not index:
            cached = self.base._checked.get(room_id)
            done = OrderedDict(cached[1]) if cached is not None and cached[0] is index else OrderedDict()
            checked = self.checked[room_id] = (index, done)
        return checked[1]

    def placed(self, room_id: str, index: ChainIndex, groups: Sequence[int | None],
               states: Sequence[Mapping[StateKey, str]], lineage: LineageReads | None) -> bool:
        """Whether every event the state sets share has a position in ``index`` -- true if
        every event of one set's state does. Known for the groups checked before against the
        same index (positions are never taken back), and for a group whose ancestor was, from
        the deltas since; else one pass over each state, remembered. (The rooms' checked
        groups are kept along its group tree as forks and state events extend it.)"""
        done = self._checked_for(room_id, index)
        positions = index.positions
        for group in groups:
            if group is None:
                continue
            path: list[int] = []
            g: int | None = group
            while g is not None and g not in done and lineage is not None and len(path) < self.base.CHECKED_HOPS:
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
        while len(done) > self.base.CHECKED_GROUPS:
            done.popitem(last=False)

    def delta(self) -> ChainsDelta:
        """What the batch adds to the cache: the indexes it built, and those the loader read
        that its plan did not use (with the batch's events: they are the stored ones)."""
        indexes = self.indexes
        unused = [r for r in self.loaded if r not in indexes]
        if unused:
            indexes = dict(indexes)
            for room_id in unused:
                added = self.added.get(room_id)
                index = self.loaded[room_id]
                if added:
                    index = index.copy()
                    index.extend(added)
                indexes[room_id] = index
        return ChainsDelta(self.added, indexes, self.used, self.unplaced, self.checked, self.loads, self.walks)


def redaction_applies(redaction: MatrixEvent, target: MatrixEvent, events: MatrixEvents | MatrixEventsBatch) -> bool:
    """Whether an accepted redaction prunes ``target``: v1-2 decided it in the auth rules;
    from v3 the sender needs the redact level in the redaction's own auth events, or the
    target's server (the spec's "handling redactions", Synapse's recheck)."""
    state = {}
    for auth_id in redaction.auth_event_ids:
        entry = events.entry(auth_id)
        if entry is not None and not entry[1]:
            state[entry[0].key] = entry[0]
    return redaction_takes_effect(redaction, target, state)

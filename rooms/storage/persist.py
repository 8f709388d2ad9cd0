"""``persist_events``: the one write path of room events -- load, plan, write.

One call = one transaction inside the stream-ID context of the ``events`` writer (or the
``backfill`` writer, whose IDs are negative): ``plan_loader`` reads what the batch refers to,
``planner`` decides every row (orderings, DAG edges and extremities, authorization, state
groups, current state and membership, visibility ranges, redactions) with no I/O -- what a
plan misses (``NeedsData``) the loader reads and the batch is planned again -- and ``plan_writer``
writes them with the ``events`` stream rows (``ev`` and ``state``), so replication sees the
events when the transaction completes. Any bad event raises :class:`BadEvent` and nothing is
written.

Speed: a batch costs a fixed number of statements whatever its size (look-ups by
``= ANY(array)``, inserts by ``unnest``; on SQLite ``json_each`` and ``executemany``, see
``sql.py``); per-room context (current state, extremities, visibility ranges) stays in
memory between batches and is checked against the ``rooms`` row, so the common case -- a
new message at the end of a room -- reads and writes almost nothing beyond its own rows.
Design notes: docs/storage.md.
"""
from __future__ import annotations

import gc
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rooms.storage.authorization import MatrixEvents, ResolvedStates, RoomAuthChains, RoomInfos
from rooms.storage.caches import storage_caches
from rooms.storage.incoming_events import IncomingEvent, ParsedEvent, parse_events
from rooms.storage.plan import Plan
from rooms.storage.plan_loader import BatchReader, EventFacts, RoomContexts, load_needed, load_snapshot
from rooms.storage.plan_needs import NeedsData
from rooms.storage.plan_snapshot import CacheDelta, Snapshot
from rooms.storage.plan_writer import write_plan
from rooms.storage.planner import plan_batch
from rooms.storage.sql import pipeline, store_cursor
from rooms.storage.state_deltas import GroupLineage
from rooms.storage.state_groups import StateGroupStore
from streams.runtime import runtime as process_runtime


@dataclass
class PersistedEvent:
    event_id: str
    room_id: str
    stream_ordering: int
    topological_ordering: int
    state_group: int | None


#: for processes that mostly persist (``generate_rooms``, the storage benchmark): after this
#: many committed batches the persister moves every object alive to the collector's permanent
#: generation (after collecting what is garbage). The caches hold millions of long-lived
#: objects, and Python's full collections walked them all again and again as the caches
#: churned -- a fifth of a writer's time (docs/benchmarks.md). Off by default: a process that
#: does other work may make cycles of frozen objects, which would never be collected.
FREEZE_EVERY = 50

#: the collector's thresholds in the same processes, set with the first freeze (the
#: ``"collect"`` way, :data:`BULK_GC`): a persist batch makes millions of short-lived objects,
#: and at Python's default (700, 10, 10) the collector ran a young collection every 700 of
#: them and walked the unfrozen survivors again and again (A/B, 150,000 events: process CPU
#: 27.1-27.7 -> 23.2-23.7 s, the collector's own time 13-16 -> 3-5.5 s; docs/benchmarks.md)
BULK_GC_THRESHOLD = (20_000, 20, 100)

#: how a persister set to freeze keeps the collector out of its way. ``"freeze"``: the
#: automatic collector is off from the first batch, and every ``freeze_every`` batches what is
#: alive is frozen, uncollected. ``"collect"``: the collector runs with
#: :data:`BULK_GC_THRESHOLD`, and each freeze starts with a full collection. Over the 10 M
#: build (docs/benchmarks.md) the collector took 12 % of the persist phase
#: (young collections of ~50 ms, each walking the big states a batch had just built, and
#: ~0.8 s for each full one before a freeze); at 500,000 events "freeze" spent 11-14 % less
#: CPU per event in this process. What it leaves uncollected: the cycles the collector
#: found, ~64 objects per 1,000 events (32,000 in 500,000 events), never freed.
BULK_GC = "freeze"

#: a batch planned this many times again and still missing data is a bug (each load reads
#: what was missed, so a plan misses something new every time); refused, not looped on
MAX_REPLANS = 100


class EventPersister:
    """Persists batches of events for one process (it holds the caches)."""

    def __init__(self, room_cache_size: int = 20_000, freeze_every: int | None = None) -> None:
        self.state = StateGroupStore()
        self.facts = EventFacts()
        self.room_infos = RoomInfos()
        self.matrix = MatrixEvents(self.room_infos)
        self.resolved = ResolvedStates()
        self.chains = RoomAuthChains()
        self.lineage = GroupLineage()
        self.rooms = RoomContexts(room_cache_size)
        self._lock = threading.Lock()
        self.freeze_every = freeze_every
        #: how freezing treats the collector (:data:`BULK_GC`), and its thresholds in the
        #: ``"collect"`` way (:data:`BULK_GC_THRESHOLD`)
        self.bulk_gc = BULK_GC
        self.gc_threshold = BULK_GC_THRESHOLD
        self._since_freeze = 0
        #: how many times a batch was planned again after reading what its plan missed
        #: (``NeedsData``), in all and by what was missed
        self.replans = 0
        self.replan_kinds: dict[str, int] = {}
        #: the collector's state before the first freeze changed it (enabled, thresholds)
        self._gc_before: tuple[bool, tuple[int, ...]] | None = None
        #: called after commit with [(room_id, stream)], [(user_id, stream)] (change caches)
        self.on_commit: list[Callable[[list[tuple[str, int]], list[tuple[str, int]]], None]] = []

    @property
    def bulk_gc(self) -> str:
        """How freezing treats the collector: ``"freeze"`` or ``"collect"`` (:data:`BULK_GC`)."""
        return self._bulk_gc

    @bulk_gc.setter
    def bulk_gc(self, value: str) -> None:
        if value not in ("freeze", "collect"):
            raise ValueError(f"bulk_gc is 'freeze' or 'collect', not {value!r}")
        self._bulk_gc = value

    def scale_caches(self, factor: float) -> None:
        """Every cache's bound times ``factor``: the defaults fit a working set of ~20,000
        active rooms; a persister serving ``factor`` times as many (each room's context, its
        auth and state events, its groups' states) thrashes below that -- at 100,000 rooms
        the state events needed by authorization outgrew ``MatrixEvents`` and every batch
        read them back (docs/benchmarks.md, the 10 M run)."""
        if not factor > 0:
            raise ValueError(f"a cache scale must be above 0, not {factor!r}")
        self.rooms.size = int(self.rooms.size * factor)
        self.matrix.size = int(self.matrix.size * factor)
        self.facts.size = int(self.facts.size * factor)
        self.state.scale(factor)
        self.resolved.scale(factor)
        self.chains.size = int(self.chains.size * factor)
        self.lineage.scale(factor)

    def persist(self, items: Sequence[IncomingEvent | bytes | str], writer: Any, *, backfill: bool) -> list[PersistedEvent]:
        with self._lock:
            room_infos = self.room_infos.batch(writer.using)
            events = parse_events(items, room_infos)
            if not events:
                return []
            with writer.transaction(len(events)) as ids, store_cursor(writer.using) as cur:
                reader = BatchReader(self.state, self.facts, self.matrix, self.resolved, self.chains,
                                     self.lineage, room_infos)
                group_ids = self.state.reserve(cur, 2 * len(events))
                snapshot = load_snapshot(cur, reader, events, self.rooms, group_ids, backfill=backfill)
                plan = self.plan(cur, reader, events, ids, snapshot, backfill=backfill, now_ms=int(time.time() * 1000))
                # nothing below reads a result: send it all in one pipeline (one network wait)
                with pipeline(cur):
                    write_plan(cur, writer, ids, plan)
            # committed: only now do the caches learn what the batch planned and read
            assert plan.delta is not None
            self._apply(plan.delta)
            self._freeze()
        self._committed(plan)
        return [PersistedEvent(ev.event_id, ev.room_id, ev.stream_ordering, ev.topological_ordering,
                               ev.state_group_after) for ev in plan.decided]

    def plan(self, cur: Any, reader: BatchReader, events: list[ParsedEvent], ids: Sequence[int],
             snapshot: Snapshot, *, backfill: bool, now_ms: int) -> Plan:
        """The batch's plan (``cur``: the open transaction's). The planner does no I/O: what
        it misses (:class:`NeedsData`) is read here into the batch's views, and the batch is
        planned again from the same snapshot (:attr:`replans` counts it: the loader's
        prefetch makes it rare)."""
        replans = 0
        while True:
            try:
                return plan_batch(events, ids, snapshot, reader, backfill=backfill, now_ms=now_ms)
            except NeedsData as needs:
                if replans >= MAX_REPLANS:
                    raise RuntimeError(f"a batch still misses data after {replans} plans ({needs})") from None
                load_needed(cur, reader, needs, replans)
                reader.reset()
                replans += 1
                self.replans += 1
                self.replan_kinds[needs.kind] = self.replan_kinds.get(needs.kind, 0) + 1

    def _apply(self, delta: CacheDelta) -> None:
        """A committed batch's cache delta, into every cache (and its rooms' contexts)."""
        self.room_infos.apply(delta.room_infos)
        self.state.apply(delta.groups)
        self.facts.apply(delta.facts, delta.facts_used)
        self.matrix.apply(delta.matrix)
        self.resolved.apply(delta.resolved)
        self.chains.apply(delta.chains)
        self.lineage.apply(delta.lineage)
        for ctx in delta.rooms:
            self.rooms.keep(ctx)

    def _freeze(self) -> None:
        """Every :attr:`freeze_every` batches: freeze what is alive (mostly the caches), so no
        collection walks it again. The ``"freeze"`` way (:data:`BULK_GC`) turns the automatic
        collector off with the first batch and collects nothing; the ``"collect"`` way raises
        its thresholds to :attr:`gc_threshold` and collects before each freeze. What is
        frozen is still freed by reference counting when dropped (evicted cache entries hold
        no cycles); only a cycle is never freed (uncollected, or made entirely of frozen
        objects)."""
        if not self.freeze_every:
            return
        if self._since_freeze == 0:
            if self._gc_before is None:
                self._gc_before = (gc.isenabled(), gc.get_threshold())
            if self.bulk_gc == "freeze":
                gc.disable()
            elif gc.get_threshold() < self.gc_threshold:
                gc.set_threshold(*self.gc_threshold)
        self._since_freeze += 1
        if self._since_freeze >= self.freeze_every:
            self._since_freeze = 0
            if self.bulk_gc == "collect":
                gc.collect()
            gc.freeze()

    def end_bulk(self) -> None:
        """The process's collector as it was before the first freeze (enabled again, its
        thresholds back), once a bulk load is over; what was frozen stays frozen."""
        if self._gc_before is None:
            return
        enabled, thresholds = self._gc_before
        self._gc_before = None
        self._since_freeze = 0
        gc.set_threshold(*thresholds)
        if enabled:
            gc.enable()

    def _committed(self, plan: Plan) -> None:
        room_changes = list(plan.room_changes.items())
        member_changes = list(plan.member_changes.items())
        for callback in self.on_commit:
            callback(room_changes, member_changes)


#: one persister (and its caches) per stream runtime; dropped with the runtime
_PERSISTERS: "weakref.WeakKeyDictionary[Any, EventPersister]" = weakref.WeakKeyDictionary()
_PERSISTERS_LOCK = threading.Lock()


def persister_for(runtime: Any) -> EventPersister:
    """The persister of a stream runtime (one per process and database)."""
    with _PERSISTERS_LOCK:
        p = _PERSISTERS.get(runtime)
        if p is None:
            p = _PERSISTERS[runtime] = EventPersister()
            p.on_commit.append(storage_caches(runtime).record_changes)
        return p


def persist_events(events: Sequence[IncomingEvent | bytes | str], *, backfill: bool = False,
                   runtime: Any = None) -> list[PersistedEvent]:
    """Persist ``events`` (raw JSON bytes/str or :class:`IncomingEvent`) in one transaction.

    ``backfill``: old history fetched from the past: negative stream orderings (the
    ``backfill`` stream), no change to forward extremities or current state.
    """
    if runtime is None:

        runtime = process_runtime()
    writer = runtime.writer("backfill" if backfill else "events")
    return persister_for(runtime).persist(events, writer, backfill=backfill)

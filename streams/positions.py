"""Stream positions: the scratchpad of a stream ID generator and the reader-side tracker.

Design notes: docs/streams.md. The rules are Synapse's ``MultiWriterIdGenerator`` (see
``synapse/storage/util/id_generators.py``; docs/streams.md, "Positions"), kept here free of any database or clock so that
they can be tested on their own:

* a writer's **current position** is the largest ID such that all of its reservations up to
  it have completed (a rollback completes too);
* the **linear position** ("persisted up to") is the largest ID such that every reservation by
  every writer up to it has completed.

Both are monotonic and may jump. All values are kept positive here; a backwards stream
(``backfill``) negates them at the edges (:class:`SignedPositions`).
"""
from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from streams.direction import IdDirection, direction


@dataclass(frozen=True)
class PendingId:
    """A reserved stream ID that has not completed yet."""

    stream_id: int
    instance_name: str
    reserved_at: float

    def age(self, now: float) -> float:
        return max(0.0, now - self.reserved_at)


@dataclass(frozen=True)
class RecordedLinear:
    """The linear position as the records tell it (:func:`linear_from_records`) and, when a
    pending ID holds it below the writers' positions, the writer that reserved it."""

    position: int
    held_by: str | None = None


def linear_from_records(positions: Mapping[str, int], pending: Iterable[tuple[str, int]]) -> RecordedLinear | None:
    """The linear position of a stream from what any process can read (tokens, counting up):
    each writer's recorded position and the IDs reserved and not yet completed, as
    ``(writer, id)``.

    Every ID the sequence handed out is either pending or complete, so the largest ID up to
    which all are complete is the furthest writer's position, or just below the lowest
    pending ID when that is lower. A writer with nothing pending does not hold it back however
    long ago it last wrote: this is :class:`StreamPositions`' rule (an idle writer "moves
    along"), and Synapse's ``MultiWriterIdGenerator``'s persisted-upto position. ``None``
    when no writer has recorded a position.
    """
    if not positions:
        return None
    furthest = max(positions.values())
    lowest = min(pending, key=lambda p: p[1], default=None)
    if lowest is not None and lowest[1] - 1 < furthest:
        return RecordedLinear(lowest[1] - 1, lowest[0])
    return RecordedLinear(furthest)


class StreamPositions:
    """The position bookkeeping of one stream as seen by one process.

    ``instance_name`` is this process. When it writes, it calls :meth:`begin_allocation`,
    :meth:`allocated` and later :meth:`finish`; what it learns about other writers arrives
    through :meth:`advance`. A process that never writes is simply a reader: the same rules
    then derive the linear position from the per-writer positions it is told about.

    Thread-safe: writers may complete IDs from several threads.
    """

    def __init__(
        self,
        instance_name: str,
        *,
        positions: Mapping[str, int] | None = None,
        persisted_upto: int = 1,
        clock: Callable[[], float],
    ) -> None:
        self.instance_name = instance_name
        self._clock = clock
        self._lock = threading.Lock()
        self._current: dict[str, int] = dict(positions or {})
        self._persisted_upto = persisted_upto
        # Local reservations not yet completed: id -> time reserved.
        self._unfinished: dict[int, float] = {}
        # For each allocation under way, the largest ID seen allocated when it started:
        # IDs above it may be handed out any moment, so nothing may advance past it.
        self._in_flight: list[int] = []
        # Local completed IDs still above the local position (waiting for a gap to close).
        self._finished: set[int] = set()
        # IDs known completed (by anyone) but above the linear position.
        self._known_persisted: list[int] = []
        #: the largest ID in it (when it is not empty)
        self._known_persisted_max = 0
        self._max_seen_allocated = max([persisted_upto, *self._current.values()])
        self._max_local = self._max_seen_allocated

    # -- writing ---------------------------------------------------------------------------

    def begin_allocation(self) -> int:
        """Call before asking the sequence for IDs; pass the result to :meth:`allocated`."""
        with self._lock:
            ticket = self._max_seen_allocated
            heapq.heappush(self._in_flight, ticket)
            return ticket

    def allocated(self, ticket: int, ids: Iterable[int] | None) -> None:
        """The sequence handed out ``ids`` (``None`` if the allocation failed)."""
        now = self._clock()
        with self._lock:
            if ids:
                ids = list(ids)
                # Whole batches at C speed: a hundred IDs per transaction is the common case.
                self._unfinished.update(dict.fromkeys(ids, now))
                highest = max(ids)
                if highest > self._max_seen_allocated:
                    self._max_seen_allocated = highest
            self._in_flight.remove(ticket)
            heapq.heapify(self._in_flight)

    def finish(self, ids: Iterable[int]) -> None:
        """These local IDs completed (committed or rolled back)."""
        ids = list(ids)
        with self._lock:
            unfinished = self._unfinished
            if len(unfinished) == len(ids) and unfinished.keys() == set(ids):
                unfinished.clear()  # the only transaction in flight (the common case)
            else:
                for stream_id in ids:
                    unfinished.pop(stream_id, None)
            self._finished.update(ids)

            new_current = None
            if unfinished or self._in_flight:
                min_unfinished = min(
                    [*([min(unfinished)] if unfinished else []),
                     *([self._in_flight[0] + 1] if self._in_flight else [])]
                )
                below = [s for s in self._finished if s < min_unfinished]
                if below:
                    new_current = max(below)
                self._finished = {s for s in self._finished if s >= min_unfinished}
            else:
                new_current = max(self._finished)
                self._finished.clear()

            if new_current:
                old = self._current.get(self.instance_name, 0)
                self._current[self.instance_name] = max(old, new_current)
                self._max_local = max(old, new_current, self._max_local)

            self._add_persisted_many(ids)

    def position_if_finished(self, ids: Iterable[int]) -> int | None:
        """This writer's position once ``ids`` (reserved, not finished) finish, if it is
        known now: when nothing else of this writer is outstanding. ``None`` otherwise.

        Lets the transaction that writes ``ids`` record the position itself, before the
        IDs finish here. Valid even if another allocation starts meanwhile: its IDs come
        from the sequence after every ID seen so far, so they are above this position.
        """
        ids = set(ids)
        with self._lock:
            if self._in_flight or self._finished or not ids or self._unfinished.keys() != ids:
                return None
            return max(self._max_local, self._max_seen_allocated, self._persisted_upto, max(ids))

    def position_floor_if_alone(self) -> int | None:
        """During this writer's only allocation (begun, not yet allocated, nothing else of
        its own outstanding): its position once the allocated IDs finish is the greater of
        this floor and their largest (:meth:`position_if_finished`). ``None`` otherwise."""
        with self._lock:
            if len(self._in_flight) != 1 or self._unfinished or self._finished:
                return None
            return max(self._max_local, self._max_seen_allocated, self._persisted_upto)

    def load(
        self,
        *,
        positions: Mapping[str, int],
        persisted_upto: int,
        rows: Iterable[tuple[str, int]],
        writers: Iterable[str] | None,
    ) -> None:
        """Start-up state read from the database (docs/streams.md, "Start-up and recovery").

        ``positions``: what ``stream_positions`` holds for the configured writers (a writer's
        own entry already replaced by the sequence value on PostgreSQL); ``persisted_upto``:
        where the linear position starts; ``rows``: ``(writer, id)`` of the rows at or above
        it, in any order; ``writers``: the configured writers, ``None`` when any process may
        write. Nothing is pending after a start.
        """
        with self._lock:
            self._current = dict(positions)
            self._persisted_upto = persisted_upto
            self._unfinished.clear()
            self._finished.clear()
            self._known_persisted = []
            self._known_persisted_max = 0
            for instance, stream_id in sorted(rows, key=lambda row: row[1]):
                self._add_persisted(stream_id)
                if instance == self.instance_name:
                    self._current[instance] = stream_id
            for writer in writers or ():
                self._current.setdefault(writer, self._persisted_upto)
            self._max_seen_allocated = max(max(self._current.values(), default=1), self._persisted_upto)
            self._max_local = self._max_seen_allocated
            if writers is None:
                self._current[self.instance_name] = self._persisted_upto

    # -- learning about others -------------------------------------------------------------

    def advance(self, instance_name: str, new_id: int) -> None:
        """Writer ``instance_name`` has completed everything up to ``new_id``."""
        with self._lock:
            self._current[instance_name] = max(new_id, self._current.get(instance_name, 0))
            self._max_seen_allocated = max(self._max_seen_allocated, new_id)
            self._add_persisted(new_id)

    def _add_persisted(self, new_id: int) -> None:
        self._add_persisted_many((new_id,))

    def _add_persisted_many(self, new_ids: Iterable[int]) -> None:
        """Record completed IDs and move the linear position on. Once per batch, not once
        per ID (hot path): IDs at or below the linear position once the writers' positions
        are taken into account never enter the heap."""
        ours = self._current.get(self.instance_name, 0)
        min_current = min(
            (pos for name, pos in self._current.items() if name != self.instance_name),
            default=ours,
        )
        busy = bool(self._unfinished or self._in_flight)
        if ours and busy:
            min_current = min(min_current, ours)
        self._persisted_upto = max(min_current, self._persisted_upto)
        self._max_local = max(self._max_local, self._persisted_upto)
        if not busy:
            # Nothing of ours is outstanding, so any future local ID will be above everything
            # seen: this (idle) writer may move along with the others.
            self._max_local = max(self._max_seen_allocated, self._max_local)

        heap = self._known_persisted
        upto = self._persisted_upto
        above = [new_id for new_id in new_ids if new_id > upto]
        if above:
            above.sort()
            if not heap and above[-1] - above[0] == len(above) - 1 and above[0] == upto + 1:
                # A gapless run just above the linear position (these IDs were the only
                # ones handed out meanwhile): the linear position moves to its end.
                self._persisted_upto = above[-1]
                return
            if not heap or above[0] >= self._known_persisted_max:
                # A sorted run, none below anything in the heap: appended, it is still a heap
                # (each element at least its parent). IDs come from the sequence in order,
                # so this is the usual case while another writer holds the linear position.
                heap.extend(above)
            else:
                for new_id in above:
                    heapq.heappush(heap, new_id)
            if above[-1] > self._known_persisted_max or len(heap) == len(above):
                self._known_persisted_max = above[-1]
        while heap:
            if heap[0] <= self._persisted_upto:
                heapq.heappop(heap)
            elif heap[0] == self._persisted_upto + 1:
                heapq.heappop(heap)
                self._persisted_upto += 1
            else:
                break

    # -- reading ---------------------------------------------------------------------------

    def linear(self) -> int:
        """The linear ("persisted up to") position."""
        with self._lock:
            return self._persisted_upto

    def for_writer(self, instance_name: str) -> int:
        """A writer's current position; unknown writers are assumed at the linear position."""
        with self._lock:
            if instance_name == self.instance_name:
                return self._max_local
            return max(self._current.get(instance_name, self._persisted_upto), self._persisted_upto)

    def minimal_local(self) -> int:
        """The position of this process's own completed writes (no optimistic move-along)."""
        with self._lock:
            return self._current.get(self.instance_name, self._persisted_upto)

    def positions(self) -> dict[str, int]:
        with self._lock:
            return dict(self._current)

    def max_seen_allocated(self) -> int:
        with self._lock:
            return self._max_seen_allocated

    def pending(self) -> list[PendingId]:
        """Local reservations that have not completed, lowest first."""
        with self._lock:
            return [
                PendingId(stream_id, self.instance_name, reserved_at)
                for stream_id, reserved_at in sorted(self._unfinished.items())
            ]

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._unfinished or self._in_flight)


class SignedPositions:
    """A view of :class:`StreamPositions` in stored sign (:mod:`streams.direction`).

    Backwards streams (``backfill``) store -1, -2, ... while the bookkeeping counts up.
    """

    def __init__(self, inner: StreamPositions, direction: IdDirection) -> None:
        self.inner = inner
        self.direction = direction

    def linear(self) -> int:
        return self.direction.from_wire(self.inner.linear())

    def for_writer(self, instance_name: str) -> int:
        return self.direction.from_wire(self.inner.for_writer(instance_name))

    def minimal_local(self) -> int:
        return self.direction.from_wire(self.inner.minimal_local())

    def positions(self) -> dict[str, int]:
        return {k: self.direction.from_wire(v) for k, v in self.inner.positions().items()}

    def advance(self, instance_name: str, new_id: int) -> None:
        self.inner.advance(instance_name, self.direction.to_wire(new_id))


class PositionTracker:
    """Reader-side positions of one stream: per-writer positions fed by updates (RDATA /
    POSITION), and the linear position derived from them.

    ``writers`` are the configured writers: until a writer has reported, the linear position
    cannot pass the position it started at.
    """

    def __init__(
        self,
        writers: Mapping[str, int],
        *,
        backwards: bool = False,
        clock: Callable[[], float],
    ) -> None:
        signs = direction(backwards)
        start = {name: signs.to_wire(pos) for name, pos in writers.items()}
        self._inner = StreamPositions(
            "", positions=start, persisted_upto=min(start.values(), default=1), clock=clock
        )
        self._view = SignedPositions(self._inner, signs)

    def advance(self, instance_name: str, token: int) -> None:
        self._view.advance(instance_name, token)

    def for_writer(self, instance_name: str) -> int:
        return self._view.for_writer(instance_name)

    def linear(self) -> int:
        return self._view.linear()

    def positions(self) -> dict[str, int]:
        return self._view.positions()

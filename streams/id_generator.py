"""``MultiWriterIdGenerator``: hands out stream IDs and tracks how far each writer got.

Design notes: docs/streams.md. The semantics are Synapse's (``synapse/storage/util/id_generators.py``): reserve
IDs (``nextval``), write the rows, complete the IDs on commit *and* on rollback; positions
only advance over contiguous completed IDs. The bookkeeping is :class:`StreamPositions`
(pure), the database work is an :class:`IdStore`; this class joins them and tells the
:class:`PositionNotifier` when this writer's position moved.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Iterator, Sequence

from streams.direction import direction
from streams.id_store import IdStore, PipelinedReservation, Reservation
from streams.notifier import PositionAdvanced, PositionNotifier, WireJournal
from streams.positions import PendingId, SignedPositions, StreamPositions

logger = logging.getLogger(__name__)


class NotAWriter(Exception):
    """This process is not a configured writer of the stream."""


class Completion:
    """The statement that completes a reservation inside the transaction writing its rows
    (:meth:`MultiWriterIdGenerator.get_next_mult_completing`): it deletes the reservation and
    records ``position`` (internal sign; ``None``: not known yet, recorded after the commit).
    A writer that dies before its commit leaves the reservation in place, as before."""

    __slots__ = ("sql", "params", "position", "done")

    def __init__(self, sql: str, params: Sequence[object], position: int | None) -> None:
        self.sql = sql
        self.params = params
        self.position = position
        self.done = False

    def committed(self) -> None:
        """The transaction that ran :attr:`sql` committed."""
        self.done = True


class PipelinedWrite:
    """A write begun with :meth:`MultiWriterIdGenerator.begin_pipelined`."""

    __slots__ = ("ticket", "statements", "position_floor")

    def __init__(self, ticket: int, statements: PipelinedReservation, position_floor: int | None) -> None:
        self.ticket = ticket
        self.statements = statements
        self.position_floor = position_floor


class MultiWriterIdGenerator:
    """Stream IDs for one stream in one process.

    ``writers``: the configured writer instances (``None``: any process may write, as for
    ``caches``). Positions are loaded from the database when the generator is built: a writer
    recovers its own position and starts with nothing pending.
    """

    def __init__(
        self,
        *,
        stream_name: str,
        instance_name: str,
        store: IdStore,
        writers: Sequence[str] | None,
        backwards: bool = False,
        notifier: PositionNotifier | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.stream_name = stream_name
        self.instance_name = instance_name
        self.writers = None if writers is None else tuple(writers)
        self.direction = direction(backwards)
        self._store = store
        self._notifier = notifier
        self._positions = StreamPositions(instance_name, clock=clock)
        self._signed = SignedPositions(self._positions, self.direction)
        self._notify_lock = threading.Lock()
        #: the wire rows of this process's completed IDs until their advance carries them
        #: (set while a replication streamer listens: streams.runtime)
        self.journal: WireJournal | None = None
        loaded = store.load_state(self.writers)
        self._positions.load(
            positions=loaded.positions,
            persisted_upto=loaded.persisted_upto,
            rows=loaded.rows,
            writers=self.writers,
        )
        self._last_published = self.get_current_token_for_writer(instance_name)
        if self.is_writer and self.writers is not None:
            # Recovered: nothing of ours is pending, so record where we stand. Readers that
            # load from the database stop holding the linear position back for IDs that an
            # earlier run of this writer reserved and never completed.
            store.raise_recorded_position(self._last_published)

    # -- writing ----------------------------------------------------------------------------

    @property
    def is_writer(self) -> bool:
        return self.writers is None or self.instance_name in self.writers

    @contextlib.contextmanager
    def get_next(self) -> Iterator[int]:
        """Reserve one ID; completes when the block exits, normally or by an exception."""
        with self.get_next_mult(1) as ids:
            yield ids[0]

    @contextlib.contextmanager
    def get_next_mult(self, n: int) -> Iterator[list[int]]:
        """Reserve ``n`` IDs in one round trip; all complete when the block exits.

        Wrap the transaction that writes the rows: a rolled-back block completes its IDs too
        (a fact with zero rows).
        """
        reservation = self._reserve(n)
        ok = False
        try:
            yield self._stored_ids(reservation)
            ok = True
        finally:
            self._complete(reservation, ok)

    @contextlib.contextmanager
    def get_next_mult_completing(
        self, n: int, run: Callable[[str, Sequence[object]], Sequence[object]] | None = None,
    ) -> Iterator[tuple[list[int], Completion | None]]:
        """As :meth:`get_next_mult`, for a caller that owns the transaction writing the rows:
        it also gets a :class:`Completion` (``None`` where the store has none: SQLite), runs
        its statement last in that transaction and calls :meth:`Completion.committed` once
        the commit succeeded. The reservation then goes, and the position is recorded, in
        the same commit as the rows, with no round trip of its own afterwards.

        Without ``committed()`` (an exception, a failed commit) the IDs complete as a
        rollback: the reservation is deleted on the dedicated connection, as usual.

        ``run``: how the caller runs the store's reserving statement on its own connection
        (:meth:`IdStore.reserve_statement`: a transaction of its own, committed before the
        one writing the rows begins; it returns the statement's row), saving the dedicated
        connection's round trip. If it raises, nothing is known of the reservation (its
        answer may be lost with the connection: then one that did commit shows as stuck
        until this writer restarts, as for :meth:`begin_pipelined`).
        """
        reservation = self._reserve(n, run)
        completion: Completion | None = None
        try:
            position = self._positions.position_if_finished(reservation.stream_ids)
            if self.writers is None:
                position = None  # any process writes (caches): no positions recorded
            statement = self._store.completion_statement(
                reservation, None if position is None else self.direction.from_wire(position)
            )
            if statement is not None:
                completion = Completion(statement[0], statement[1], position)
        except BaseException:
            self._complete(reservation, False)
            raise
        ok = False
        try:
            yield self._stored_ids(reservation), completion
            ok = True
        finally:
            if ok and completion is not None and completion.done:
                self._completed_in_transaction(reservation, completion.position)
            else:
                self._complete(reservation, ok)

    def begin_pipelined(self) -> PipelinedWrite | None:
        """Start a write of one ID whose reservation runs in the writer's own pipeline
        (:class:`PipelinedReservation`: one round trip for the whole transaction), or
        ``None`` where the store has no such statements. End it with :meth:`end_pipelined`,
        whatever happens."""
        self._check_writer()
        ticket = self._positions.begin_allocation()
        try:
            floor = self._positions.position_floor_if_alone() if self.writers is not None else None
            statements = self._store.pipelined_reservation(floor)
        except BaseException:
            self._positions.allocated(ticket, None)
            raise
        if statements is None:
            self._positions.allocated(ticket, None)
            return None
        return PipelinedWrite(ticket, statements, floor)

    def end_pipelined(self, write: PipelinedWrite, reservation: Reservation | None, committed: bool) -> None:
        """``reservation``: what the reserving statement returned (``None``: it failed, or its
        answer was lost with the connection: then nothing is known here, and a reservation
        that did commit shows as stuck until this writer restarts). ``committed``: the
        statement writing the rows committed."""
        self._positions.allocated(write.ticket, reservation.stream_ids if reservation else None)
        if reservation is None:
            return
        if committed:
            recorded = None if write.position_floor is None else max(write.position_floor, *reservation.stream_ids)
            self._completed_in_transaction(reservation, recorded)
        else:
            self._complete(reservation, False)

    def _stored_ids(self, reservation: Reservation) -> list[int]:
        """The reserved IDs as stored (negated for a backwards stream)."""
        if not self.direction.backwards:
            return list(reservation.stream_ids)
        return [self.direction.from_wire(i) for i in reservation.stream_ids]

    def _check_writer(self) -> None:
        if not self.is_writer:
            raise NotAWriter(
                f"{self.instance_name} is not a writer of stream {self.stream_name} "
                f"(writers: {', '.join(self.writers or ())})"
            )

    def _reserve(self, n: int, run: Callable[[str, Sequence[object]], Sequence[object]] | None = None) -> Reservation:
        if n < 1:
            raise ValueError("reserve at least one stream ID")
        self._check_writer()
        statement = self._store.reserve_statement(n) if run is not None else None
        ticket = self._positions.begin_allocation()
        reservation: Reservation | None = None
        try:
            if statement is not None and run is not None:
                reservation = self._store.reservation_from_row(run(*statement))
            else:
                reservation = self._store.reserve(n)
        finally:
            self._positions.allocated(ticket, reservation.stream_ids if reservation else None)
        return reservation

    def _completed_in_transaction(self, reservation: Reservation, recorded: int | None) -> None:
        """The writer's commit deleted the reservation and recorded position ``recorded``
        (internal sign); record again only if the position moved further meanwhile (or
        none was recorded)."""
        self._positions.finish(reservation.stream_ids)
        if self.writers is not None:
            position = self._positions.for_writer(self.instance_name)
            if recorded is None or position > recorded:
                try:
                    self._store.complete(reservation, self.direction.from_wire(position))
                except Exception:
                    logger.exception("stream %s: could not record position %d", self.stream_name, position)
        self._publish()

    def _complete(self, reservation: Reservation, ok: bool) -> None:
        self._positions.finish(reservation.stream_ids)
        position = self.get_current_token_for_writer(self.instance_name)
        try:
            # Only a successful write records a position: it then points at a written row.
            self._store.complete(reservation, position if ok and self.writers is not None else None)
        except Exception:
            logger.exception(
                "stream %s: could not record completion of %s", self.stream_name, reservation.stream_ids
            )
        self._publish()

    def _publish(self) -> None:
        if self._notifier is None or not self.is_writer:
            return
        # Notify under the lock: with several transactions in flight (threads completing at
        # once), advances must reach subscribers in order, each ``prev`` the last ``new``.
        with self._notify_lock:
            new = self.get_current_token_for_writer(self.instance_name)
            prev = self._last_published
            if self.direction.to_wire(new) <= self.direction.to_wire(prev):
                return
            self._last_published = new
            journal, signs = self.journal, self.direction
            facts = tuple(journal.take(signs.to_wire(prev), signs.to_wire(new), signs)) if journal is not None else ()
            self._notifier.position_advanced(
                PositionAdvanced(self.stream_name, self.instance_name, prev, new, facts)
            )

    # -- reading ----------------------------------------------------------------------------

    def get_current_token(self) -> int:
        """The linear position: every ID up to it, from every writer, has completed."""
        return self._signed.linear()

    get_persisted_upto_position = get_current_token

    def get_current_token_for_writer(self, instance_name: str) -> int:
        return self._signed.for_writer(instance_name)

    def get_minimal_local_current_token(self) -> int:
        return self._signed.minimal_local()

    def get_positions(self) -> dict[str, int]:
        return self._signed.positions()

    def get_max_allocated_token(self) -> int:
        return self.direction.from_wire(self._positions.max_seen_allocated())

    def pending(self) -> list[PendingId]:
        """This process's reserved, not yet completed IDs (external sign), lowest first."""
        return [
            PendingId(self.direction.from_wire(p.stream_id), p.instance_name, p.reserved_at)
            for p in self._positions.pending()
        ]

    def advance(self, instance_name: str, new_id: int) -> None:
        """Replication says ``instance_name`` completed everything up to ``new_id``."""
        self._signed.advance(instance_name, new_id)
        # An idle writer moves along with the others: publish it.
        self._publish()

    def close(self) -> None:
        if self.is_writer and not self._positions.has_unfinished():
            self._store.record_clean_exit()
        self._store.close()

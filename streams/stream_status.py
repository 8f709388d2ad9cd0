"""Where every stream stands, as the database records it, for any process to show.

Positions come from ``stream_positions``; pending IDs from ``stream_reservations`` (written
when IDs are reserved, removed when they complete), so a writer that died mid-transaction
is visible here with the age of its stuck IDs.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone

from streams.conf import repl_setting, stream_writers
from streams.direction import IdDirection
from streams.id_store import pid_alive
from streams.models import StreamPosition, StreamReservation
from streams.positions import RecordedLinear, linear_from_records
from streams.registry import STREAMS

#: what a backwards stream's negative positions mean, for the pages that show them
BACKWARDS_NOTE = ("backfill's stream IDs count down from -2, as Synapse's do (its backfilled events get "
                  "negative stream orderings): positions are negative, and a writer ahead has gone further "
                  "below zero")


@dataclass
class PendingStatus:
    instance_name: str
    stream_ids: list[int]
    reserved_at: datetime
    age_seconds: float
    stuck: bool
    pid: int


@dataclass
class WriterStatus:
    """One writer of a stream: where it is, when it last wrote, and whether the process that
    made that write still runs (``alive`` is None when it ran on another host: unknown here)."""

    name: str
    position: int | None
    ahead: int | None = None
    last_write: datetime | None = None
    last_write_age: float | None = None
    pid: int | None = None
    host: str | None = None
    alive: bool | None = None
    configured: bool = True
    #: when that process closed the writer cleanly (nothing pending); None if it has not
    exited_at: datetime | None = None
    #: IDs of this writer are pending in stream_reservations (in flight, or left by a death)
    has_pending: bool = False

    @property
    def finished(self) -> bool:
        """Its process has exited after closing the writer cleanly, leaving nothing pending
        (a one-shot ``write_facts`` that is done): no incident."""
        return (self.alive is False and self.exited_at is not None and not self.has_pending
                and (self.last_write is None or self.exited_at >= self.last_write))

    @property
    def gone(self) -> bool:
        """Its process is gone without a clean exit (killed, crashed, or leaving IDs pending)."""
        return self.alive is False and not self.finished


@dataclass
class StreamStatus:
    name: str
    db_backed: bool
    multi_writer: bool
    backwards: bool
    writers: list[str] | None
    positions: dict[str, int] = field(default_factory=dict)
    pending: list[PendingStatus] = field(default_factory=list)
    #: positions recorded by instances this process's STREAM_WRITERS does not name
    unconfigured: dict[str, int] = field(default_factory=dict)
    #: per writer (recorded or configured): last write and liveness
    writer_status: dict[str, WriterStatus] = field(default_factory=dict)

    @property
    def writer_rows(self) -> list[WriterStatus]:
        """Every configured writer with a recorded position, then those that have written
        nothing yet; each with how far it is ahead of linear."""
        linear = self.linear
        rows = []
        for name in [*self.positions, *(w for w in self.writers or () if w not in self.positions)]:
            w = self.writer_status.get(name) or WriterStatus(name, None)
            if w.position is not None and linear is not None:
                # behind linear is no lag: an idle writer that others have passed
                to_wire = IdDirection(self.backwards).to_wire
                w.ahead = max(0, to_wire(w.position) - to_wire(linear))
            rows.append(w)
        return rows

    @property
    def writers_warning(self) -> str | None:
        """Says so when the configured writers disagree with what other processes recorded
        (their rows are kept, never deleted, and left out of the linear position here)."""
        if not self.unconfigured:
            return None
        return (f"{self.name}: positions are recorded for {', '.join(sorted(self.unconfigured))}, "
                f"which this process's STREAM_WRITERS ({', '.join(self.writers or [])}) does not name; "
                f"the processes' STREAM_WRITERS disagree")

    @property
    def recorded_linear(self) -> RecordedLinear | None:
        """The linear position from the records (:func:`linear_from_records`), in tokens."""
        # Only the configured writers count, unless none of them recorded anything: then what
        # the other processes recorded is all there is to go by.
        positions = self.positions or self.unconfigured
        to_wire = IdDirection(self.backwards).to_wire
        return linear_from_records(
            {name: to_wire(pos) for name, pos in positions.items()},
            [(p.instance_name, to_wire(i)) for p in self.pending for i in p.stream_ids])

    @property
    def linear(self) -> int | None:
        """The linear position (stored sign): the largest ID up to which every ID is complete.
        A writer with nothing pending does not hold it back, however long it has been idle."""
        recorded = self.recorded_linear
        return None if recorded is None else IdDirection(self.backwards).from_wire(recorded.position)

    @property
    def laggard(self) -> str | None:
        """The writer whose pending (in flight or stuck) ID holds the linear position below
        another writer's position; None when nothing does."""
        recorded = self.recorded_linear
        return None if recorded is None else recorded.held_by

    @property
    def stuck(self) -> list[PendingStatus]:
        return [p for p in self.pending if p.stuck]


def stream_status(now: datetime | None = None, stuck_after: float | None = None,
                  in_memory: dict[str, dict[str, int]] | None = None) -> list[StreamStatus]:
    """Every stream: database-backed ones as the tables record them; ``in_memory``, the
    positions of the streams a process keeps in memory (typing) as that process knows them
    (``StreamRuntime.in_memory_positions``: only the process holding the writer can tell)."""
    now = now or datetime.now(timezone.utc)
    stuck_after = repl_setting("STUCK_AFTER_SECONDS") if stuck_after is None else stuck_after
    writers = stream_writers()
    result = {
        name: StreamStatus(name, spec.db_backed, spec.multi_writer, spec.backwards,
                           list(writers[name]) if writers.get(name) else None)
        for name, spec in STREAMS.items()
    }
    for name, positions in (in_memory or {}).items():
        if name in result and not result[name].db_backed:
            result[name].positions.update(positions)
            for writer, token in positions.items():
                result[name].writer_status[writer] = WriterStatus(writer, token, alive=True)
    here = socket.gethostname()
    for row in StreamPosition.objects.order_by("stream_name", "instance_name"):
        if row.stream_name in result:
            s = result[row.stream_name]
            configured = s.writers is None or row.instance_name in s.writers
            if configured:
                s.positions[row.instance_name] = row.stream_id
            else:
                s.unconfigured[row.instance_name] = row.stream_id
            s.writer_status[row.instance_name] = WriterStatus(
                row.instance_name, row.stream_id, last_write=row.recorded_at,
                last_write_age=(now - row.recorded_at).total_seconds() if row.recorded_at else None,
                pid=row.pid, host=row.host, configured=configured,
                alive=pid_alive(row.pid) if row.pid and row.host == here else None, exited_at=row.exited_at,
            )
    for res in StreamReservation.objects.order_by("reserved_at"):
        if res.stream_name in result:
            age = (now - res.reserved_at).total_seconds()
            result[res.stream_name].pending.append(PendingStatus(
                res.instance_name, list(res.stream_ids), res.reserved_at, age, age > stuck_after, res.pid,
            ))
            writer = result[res.stream_name].writer_status.get(res.instance_name)
            if writer is not None:
                writer.has_pending = True
    return list(result.values())

"""What an endpoint's relay does with each writer's run and each poll of ``stream_positions``
(docs/replication.md, "The relay").

``RelayPolicy`` is pure: no sockets, no asyncio, no clock, no Django. It is fed a writer's
:class:`~replication.protocol.line_batch.WriterRun` as it arrives, or the rows of a
poll of ``stream_positions``, with ``now``, and answers with a :class:`Decision` whose
``batch`` (if any) the relay (:mod:`replication.endpoint.relay`) sends to every
connection. Per (stream, writer) it keeps the last token sent on, and

* **relay**: a run whose ``prev`` it has reached goes on whole (lines at or below what a
  worker has are dropped by the worker);
* **repair**: a run after a gap (a lost message) becomes ``POSITION s w new new``: each worker
  sees it is behind and fetches the missing facts from the catch-up endpoint; so does a writer
  the database has recorded ahead of what was sent for longer than ``grace`` (its message
  lost, or a writer with no shared channel layer);
* **reset**: an in-memory stream's writer restarted (its run starts below what was sent):
  ``POSITION s w prev prev`` then the run, so workers start over too;
* **start**: the first run heard of an in-memory stream's writer: ``POSITION s w prev prev``
  then the run (a bare POSITION at its end would make a worker skip the run's rows);
* **covered** (already sent), **unknown** (no such stream), **scan** (the embedded default
  reads database streams from the database: the run only wakes the scan).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from replication.protocol.commands import PositionCommand
from replication.protocol.line_batch import LineBatch, WriterRun
from replication.worker.follower import RESETTABLE_STREAMS, StreamKey
from streams.registry import STREAMS

Action = Literal["relay", "repair", "reset", "start", "covered", "unknown", "scan"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one run: ``batch`` goes to every connection (None: nothing)."""

    action: Action
    batch: LineBatch | None = None


def positions_batch(items: Iterable[tuple[StreamKey, int]]) -> LineBatch:
    """``POSITION s w t t`` for each ((stream, writer), token): where a worker that is behind
    catches up to."""
    return LineBatch.of_commands([PositionCommand(s, w, t, t) for (s, w), t in items])


@dataclass
class RelayPolicy:
    """Per endpoint: the last token sent per (stream, writer), and what each input makes of it."""

    #: a writer the database has ahead of what was sent for this long is repaired
    grace: float
    #: the embedded default (SQLite, no Redis): database streams are read, not relayed
    local_scan: bool = False
    last_sent: dict[StreamKey, int] = field(default_factory=dict)
    #: when ``last_sent`` last changed per key, and when a poll last found the database agree
    changed_at: dict[StreamKey, float] = field(default_factory=dict)
    agreed_at: dict[StreamKey, float] = field(default_factory=dict)
    #: per key the database is ahead of what was sent: (its token, since when)
    behind_since: dict[StreamKey, tuple[int, float]] = field(default_factory=dict)
    relayed_messages: int = 0
    repairs: int = 0
    resets: int = 0

    def on_run(self, run: WriterRun, now: float) -> Decision:
        key = (run.stream, run.writer)
        spec = STREAMS.get(run.stream)
        if spec is None:
            return Decision("unknown")
        if self.local_scan and spec.db_backed:
            # A write of this process: its rows are in the database now, to be read (with
            # whatever other local processes wrote under the same writer name). In-memory
            # streams (typing) have no rows to read: relayed as usual.
            return Decision("scan")
        prev, new = run.prev, run.new
        last = self.last_sent.get(key)
        if key[0] in RESETTABLE_STREAMS and (last is None or prev < last):
            # last is None: the first run heard of this writer (it started after the endpoint,
            # or this is its first change). prev < last: the writer restarted (its tokens start
            # again from 0; a live writer's next run starts where its last ended). POSITION
            # prev prev is where the run starts: below a restarted writer's workers' token
            # (they reset to it), and where a worker that never heard of the writer starts.
            self.last_sent[key] = new
            self.changed_at[key] = now
            action: Action = "start" if last is None else "reset"
            if last is not None:
                self.resets += 1
            start = LineBatch.of_commands([PositionCommand(key[0], key[1], prev, prev)])
            return Decision(action, start + LineBatch.of_run(run))
        if last is not None and new <= last:
            return Decision("covered")
        self.last_sent[key] = new
        self.changed_at[key] = now
        self.behind_since.pop(key, None)
        if last is not None and prev <= last:
            self.relayed_messages += 1
            return Decision("relay", LineBatch.of_run(run))
        # We never saw (last, prev]: let every worker fetch what it is missing.
        self.repairs += 1
        return Decision("repair", positions_batch([(key, new)]))

    def on_positions(self, rows: Iterable[tuple[str, str, int]], now: float) -> LineBatch | None:
        """A poll of ``stream_positions`` (stream, writer, stream ID) read at ``now``: the
        POSITIONs for writers behind for ``grace`` or longer, or None."""
        repairs: list[tuple[StreamKey, int]] = []
        for stream_name, instance_name, stream_id in rows:
            spec = STREAMS.get(stream_name)
            if spec is None or not spec.db_backed:
                continue
            key, token = (stream_name, instance_name), spec.to_wire(stream_id)
            if token <= self.last_sent.get(key, 0):
                self.behind_since.pop(key, None)
                self.agreed_at[key] = now
                continue
            seen = self.behind_since.setdefault(key, (token, now))
            if now - seen[1] >= self.grace:
                repairs.append((key, token))
        if not repairs:
            return None
        for key, token in repairs:
            self.last_sent[key] = token
            self.changed_at[key] = now
            self.behind_since.pop(key, None)
        self.repairs += len(repairs)
        return positions_batch(repairs)

    def settled_positions(self, now: float, min_idle: float = 2.0) -> dict[StreamKey, int]:
        """Positions of writers that have been still for ``min_idle`` seconds, confirmed by
        the database since. Safe to announce on a writer's behalf (to Redis subscribers):
        a writer that is still publishing announces itself, and a position announced for it
        must never be below lines it already published."""
        return {
            key: token for key, token in self.last_sent.items()
            if now - self.changed_at.get(key, 0.0) >= min_idle
            and self.agreed_at.get(key, -1.0) >= self.changed_at.get(key, 0.0)
        }

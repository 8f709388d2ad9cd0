"""Receiving rules of one replication follower (docs/replication.md, "The worker";
Synapse's ``ReplicationCommandHandler``, ``synapse/replication/tcp/handler.py``).

``StreamFollower`` is pure: no sockets, no asyncio, no clock, no Django. It is fed the RDATA and
POSITION commands of one worker process and the pages of HTTP catch-up, and answers with
*decisions* for an adapter (``base.py``) to execute, in the order returned:

* ``Deliver(stream, writer, token, rows)`` — a fact to hand to the application (once, in order);
* ``Advanced(stream, writer, token)`` — the writer's position moved with no rows (Synapse's
  ``on_position``);
* ``Reset(stream, writer)`` — an in-memory stream's writer restarted (its tokens went
  backwards): drop everything derived from it; following decisions count from 0 again;
* ``FetchCatchUp(stream, writer, from_token, upto_token, delay)`` — fetch ``(from, upto]`` from
  the catch-up endpoint after ``delay`` seconds and report with :meth:`on_catch_up_page` or
  :meth:`catch_up_failed`.

Per-stream ordering (the design choice). Synapse gives each stream one FIFO queue and one
consumer that *awaits* the catch-up before taking the next item, so RDATA can never race a
POSITION catch-up (``synapse/replication/tcp/handler.py``; RDATA arriving after a later POSITION
was matrix-org/synapse#7360). Here the follower holds that queue itself: while a
catch-up of stream S is in flight, every RDATA/POSITION of S is parked in S's queue and replayed,
in arrival order and under the normal rules, as soon as the catch-up ends. Other streams go on.
So the whole ordering argument lives in this file and is tested without I/O; the adapter only
has to run the decisions it gets, in order, per stream.

Deliberate departures from Synapse, each safer and otherwise equivalent:

* ``batch`` rows are buffered per (stream, writer), not per stream: a POSITION of one writer no
  longer throws away another writer's half-received batch.
* POSITION for an unknown (not followed) stream is logged once and ignored (Synapse raises).
* a failed catch-up is retried with back-off (:meth:`catch_up_failed`) instead of leaving the
  stream disconnected until its next POSITION.
* pending batches are also dropped on connection loss (they could never complete anyway: the
  first thing processed on the next connection is a POSITION, which drops them).
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence, Union

from replication.protocol.commands import PositionCommand, RdataCommand, group_updates

logger = logging.getLogger(__name__)

#: Streams whose writer keeps its tokens in memory, so they restart from 0 with the writer
#: (``Stream.can_discard_position`` of ``synapse/replication/tcp/streams/_base.py`` is false
#: for them). Only ``typing`` exists here.
RESETTABLE_STREAMS = frozenset({"typing", "federation", "presence_federation"})

#: First retry of a failed catch-up after this many seconds, doubling up to the cap: quick
#: enough that a writer's brief restart costs little, slow enough not to hammer a writer that
#: is down (matrix-org/synapse#7444, #11750: catch-ups piled up on a restarted writer).
RETRY_FIRST_DELAY = 0.25
RETRY_MAX_DELAY = 10.0

StreamKey = tuple[str, str]  # (stream, writer)


@dataclass(frozen=True, slots=True)
class Deliver:
    """Rows of one fact (one token) of ``writer`` on ``stream``, to apply exactly once."""

    stream: str
    writer: str
    token: int
    rows: tuple[Any, ...]


_new_object = object.__new__
# One Deliver per fact a worker receives: made by filling its slots (see _deliver).
_set_deliver_fields = tuple(Deliver.__dict__[name].__set__ for name in ("stream", "writer", "token", "rows"))


def _deliver(stream: str, writer: str, token: int, rows: tuple[Any, ...]) -> Deliver:
    """``Deliver(stream, writer, token, rows)`` without the frozen dataclass's ``__init__``,
    which sets each field through ``object.__setattr__`` (~1 us, per fact in every worker)."""
    decision = _new_object(Deliver)
    set_stream, set_writer, set_token, set_rows = _set_deliver_fields
    set_stream(decision, stream)
    set_writer(decision, writer)
    set_token(decision, token)
    set_rows(decision, rows)
    return decision


@dataclass(frozen=True, slots=True)
class DeliverRun:
    """Facts of one ``writer`` on ``stream``, in order: ``facts`` is ``(token, rows)`` per
    fact, each to apply exactly once as a :class:`Deliver` of it would be. The decision for a
    run of RDATA (:meth:`StreamFollower.on_rdata_run`): one per run instead of one per fact.
    """

    stream: str
    writer: str
    facts: list[tuple[int, list[Any]]]

    def delivers(self) -> list[Deliver]:
        """The same facts as one :class:`Deliver` each."""
        return [Deliver(self.stream, self.writer, token, tuple(rows)) for token, rows in self.facts]


@dataclass(frozen=True)
class Advanced:
    """``writer``'s position on ``stream`` is now ``token``; there are no rows to apply."""

    stream: str
    writer: str
    token: int


@dataclass(frozen=True)
class Reset:
    """``writer`` of an in-memory ``stream`` restarted: forget its state; tokens start over."""

    stream: str
    writer: str


@dataclass(frozen=True)
class FetchCatchUp:
    """Fetch the rows of ``writer`` on ``stream`` in ``(from_token, upto_token]``.

    ``delay`` is how long to wait first (0 for a first attempt; back-off for retries) and
    ``attempt`` counts failures so far, for logging.
    """

    stream: str
    writer: str
    from_token: int
    upto_token: int
    delay: float = 0.0
    attempt: int = 0


Decision = Union[Deliver, DeliverRun, Advanced, Reset, FetchCatchUp]
Command = Union[RdataCommand, PositionCommand]


@dataclass
class _CatchUp:
    """The one catch-up in flight for a stream."""

    writer: str
    from_token: int  # next page starts after this token
    target: int  # the POSITION's new token
    epoch: int  # connection it was started on
    failures: int = 0

    def request(self, stream: str, delay: float = 0.0) -> FetchCatchUp:
        return FetchCatchUp(stream, self.writer, self.from_token, self.target, delay, self.failures)


class StreamFollower:
    """Per-(stream, writer) current tokens and the receiving rules for one worker process.

    The *current token* of a writer is the highest token whose facts (and every earlier fact of
    that writer) have been decided: handed out as ``Deliver``/``Advanced``. A stream is
    *connected* per writer once a POSITION for that writer has been fully processed on the current
    connection; until then the writer's RDATA is dropped, because that POSITION triggers a
    catch-up covering it.

    ``initial_tokens`` maps (stream, writer) to where the caller already is; writers not listed
    start at ``default_token``. Only ``streams`` are followed; commands for others are ignored.
    """

    def __init__(
        self,
        instance_name: str,
        streams: Collection[str],
        initial_tokens: Mapping[StreamKey, int] | None = None,
        *,
        default_token: int = 0,
        resettable: Collection[str] = RESETTABLE_STREAMS,
    ) -> None:
        self.instance_name = instance_name
        self.streams = frozenset(streams)
        self.default_token = default_token
        self.resettable = frozenset(resettable)
        self._tokens: dict[StreamKey, int] = dict(initial_tokens or {})
        self._connected: set[StreamKey] = set()
        self._batches: dict[StreamKey, list[Any]] = {}
        self._catch_ups: dict[str, _CatchUp] = {}
        self._queues: dict[str, deque[tuple[int, Command]]] = {}
        self._epoch = 0
        self._ignored_streams: set[str] = set()

    # --- inspection ------------------------------------------------------------------------

    def current_token(self, stream: str, writer: str) -> int:
        return self._tokens.get((stream, writer), self.default_token)

    def positions(self) -> dict[StreamKey, int]:
        return dict(self._tokens)

    @property
    def connected_streams(self) -> frozenset[str]:
        return frozenset(stream for stream, _ in self._connected)

    @property
    def connected_writers(self) -> frozenset[StreamKey]:
        return frozenset(self._connected)

    def catching_up(self) -> dict[str, FetchCatchUp]:
        """The catch-up in flight per stream, as the request for its next page."""
        return {stream: c.request(stream) for stream, c in self._catch_ups.items()}

    def queued(self, stream: str) -> int:
        """Commands of ``stream`` waiting for its catch-up to finish."""
        return len(self._queues.get(stream, ()))

    # --- connection ------------------------------------------------------------------------

    def connection_lost(self) -> None:
        """Forget which streams were connected (as Synapse's handler does): each needs a new POSITION.

        Catch-ups in flight go on (their rows are real) but will not mark their stream
        connected. Commands of the old connection still queued behind them are dropped: the
        next connection re-announces every position (REPLICATE), which covers them.
        """
        if self._connected:
            logger.info("replication connection lost; streams now disconnected: %s",
                        ", ".join(sorted(self.connected_streams)))
        self._connected.clear()
        self._batches.clear()
        self._epoch += 1

    # --- commands --------------------------------------------------------------------------

    def on_rdata(self, cmd: RdataCommand) -> list[Decision]:
        if not self._follows(cmd.stream_name, cmd.instance_name):
            return []
        if cmd.stream_name in self._catch_ups:
            return self._submit(cmd)  # parked behind the catch-up
        return self._process_rdata(cmd)  # _submit's other case, without its two calls (per fact)

    def on_rdata_run(self, stream: str, writer: str, entries: Sequence[tuple[int | None, Any]]) -> list[Decision]:
        """A run of RDATA of one ``writer`` on ``stream`` (``(token, row)`` in arrival order,
        ``token`` None for ``batch``): what :meth:`on_rdata` decides for each, with the
        delivered facts as one :class:`DeliverRun`.

        Nothing but RDATA of this writer arrives within the run, so whether the writer is
        connected (only a POSITION changes that) is asked once."""
        if not self._follows(stream, writer):
            return []
        if stream in self._catch_ups:
            for token, row in entries:  # parked behind the catch-up, one command each
                self._submit(RdataCommand(stream, writer, token, row))
            return []
        key = (stream, writer)
        if key not in self._connected:
            return []  # as _process_rdata: the POSITION that must come first fetches them
        batch = self._batches.pop(key, None) if self._batches else None
        current = self._tokens.get(key, self.default_token)
        facts: list[tuple[int, list[Any]]] = []
        for token, row in entries:
            if token is None:
                if batch is None:
                    batch = [row]
                else:
                    batch.append(row)
                continue
            if token > current:
                current = token
                if batch is None:
                    facts.append((token, [row]))
                else:
                    batch.append(row)
                    facts.append((token, batch))
            # else stale or duplicate (matrix-org/synapse#7360): dropped with its batch rows
            batch = None
        if batch is not None:
            self._batches[key] = batch
        if not facts:
            return []
        self._tokens[key] = current
        return [DeliverRun(stream, writer, facts)]

    def on_position(self, cmd: PositionCommand) -> list[Decision]:
        if not self._follows(cmd.stream_name, cmd.instance_name):
            return []
        # Early discard (Synapse's ``can_discard_position``), only when nothing of the stream is waiting in line.
        if cmd.stream_name not in self._catch_ups and self._can_discard(cmd):
            return []
        return self._submit(cmd)

    def on_catch_up_page(
        self,
        stream: str,
        writer: str,
        updates: Sequence[Sequence[Any]],
        upto_token: int,
        limited: bool,
    ) -> list[Decision]:
        """One page of ``get_repl_stream_updates``: deliver it, then ask for more or finish.

        ``updates`` are ``[token, row]`` pairs sorted by token, rows of one token never split
        across pages. Rows at or below the current token are skipped (never delivered twice).
        """
        catch_up = self._catch_ups.get(stream)
        if catch_up is None or catch_up.writer != writer:
            logger.warning("catch-up page for %s/%s that nobody asked for; ignored", stream, writer)
            return []
        key = (stream, writer)
        decisions: list[Decision] = []
        for token, rows in group_updates([(int(t), row) for t, row in updates]):
            if token > self.current_token(stream, writer):
                self._tokens[key] = token
                decisions.append(Deliver(stream, writer, token, tuple(rows)))
        catch_up.failures = 0
        if limited and upto_token < catch_up.target:
            if upto_token <= catch_up.from_token:
                logger.warning("catch-up of %s/%s made no progress (upto %s after %s); retrying",
                               stream, writer, upto_token, catch_up.from_token)
                return decisions + self.catch_up_failed(stream, writer)
            catch_up.from_token = upto_token
            self._tokens[key] = max(self.current_token(stream, writer), upto_token)
            return decisions + [catch_up.request(stream)]
        return decisions + self._finish_catch_up(stream)

    def catch_up_failed(self, stream: str, writer: str) -> list[Decision]:
        """The last page request failed: ask for it again after a back-off delay."""
        catch_up = self._catch_ups.get(stream)
        if catch_up is None or catch_up.writer != writer:
            return []
        catch_up.failures += 1
        delay = min(RETRY_FIRST_DELAY * 2 ** (catch_up.failures - 1), RETRY_MAX_DELAY)
        return [catch_up.request(stream, delay)]

    # --- internals -------------------------------------------------------------------------

    def _follows(self, stream: str, writer: str) -> bool:
        if writer == self.instance_name:
            return False  # our own echo (Synapse's handler ignores it too)
        if stream not in self.streams:
            if stream not in self._ignored_streams:
                self._ignored_streams.add(stream)
                logger.info("ignoring replication stream %r: not followed by this worker", stream)
            return False
        return True

    def _can_discard(self, cmd: PositionCommand) -> bool:
        """Synapse's ``can_discard_position``, and only for a connected stream."""
        return (
            (cmd.stream_name, cmd.instance_name) in self._connected
            and cmd.stream_name not in self.resettable
            and cmd.new_token <= self.current_token(cmd.stream_name, cmd.instance_name)
        )

    def _submit(self, cmd: Command) -> list[Decision]:
        stream = cmd.stream_name
        if stream in self._catch_ups:
            self._queues.setdefault(stream, deque()).append((self._epoch, cmd))
            return []
        return self._process(self._epoch, cmd)

    def _process(self, epoch: int, cmd: Command) -> list[Decision]:
        if epoch != self._epoch:
            return []  # from a lost connection: the next one re-announces every position
        if isinstance(cmd, RdataCommand):
            return self._process_rdata(cmd)
        return self._process_position(cmd)

    def _process_rdata(self, cmd: RdataCommand) -> list[Decision]:
        stream, writer = cmd.stream_name, cmd.instance_name
        key = (stream, writer)
        if key not in self._connected:
            # The POSITION for this writer that must come first will fetch it. Per writer,
            # not per stream as in Synapse: a POSITION from one writer says nothing about
            # what we may have missed from another (after a Redis reconnect, say).
            return []
        token = cmd.token
        if token is None:
            self._batches.setdefault(key, []).append(cmd.row)
            return []
        batch = self._batches.pop(key, None) if self._batches else None
        if token <= self._tokens.get(key, self.default_token):
            return []  # stale or duplicate (matrix-org/synapse#7360)
        self._tokens[key] = token
        return [_deliver(stream, writer, token, (cmd.row,) if batch is None else (*batch, cmd.row))]

    def _process_position(self, cmd: PositionCommand) -> list[Decision]:
        """The POSITION rules, case by case, of docs/replication.md, "The worker"; a vector for each
        case in tests/replication/test_follower.py."""
        stream, writer = cmd.stream_name, cmd.instance_name
        prev, new = cmd.prev_token, cmd.new_token
        if self._can_discard(cmd):
            return []
        key = (stream, writer)
        self._connected.discard(key)
        self._batches.pop(key, None)
        decisions: list[Decision] = []
        current = self.current_token(stream, writer)
        if current > new and stream in self.resettable:
            logger.info("%s writer %s restarted (token %s after %s); resetting", stream, writer,
                        new, current)
            decisions.append(Reset(stream, writer))
            current = self._tokens[key] = 0
        if prev <= current <= new or current > new:
            # Nothing missed (the writer vouches for (prev, new]), or a DB stream's position
            # announced below ours: positions never go backwards.
            if new > current:
                self._tokens[key] = new
                decisions.append(Advanced(stream, writer, new))
            self._connected.add(key)
            return decisions
        catch_up = _CatchUp(writer, from_token=current, target=new, epoch=self._epoch)
        self._catch_ups[stream] = catch_up
        return decisions + [catch_up.request(stream)]

    def _finish_catch_up(self, stream: str) -> list[Decision]:
        catch_up = self._catch_ups.pop(stream)
        key = (stream, catch_up.writer)
        token = max(self.current_token(*key), catch_up.target)
        self._tokens[key] = token
        decisions: list[Decision] = [Advanced(stream, catch_up.writer, token)]
        if catch_up.epoch == self._epoch:
            self._connected.add(key)
        return decisions + self._drain(stream)

    def _drain(self, stream: str) -> list[Decision]:
        """Replay the commands parked behind a finished catch-up, until the next one starts."""
        queue = self._queues.get(stream)
        decisions: list[Decision] = []
        while queue and stream not in self._catch_ups:
            epoch, cmd = queue.popleft()
            decisions.extend(self._process(epoch, cmd))
        if not queue:
            self._queues.pop(stream, None)
        return decisions

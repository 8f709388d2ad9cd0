"""The endpoint side of the sending path: relays every writer's runs to this endpoint's
connections, and repairs what it cannot relay. See docs/replication.md.

Writers publish their RDATA/POSITION lines on the cluster group ``replication.lines``
(see :mod:`replication.publish.streamer`), one
:class:`~replication.protocol.line_batch.WriterRun` per message, each covering
``(prev, new]`` of one (stream, writer). What becomes of each run, and of each poll of
``stream_positions``, is :class:`~replication.endpoint.relay_policy.RelayPolicy`'s
decision (relay, repair, reset, start); this module is its I/O: it reads the group and polls
the table, passes ``now``, and hands each decision's
:class:`~replication.protocol.line_batch.LineBatch` to the connections.

On the embedded default (SQLite, no Redis: ``local_scan=True``) it relays nothing of the
database streams and repairs nothing: it reads every local writer's committed rows from the
database and sends them as RDATA (:mod:`replication.endpoint.local_scan`); runs of
this process only wake that scan.

Batches reach the connections by a direct call each; they are numbered so a connection that
misses one notices and reconnects.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Mapping

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import DatabaseError

from common.error_text import one_line
from replication.endpoint.layer_subscribe import GroupSubscriber
from replication.endpoint.local_scan import ScanState, fit_commands, read_bounds, read_initial_writers
from replication.endpoint.relay_policy import RelayPolicy
from replication.protocol.commands import MAX_LINE_LENGTH
from replication.protocol.line_batch import LineBatch, WriterRun
from replication.protocol.redis_session import OutageNotice
from replication.publish.streamer import LINES_GROUP
from streams.conf import repl_setting
from streams.models import StreamPosition
from streams.registry import STREAMS
from streams.updates_since import get_all_writers_rows

logger = logging.getLogger(__name__)

#: Channel layer (in this process) through which the relay reaches its connections.
LOCAL_LAYER = "replication_local"
CONNECTIONS_GROUP = "replication.connections"

#: A connection's intake: ``deliver(seq, batch)``, batches numbered from 1.
Deliver = Callable[[int, LineBatch], Awaitable[None]]


def replicate_positions(sent: Mapping[tuple[str, str], int], writers: Mapping[str, tuple[str, ...] | None],
                        default_writer: str) -> dict[tuple[str, str], int]:
    """What a ``REPLICATE`` is answered with, per (stream, writer): every position sent, and
    for each stream nothing was sent on yet, each of its writers at the stream's start (1;
    typing, in memory, 0), so that a worker hears of every stream, as Synapse's
    ``send_positions_to_connection`` sends a POSITION for every stream it writes. Pure."""
    result = dict(sent)
    announced = {stream for stream, _ in sent}
    for name, spec in STREAMS.items():
        if name not in announced:
            for writer in writers.get(name) or (default_writer,):
                result[(name, writer)] = 1 if spec.db_backed else 0
    return result


class ReplicationRelay:
    """Per endpoint: last token sent per (stream, writer), and the relaying of line batches."""

    def __init__(self, *, using: str = "default", poll_interval: float | None = None,
                 grace: float | None = None, local_scan: bool = False,
                 local_positions: Callable[[], dict[tuple[str, str], int]] | None = None) -> None:
        """``local_positions``: where this process's own writers stand (wire tokens), beside
        the ``stream_positions`` table (``StreamRuntime.writer_positions``; None: the table
        alone)."""

        self.using = using
        self.local_positions = local_positions
        self._db_outage = OutageNotice("relay: the database")
        #: Embedded default (SQLite, no Redis): every fact is read from the database and sent
        #: as RDATA; line batches only wake the scan (local_scan.py).
        self.local_scan = local_scan
        self.scan_interval = repl_setting("LOCAL_SCAN_SECONDS")
        self._scan_wake = asyncio.Event()
        self.poll_interval = repl_setting("POSITION_POLL_SECONDS") if poll_interval is None else poll_interval
        self.policy = RelayPolicy(max(1.0, 2 * self.poll_interval) if grace is None else grace, local_scan)
        self._tasks: list[asyncio.Task[None]] = []
        self._connections: dict[str, Deliver] = {}
        self.seq = 0  # number of the last line batch sent to the connections
        self.cluster_layer = get_channel_layer()

    # -- start-up ---------------------------------------------------------------------------

    async def start(self) -> None:
        listening = asyncio.Event()
        if self.local_scan:

            self.scan = ScanState()
            await sync_to_async(self._load_scan_state, thread_sensitive=False)()
            self._tasks = [
                asyncio.create_task(self._listen_loop(listening), name="relay-listen"),
                asyncio.create_task(self._scan_loop(), name="relay-scan"),
            ]
        else:
            positions = await sync_to_async(self._load_positions, thread_sensitive=False)()
            self.policy.last_sent.update(positions)
            self._tasks = [
                asyncio.create_task(self._listen_loop(listening), name="relay-listen"),
                asyncio.create_task(self._poll_loop(), name="relay-poll"),
            ]
        await listening.wait()

    @property
    def last_sent(self) -> dict[tuple[str, str], int]:
        """Per (stream, writer), the last token sent on."""
        return self.policy.last_sent

    @property
    def relayed_messages(self) -> int:
        return self.policy.relayed_messages

    @property
    def repairs(self) -> int:
        return self.policy.repairs

    @property
    def resets(self) -> int:
        return self.policy.resets

    def _load_scan_state(self) -> None:
        bounds = read_bounds(self.using)
        self.scan.scanned.update(bounds)
        self.scan.last_sent.update(read_initial_writers(bounds, self.using))
        # One dict: what REPLICATE announces is what the scan has sent.
        self.policy.last_sent = self.scan.last_sent

    def _load_positions(self) -> dict[tuple[str, str], int]:
        """Where every writer stands now: the relay sends from here on (earlier facts are the
        catch-up's job)."""

        result = dict(self.local_positions()) if self.local_positions is not None else {}
        for row in StreamPosition.objects.using(self.using).all():
            spec = STREAMS.get(row.stream_name)
            if spec is None or not spec.db_backed:
                continue
            key = (row.stream_name, row.instance_name)
            result[key] = max(result.get(key, 0), spec.to_wire(row.stream_id))
        return result

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- input ------------------------------------------------------------------------------

    async def _listen_loop(self, listening: asyncio.Event) -> None:
        layer = self.cluster_layer
        # On Redis, our own subscription to the group's channel rather than the layer's
        # receive (layer_subscribe.py: redis-py's PubSub cost the endpoint as much as relaying).
        subscriber = GroupSubscriber.for_layer(layer, LINES_GROUP, on_message=self._on_lines_logged,
                                               on_subscribed=listening.set)
        if subscriber is not None:
            await subscriber.run()
            return
        channel = await layer.new_channel()
        await layer.group_add(LINES_GROUP, channel)
        listening.set()
        while True:
            await self._on_lines_logged(await layer.receive(channel))

    async def _on_lines_logged(self, message: dict[str, Any]) -> None:
        try:
            run = WriterRun.from_message(message)
        except Exception:
            logger.exception("relay: not a line batch: %r", {k: v for k, v in message.items() if k != "data"})
            return
        try:
            await self.on_run(run)
        except Exception:
            logger.exception("relay: could not relay %s/%s (%d, %d]", run.stream, run.writer, run.prev, run.new)

    async def on_run(self, run: WriterRun) -> None:
        decision = self.policy.on_run(run, time.monotonic())
        if decision.action == "scan":
            self._scan_wake.set()
        elif decision.batch is not None:
            await self._send(decision.batch)

    @staticmethod
    def _say(notice: tuple[int, str] | None) -> None:
        if notice is not None:
            logger.log(*notice)

    async def _poll_loop(self) -> None:
        def read() -> list[tuple[str, str, int]]:
            return list(StreamPosition.objects.using(self.using).values_list("stream_name", "instance_name", "stream_id"))

        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                rows = await sync_to_async(read, thread_sensitive=False)()
            except DatabaseError as e:  # an outage: said once when it starts, once when it ends
                self._say(self._db_outage.failed(time.monotonic(), one_line(e, limit=300),
                                                 was_up=self._db_outage.down_since is None))
                continue
            except Exception:
                logger.exception("relay: could not poll stream_positions")
                continue
            self._say(self._db_outage.up(time.monotonic()))
            batch = self.policy.on_positions(rows, time.monotonic())
            if batch is not None:
                await self._send(batch)

    async def _scan_loop(self) -> None:
        """Embedded default: read every local writer's new rows, send them as RDATA."""
        while True:
            try:
                await asyncio.wait_for(self._scan_wake.wait(), self.scan_interval)
            except asyncio.TimeoutError:
                pass
            self._scan_wake.clear()
            try:
                await self.scan_once()
            except DatabaseError as e:  # an outage: said once when it starts, once when it ends
                self._say(self._db_outage.failed(time.monotonic(), one_line(e, limit=300),
                                                 was_up=self._db_outage.down_since is None))
                continue
            except Exception:
                logger.exception("relay: could not read new rows from the database")
                continue
            self._say(self._db_outage.up(time.monotonic()))

    async def scan_once(self) -> None:
        bounds = await sync_to_async(read_bounds, thread_sensitive=False)(self.using)
        for stream, bound in sorted(bounds.items()):
            while (span := self.scan.next_range(stream, bound)) is not None:
                lo, hi = span
                rows = await sync_to_async(self._read_rows, thread_sensitive=False)(stream, lo, hi)
                # No await from here to the send: a REPLICATE answered meanwhile announces
                # either positions before these lines or positions covering them.
                cmds = self.scan.commands(STREAMS[stream], lo, hi, rows)
                if cmds:
                    self.policy.relayed_messages += 1
                    cmds, lines, cut = fit_commands(cmds, [c.to_line() for c in cmds])
                    if cut:
                        logger.error("relay: %s facts %s have a line over %d bytes: not sent as RDATA; "
                                     "a POSITION makes the workers fetch them by catch-up",
                                     stream, cut[:10], MAX_LINE_LENGTH)
                    await self._send(LineBatch.of_commands(cmds, lines))

    def _read_rows(self, stream: str, lo: int, hi: int) -> list[tuple[str, int, Any]]:
        return get_all_writers_rows(STREAMS[stream], lo, hi, using=self.using)

    # -- output -----------------------------------------------------------------------------

    def attach(self, channel_name: str, deliver: Deliver) -> None:
        """A connection of this endpoint wants every batch (``deliver(seq, batch)``)."""
        self._connections[channel_name] = deliver

    def detach(self, channel_name: str) -> None:
        self._connections.pop(channel_name, None)

    async def _send(self, batch: LineBatch) -> None:
        # Callers update ``last_sent`` with no await before this: a connection announcing
        # positions (on REPLICATE) either gets these lines or announces positions covering them.
        # Within the process, batches go straight to the connections (one call each): a
        # channel-layer hop per connection and batch cost ten times more (measured).
        self.seq += 1
        seq = self.seq
        for deliver in list(self._connections.values()):
            try:
                await deliver(seq, batch)
            except Exception:
                logger.exception("relay: delivering a batch to a connection failed")

    def positions(self) -> dict[tuple[str, str], int]:
        return dict(self.policy.last_sent)

    def settled_positions(self, min_idle: float = 2.0) -> dict[tuple[str, str], int]:
        """Positions of writers safe to announce on their behalf (RelayPolicy.settled_positions)."""
        return self.policy.settled_positions(time.monotonic(), min_idle)

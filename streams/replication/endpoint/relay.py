"""The endpoint side of the sending path: relays every writer's line batches to this
endpoint's connections, and repairs what it cannot relay. See docs/replication.md.

Writers publish their RDATA/POSITION lines on the cluster group ``replication.lines`` (see
:mod:`streams.replication.publish.streamer`); each message covers ``(prev, new]`` of one (stream,
writer). The relay keeps, per (stream, writer), the last token it sent on, and

* relays a message whose ``prev`` it has reached (lines at or below what a worker has are
  dropped by the worker);
* for a message after a gap (a lost message), sends ``POSITION s w new new`` instead: each
  worker sees it is behind and fetches the missing facts from the catch-up endpoint;
* polls ``stream_positions`` and, for a writer recorded ahead of what was sent for longer
  than the grace period (its message lost, or a writer with no shared channel layer, such as
  ``write_facts`` beside an embedded endpoint), sends the same kind of POSITION.

On the embedded default (SQLite, no Redis: ``local_scan=True``) it relays nothing of the
database streams and repairs nothing: it reads every local writer's committed rows from the
database and sends them as RDATA (:mod:`streams.replication.endpoint.local_scan`); line batches of
this process only wake that scan.

Lines reach the connections as one message per batch on this process's in-memory layer;
batches are numbered so a connection that misses one notices and reconnects.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Mapping

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import DatabaseError

from streams.registry import STREAMS
from streams.replication.endpoint.layer_subscribe import GroupSubscriber
from streams.replication.protocol.commands import MAX_LINE_LENGTH, PositionCommand
from streams.replication.protocol.line_batch import BatchPart, WriterRun, add_counts, counts_of
from streams.replication.protocol.redis_session import OutageNotice
from streams.replication.publish.streamer import LINES_GROUP
from streams.replication.worker.follower import RESETTABLE_STREAMS

logger = logging.getLogger(__name__)

#: Channel layer (in this process) through which the relay reaches its connections.
LOCAL_LAYER = "replication_local"
CONNECTIONS_GROUP = "replication.connections"


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


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
        from streams.conf import repl_setting

        self.using = using
        self.local_positions = local_positions
        self._db_outage = OutageNotice("relay: the database")
        #: Embedded default (SQLite, no Redis): every fact is read from the database and sent
        #: as RDATA; line batches only wake the scan (local_scan.py).
        self.local_scan = local_scan
        self.scan_interval = repl_setting("LOCAL_SCAN_SECONDS")
        self._scan_wake = asyncio.Event()
        self.poll_interval = repl_setting("POSITION_POLL_SECONDS") if poll_interval is None else poll_interval
        self.grace = max(1.0, 2 * self.poll_interval) if grace is None else grace
        self.last_sent: dict[tuple[str, str], int] = {}
        # When last_sent last changed per key, and when a poll last found the database agree.
        self._changed_at: dict[tuple[str, str], float] = {}
        self._agreed_at: dict[tuple[str, str], float] = {}
        self._behind_since: dict[tuple[str, str], tuple[int, float]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._connections: dict[str, Any] = {}
        self.seq = 0  # number of the last line batch sent to the connections group
        self.relayed_messages = 0
        self.repairs = 0
        self.resets = 0
        self.cluster_layer = get_channel_layer()

    # -- start-up ---------------------------------------------------------------------------

    async def start(self) -> None:
        listening = asyncio.Event()
        if self.local_scan:
            from streams.replication.endpoint.local_scan import ScanState

            self.scan = ScanState()
            await sync_to_async(self._load_scan_state, thread_sensitive=False)()
            self._tasks = [
                asyncio.create_task(self._listen_loop(listening), name="relay-listen"),
                asyncio.create_task(self._scan_loop(), name="relay-scan"),
            ]
        else:
            positions = await sync_to_async(self._load_positions, thread_sensitive=False)()
            self.last_sent.update(positions)
            self._tasks = [
                asyncio.create_task(self._listen_loop(listening), name="relay-listen"),
                asyncio.create_task(self._poll_loop(), name="relay-poll"),
            ]
        await listening.wait()

    def _load_scan_state(self) -> None:
        from streams.replication.endpoint.local_scan import read_bounds, read_initial_writers

        bounds = read_bounds(self.using)
        self.scan.scanned.update(bounds)
        self.scan.last_sent.update(read_initial_writers(bounds, self.using))
        # One dict: what REPLICATE announces is what the scan has sent.
        self.last_sent = self.scan.last_sent

    def _load_positions(self) -> dict[tuple[str, str], int]:
        """Where every writer stands now: the relay sends from here on (earlier facts are the
        catch-up's job)."""
        from streams.models import StreamPosition

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
            await self.on_lines(message)
        except Exception:
            logger.exception("relay: bad line batch %r", {k: v for k, v in message.items() if k != "data"})

    async def on_lines(self, message: dict[str, Any]) -> None:
        key = (message["stream"], message["writer"])
        if key[0] not in STREAMS:
            return
        if self.local_scan and STREAMS[key[0]].db_backed:
            # A write of this process: its rows are in the database now; go and read them
            # (with whatever other local processes wrote under the same writer name).
            # In-memory streams (typing) have no rows to read: relayed as usual.
            self._scan_wake.set()
            return
        prev, new = int(message["prev"]), int(message["new"])
        counts = message.get("counts") or counts_of(message["data"].decode().splitlines())
        last = self.last_sent.get(key)
        if last is not None and prev < last and key[0] in RESETTABLE_STREAMS:
            # An in-memory stream's writer restarted (its tokens start again from 0; a live
            # writer's next batch starts where its last ended): workers must start over too.
            # POSITION prev prev is below their token: they reset to it, then take the batch.
            self.last_sent[key] = new
            self._changed_at[key] = time.monotonic()
            self.resets += 1
            reset = PositionCommand(key[0], key[1], prev, prev)
            await self._send(reset.to_line().encode() + b"\n" + message["data"], add_counts(counts, {"POSITION": 1}),
                             (reset, self._run(message, counts)))
            return
        if last is None and key[0] in RESETTABLE_STREAMS:
            # The first batch this endpoint hears of an in-memory stream's writer (its run
            # started after the endpoint's, or its first change): announce where the batch
            # starts, then the batch. A bare POSITION at its end would make a worker that never
            # heard of the writer start there, skipping the batch's rows for good.
            self.last_sent[key] = new
            self._changed_at[key] = time.monotonic()
            start = PositionCommand(key[0], key[1], prev, prev)
            await self._send(start.to_line().encode() + b"\n" + message["data"], add_counts(counts, {"POSITION": 1}),
                             (start, self._run(message, counts)))
            return
        if last is not None and new <= last:
            return  # already covered
        self.last_sent[key] = new
        self._changed_at[key] = time.monotonic()
        self._behind_since.pop(key, None)
        if last is not None and prev <= last:
            self.relayed_messages += 1
            await self._send(message["data"], counts, (self._run(message, counts),))
        else:
            # We never saw (last, prev]: let every worker fetch what it is missing.
            self.repairs += 1
            await self._send_positions([(key, new)])

    @staticmethod
    def _say(notice: tuple[int, str] | None) -> None:
        if notice is not None:
            logger.log(*notice)

    async def _poll_loop(self) -> None:
        from streams.models import StreamPosition

        def read() -> list[tuple[str, str, int]]:
            return list(StreamPosition.objects.using(self.using).values_list("stream_name", "instance_name", "stream_id"))

        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                rows = await sync_to_async(read, thread_sensitive=False)()
            except DatabaseError as e:  # an outage: said once when it starts, once when it ends
                self._say(self._db_outage.failed(time.monotonic(), _one_line(e), was_up=self._db_outage.down_since is None))
                continue
            except Exception:
                logger.exception("relay: could not poll stream_positions")
                continue
            self._say(self._db_outage.up(time.monotonic()))
            now = time.monotonic()
            repairs = []
            for stream_name, instance_name, stream_id in rows:
                spec = STREAMS.get(stream_name)
                if spec is None or not spec.db_backed:
                    continue
                key, token = (stream_name, instance_name), spec.to_wire(stream_id)
                if token <= self.last_sent.get(key, 0):
                    self._behind_since.pop(key, None)
                    self._agreed_at[key] = now
                    continue
                seen = self._behind_since.setdefault(key, (token, now))
                if now - seen[1] >= self.grace:
                    repairs.append((key, token))
            if repairs:
                for key, token in repairs:
                    self.last_sent[key] = token
                    self._changed_at[key] = now
                    self._behind_since.pop(key, None)
                self.repairs += len(repairs)
                await self._send_positions(repairs)

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
                self._say(self._db_outage.failed(time.monotonic(), _one_line(e), was_up=self._db_outage.down_since is None))
                continue
            except Exception:
                logger.exception("relay: could not read new rows from the database")
                continue
            self._say(self._db_outage.up(time.monotonic()))

    async def scan_once(self) -> None:
        from streams.replication.endpoint.local_scan import fit_commands, read_bounds

        bounds = await sync_to_async(read_bounds, thread_sensitive=False)(self.using)
        for stream, bound in sorted(bounds.items()):
            while (span := self.scan.next_range(stream, bound)) is not None:
                lo, hi = span
                rows = await sync_to_async(self._read_rows, thread_sensitive=False)(stream, lo, hi)
                # No await from here to the send: a REPLICATE answered meanwhile announces
                # either positions before these lines or positions covering them.
                cmds = self.scan.commands(STREAMS[stream], lo, hi, rows)
                if cmds:
                    self.relayed_messages += 1
                    lines = [c.to_line() for c in cmds]
                    cmds, lines, cut = fit_commands(cmds, lines)
                    if cut:
                        logger.error("relay: %s facts %s have a line over %d bytes: not sent as RDATA; "
                                     "a POSITION makes the workers fetch them by catch-up",
                                     stream, cut[:10], MAX_LINE_LENGTH)
                    await self._send(("\n".join(lines) + "\n").encode(), counts_of(lines), tuple(cmds))

    def _read_rows(self, stream: str, lo: int, hi: int) -> list[tuple[str, int, Any]]:
        from streams.updates import get_all_writers_rows

        return get_all_writers_rows(STREAMS[stream], lo, hi, using=self.using)

    # -- output -----------------------------------------------------------------------------

    async def _send_positions(self, items: list[tuple[tuple[str, str], int]]) -> None:
        cmds = [PositionCommand(s, w, t, t) for (s, w), t in items]
        lines = [c.to_line() for c in cmds]
        await self._send(("\n".join(lines) + "\n").encode(), {"POSITION": len(lines)}, tuple(cmds))

    @staticmethod
    def _run(message: dict[str, Any], counts: Mapping[str, int]) -> WriterRun:
        return WriterRun(message["stream"], message["writer"], int(message["prev"]), int(message["new"]),
                         message["data"], counts)

    def attach(self, channel_name: str, deliver: Any) -> None:
        """A connection of this endpoint wants every batch (``deliver(message)``)."""
        self._connections[channel_name] = deliver

    def detach(self, channel_name: str) -> None:
        self._connections.pop(channel_name, None)

    async def _send(self, data: bytes, counts: Mapping[str, int], parts: tuple[BatchPart, ...]) -> None:
        """``parts``: what ``data`` is, as data (writer runs and commands, in order), for
        readers that need more than the bytes (the legacy rewrite)."""
        # Callers update ``last_sent`` with no await before this: a connection announcing
        # positions (on REPLICATE) either gets these lines or announces positions covering them.
        # Within the process, batches go straight to the connections (one call each): a
        # channel-layer hop per connection and batch cost ten times more (measured).
        self.seq += 1
        message = {"type": "replication.lines", "seq": self.seq, "data": data, "counts": counts, "parts": parts}
        for deliver in list(self._connections.values()):
            try:
                await deliver(message)
            except Exception:
                logger.exception("relay: delivering a batch to a connection failed")

    def positions(self) -> dict[tuple[str, str], int]:
        return dict(self.last_sent)

    def settled_positions(self, min_idle: float = 2.0) -> dict[tuple[str, str], int]:
        """Positions of writers that have been still for ``min_idle`` seconds, confirmed by
        the database since. Safe to announce on a writer's behalf (to Redis subscribers):
        a writer that is still publishing announces itself, and a position announced for it
        must never be below lines it already published."""
        now = time.monotonic()
        return {
            key: token for key, token in self.last_sent.items()
            if now - self._changed_at.get(key, 0.0) >= min_idle
            and self._agreed_at.get(key, -1.0) >= self._changed_at.get(key, 0.0)
        }

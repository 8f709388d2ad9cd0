"""The sending side of a writer process (Synapse's ``ReplicationStreamer``). See
docs/replication.md.

Every time this process's position on a stream advances, the streamer encodes the facts it
wrote in ``(prev, new]`` once, as a :class:`~replication.protocol.line_batch.WriterRun`
(``encode_run``: RDATA lines, ``batch`` tokens for multi-row facts, ``POSITION prev new`` when
the position moved past the last row or without rows), and publishes it as **one**
channel-layer message (``WriterRun.to_message``) on the cluster group ``replication.lines``.
Every endpoint relays those runs to its connections.

The rows come with the advance (``PositionAdvanced.facts``: what the writer just wrote, kept
in its :class:`~streams.notifier.WireJournal` until the advance), not from the database.
The batch is formatted (and serialized) on the writer's thread as the advance is announced;
writing it to Redis runs on an event loop of the streamer's own thread (or on a given loop,
for the in-memory layer of an endpoint process), so a writer's commit path never waits for
Redis.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer

from replication.protocol.commands import MAX_LINE_LENGTH, PositionCommand
from replication.protocol.line_batch import WriterRun, encode_run
from replication.publish.layer_publish import GroupPublisher
from replication.publish.redis_bridge import SynapseRedisBridge
from streams.notifier import PositionAdvanced, PositionNotifier
from streams.registry import get_stream

logger = logging.getLogger(__name__)

#: Cluster-wide group of line batches from every writer.
LINES_GROUP = "replication.lines"
#: On close, wait at most this long for the Redis bridge to announce lines it had to drop
#: (Redis was away): the bridge reconnects with up to 5 s of back-off.
SETTLE_TIMEOUT = 10.0


@dataclass
class _Batch:
    """One writer's run for ``(prev, new]`` of one stream, ready to publish."""

    run: WriterRun
    layer_data: bytes | None = None  #: the run's channel-layer message, serialized for the GroupPublisher
    packed: bytes | None = None  #: PUBLISH commands of the run's lines for the Synapse channel


def _coalesce(batches: list[_Batch]) -> list[_Batch]:
    """Consecutive batches of one (stream, writer) as one (the loop fell behind): fewer
    messages, same lines, same order."""
    out: list[_Batch] = []
    for batch in batches:
        last = out[-1] if out else None
        run = batch.run
        if last is None or (last.run.stream, last.run.writer) != (run.stream, run.writer):
            out.append(batch)
            continue
        packed = last.packed + batch.packed if last.packed is not None and batch.packed is not None else None
        out[-1] = _Batch(last.run + run, None, packed)
    return out


class ReplicationStreamer:
    def __init__(self, notifier: PositionNotifier, *, loop: asyncio.AbstractEventLoop | None = None,
                 layer: Any = None, redis_url: str | None = None, server_name: str | None = None) -> None:
        self.layer = layer
        self._redis = (redis_url, server_name) if redis_url else None
        self.bridge = None
        #: per (stream, writer): the wire token our published lines reach
        self.published_upto: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._queue: list[_Batch] = []
        self._busy = False
        self.published_messages = 0
        self.published_lines = 0
        #: batches in which fit_lines kept a line over the limit back
        self.oversized_lines = 0
        self._own_loop = loop is None
        if loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._run_thread, name="replication-streamer", daemon=True).start()
        else:
            self._loop = loop
        self._wake = asyncio.Event()
        self._group_publisher: GroupPublisher | None = None
        self._task = asyncio.run_coroutine_threadsafe(self._publish_loop(), self._loop)
        self._unsubscribe = notifier.subscribe(self._on_advance)

    def _run_thread(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _on_advance(self, advance: PositionAdvanced) -> None:
        # On the writer's thread, under its generator's notify lock (so in order): the batch
        # is formatted and serialized here, and the event loop's thread only writes it out.
        # That thread shares the GIL with the writer, and whatever it runs while the writer's
        # database answer arrives delays the writer: formatting here costs the writer less
        # than being interrupted by it (docs/benchmarks.md, bench_cluster).
        batch = self._prepare(advance)
        with self._lock:
            self._queue.append(batch)
        self._loop.call_soon_threadsafe(self._wake.set)

    async def _publish_loop(self) -> None:
        layer = self.layer or get_channel_layer()
        # channels-redis's group_send without redis-py's client per message (layer_publish.py)
        self._group_publisher = GroupPublisher.for_layer(layer, LINES_GROUP)
        if self._redis is not None:

            url, server_name = self._redis
            self.bridge = SynapseRedisBridge(url, server_name, announce=self._announce)
            self.bridge.start()
        while True:
            await self._wake.wait()
            self._wake.clear()
            with self._lock:
                queued, self._queue = self._queue, []
                self._busy = bool(queued)
            try:
                publisher, bridge = self._group_publisher, self.bridge
                # One write per batch when both go to one Redis: the channel-layer message in
                # the bridge's PUBLISH write, one wait for the replies (docs/benchmarks.md).
                together = (publisher is not None and bridge is not None and publisher.url == bridge.url)
                for batch in _coalesce(queued):
                    run = batch.run
                    if together:
                        assert publisher is not None and bridge is not None
                        data = batch.layer_data if batch.layer_data is not None else publisher.serialize(run.to_message())
                        # published_upto first: a REPLICATE answered while this write waits
                        # for its replies is published after it (the bridge's lock)
                        self.published_upto[(run.stream, run.writer)] = run.new
                        if await bridge.publish_run(run, batch.packed, also=publisher.pack(data), also_count=1):
                            self.published_messages += 1
                            self.published_lines += run.count
                        else:  # not subscribed to the Synapse channel, or Redis failed: on its own
                            await self._publish(layer, run, data)
                        continue
                    await self._publish(layer, run, batch.layer_data)
                    self.published_upto[(run.stream, run.writer)] = run.new
                    if bridge is not None:
                        await bridge.publish_run(run, batch.packed)
            except Exception:
                logger.exception("replication streamer failed; endpoints will fall back to positions")
            finally:
                self._busy = False

    def _prepare(self, advance: PositionAdvanced) -> _Batch:
        """The run of one advance of this writer, ready to publish: encoded once, with its
        channel-layer message serialized (when it goes out through a GroupPublisher) and the
        Synapse channel's PUBLISH commands (when the Redis bridge is up)."""
        stream_name, writer = advance.stream_name, advance.instance_name
        signs = get_stream(stream_name).direction
        prev, new = signs.to_wire(advance.prev_token), signs.to_wire(advance.new_token)
        run, lines, oversized = encode_run(stream_name, writer, prev, new, signs.pairs_to_wire(advance.facts))
        if oversized is not None:
            self.oversized_lines += 1
            logger.error("replication streamer: RDATA %s %s %d is %d bytes, over the %d a line may carry: "
                         "not sent; POSITION %s %s %d %d makes the workers fetch it by catch-up",
                         stream_name, writer, oversized.token, oversized.length, MAX_LINE_LENGTH,
                         stream_name, writer, oversized.token, new)
        publisher, bridge = self._group_publisher, self.bridge
        return _Batch(run, publisher.serialize(run.to_message()) if publisher is not None else None,
                      bridge.pack_lines(lines) if bridge is not None else None)

    async def _publish(self, layer: Any, run: WriterRun, data: bytes | None = None) -> None:
        for attempt in range(5):
            try:
                if self._group_publisher is not None:
                    await self._group_publisher.send(run.to_message(), data)
                else:
                    await layer.group_send(LINES_GROUP, run.to_message())
                self.published_messages += 1
                self.published_lines += run.count
                return
            except Exception:
                # Endpoints also read stream_positions: a lost message delays, never loses.
                logger.warning("could not publish %s lines (attempt %d)", run.stream, attempt + 1,
                               exc_info=True)
                await asyncio.sleep(0.2 * (attempt + 1))

    def _announce(self) -> list[PositionCommand]:
        """Answer to REPLICATE: where this writer's published lines reach, per stream."""
        return [PositionCommand(stream, writer, token, token)
                for (stream, writer), token in sorted(self.published_upto.items())]

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything recorded so far has been published (for clean exits)."""
        done = threading.Event()

        async def probe() -> None:
            while self._queue or self._wake.is_set() or self._busy:
                await asyncio.sleep(0.005)
            done.set()

        asyncio.run_coroutine_threadsafe(probe(), self._loop)
        done.wait(timeout)

    def close(self) -> None:
        """Publish what is pending, then stop (the bridge, and the thread if it is ours)."""
        self._unsubscribe()
        self.flush()

        async def shutdown() -> None:
            if self.bridge is not None:
                await self.bridge.settle(SETTLE_TIMEOUT)
            self._task.cancel()
            if self.bridge is not None:
                await self.bridge.stop()
            if self._group_publisher is not None:
                await self._group_publisher.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=SETTLE_TIMEOUT + 5)
        except Exception:
            logger.warning("replication streamer did not stop cleanly", exc_info=True)
        if self._own_loop:
            self._loop.call_soon_threadsafe(self._loop.stop)

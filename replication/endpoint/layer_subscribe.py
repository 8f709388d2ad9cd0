"""An endpoint's side of ``replication.lines``: the channel layer's group messages, received
over a subscription of our own. See docs/replication.md.

Every writer publishes one channel-layer message per batch of lines on the group
``replication.lines``; the relay of every endpoint takes them all. Through channels-redis
each goes through redis-py's asyncio ``PubSub`` (its reply parser, a ``get_message`` task
woken every 100 ms, a queue per channel): in a profile of the endpoint under
``bench_cluster``, as much of its busy time as relaying the batches and sending them to the
workers together. :class:`GroupSubscriber` subscribes to the very same
Redis channel (the layer's group channel, on its shard) with
:class:`~replication.protocol.redis_session.RedisSubscription` (the core the bridge
and the Redis worker share) and hands each message, deserialized by the layer's own
serializer, to its callback: the mirror of :class:`~replication.publish.layer_publish.GroupPublisher`.

Only for a layer that GroupPublisher also takes (channels-redis's pub/sub layer on a plain
URL); anything else keeps ``group_add`` and ``receive``. Messages published while the
subscription is away are lost, as they are through channels-redis: the relay repairs gaps
(a batch that does not start where the last ended, ``stream_positions`` ahead).
"""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from replication.protocol.redis_session import RedisSubscription
from replication.protocol.resp import LARGE_READ_SIZE, message_head, parse_messages, pending_message
from replication.publish.layer_publish import plain_group_channel

logger = logging.getLogger(__name__)


class GroupSubscriber:
    """Receives every message of one group of a channels-redis pub/sub layer."""

    def __init__(self, layer: Any, channel: bytes, url: str, *,
                 on_message: Callable[[dict[str, Any]], Awaitable[None]],
                 on_subscribed: Callable[[], None] = lambda: None) -> None:
        self._layer = layer
        self._on_message = on_message
        self._on_subscribed_hook = on_subscribed
        self._head = message_head(channel)
        self._buf = b""  # the start of a reply not complete yet (when not gathering)
        # Gathering one message of known size: its pieces so far, how many bytes they hold,
        # how many the message has, and where its payload lies in the first piece.
        self._parts: list[bytes | memoryview] = []
        self._have = self._need = self._start = self._size = 0
        self.received = 0
        self.subscription = RedisSubscription(
            url, [channel], on_subscribed=self._on_subscribed, on_chunk=self._on_chunk,
            on_lost=self._on_lost, name=f"Redis subscription to {channel.decode(errors='replace')}",
            read_size=LARGE_READ_SIZE)

    @classmethod
    def for_layer(cls, layer: Any, group: str, *, on_message: Callable[[dict[str, Any]], Awaitable[None]],
                  on_subscribed: Callable[[], None] = lambda: None) -> "GroupSubscriber | None":
        """A subscriber to ``group`` of ``layer``, or None if the layer's ``receive`` must be used."""
        found = plain_group_channel(layer, group)
        if found is None:
            return None
        channel, url = found
        return cls(layer, channel, url, on_message=on_message, on_subscribed=on_subscribed)

    async def run(self) -> None:
        """Subscribe and hand over messages until cancelled (or :meth:`stop`); resubscribes
        after every loss."""
        await self.subscription.run()

    def stop(self) -> None:
        self.subscription.stop()

    async def _on_subscribed(self) -> None:
        self._reset()
        self._on_subscribed_hook()

    def _on_lost(self, reason: str | None) -> None:
        self._reset()

    def _reset(self) -> None:
        self._buf = b""
        self._parts = []

    async def _on_chunk(self, chunk: bytes) -> None:
        # A batch is hundreds of KiB and arrives in several reads. Once a message's head is
        # in, its size is known: the reads are only gathered until it is complete, and its
        # payload is copied out of them once (re-parsing the growing buffer on each read
        # copied it three to six times).
        pos = 0
        if self._parts:
            self._parts.append(chunk)
            self._have += len(chunk)
            if self._have < self._need:
                return
            parts, self._parts = self._parts, []
            pos = len(chunk) - (self._have - self._need)  # where the message ends in ``chunk``
            cut = pos - 2  # where its payload ends
            if cut >= 0:
                payload = b"".join([memoryview(parts[0])[self._start:], *parts[1:-1], memoryview(chunk)[:cut]])
            else:  # the CRLF after the payload was split between reads
                payload = b"".join(parts)[self._start:self._start + self._size]
            await self._deliver(payload)
            buf = chunk
        else:
            buf = self._buf + chunk if self._buf else chunk
        replies, end = parse_messages(buf, pos, self._head)
        rest = memoryview(buf)[end:]
        found = pending_message(rest) if rest else None
        if found is not None:
            self._parts = [rest]
            self._have = len(rest)
            self._start, self._size = found
            self._need = self._start + self._size + 2
            self._buf = b""
        else:
            self._buf = bytes(rest)
        for reply in replies:
            if type(reply) is bytes:
                await self._deliver(reply)
            # else a PONG

    async def _deliver(self, payload: bytes) -> None:
        try:
            message = self._layer.deserialize(payload)
        except Exception:
            logger.exception("undecodable message on the channel layer's group channel (%d bytes)", len(payload))
            return
        self.received += 1
        await self._on_message(message)

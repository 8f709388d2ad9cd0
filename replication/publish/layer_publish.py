"""``group_send`` of channels-redis's pub/sub layer, over a RESP connection of our own.

A writer's streamer publishes one channel-layer message per batch of lines. Through
channels-redis that goes through redis-py's asyncio client (connection pool, lock, command
packing, its pure-Python reply parser): a third of the streamer's time per fact, for one
``PUBLISH``. :class:`GroupPublisher` sends the very same bytes (the layer's own serializer,
its group channel name, its shard) with :class:`~.resp.RespConnection`. The endpoints still
receive them through channels-redis, as any ``group_send``.

Only for a layer whose shard is a plain URL (``{"address": url}``, optionally
``"protocol"``); anything else (sentinels, extra connection options, another backend) keeps
``group_send``.
"""
from __future__ import annotations

from typing import Any

from replication.protocol.resp import RespConnection, pack_publish

REPLY_TIMEOUT = 10.0
_PLAIN_HOST_KEYS = {"address", "protocol"}


def plain_group_channel(layer: Any, group: str) -> tuple[bytes, str] | None:
    """The Redis channel that carries ``group`` of ``layer`` and the URL of its Redis, if
    ``layer`` is channels-redis's pub/sub layer on a plain URL; else None (use the layer).

    Call on the event loop that will use them (the layer keeps its state per loop)."""
    try:
        from channels_redis.pubsub import RedisPubSubChannelLayer
    except ImportError:  # pragma: no cover - channels-redis is a dependency
        return None
    if not isinstance(layer, RedisPubSubChannelLayer):
        return None
    loop_layer = layer._get_layer()
    channel = loop_layer._get_group_channel_name(group)
    host = loop_layer._get_shard(channel).host
    if not (isinstance(host, dict) and set(host) <= _PLAIN_HOST_KEYS and isinstance(host.get("address"), str)
            and host.get("protocol", 2) == 2):
        return None
    return channel.encode(), host["address"]


class GroupPublisher:
    """Publishes messages to one group of a channels-redis pub/sub layer."""

    def __init__(self, layer: Any, channel: bytes, url: str) -> None:
        self._layer = layer
        self.channel = channel
        self.url = url
        self._conn: RespConnection | None = None

    @classmethod
    def for_layer(cls, layer: Any, group: str) -> "GroupPublisher | None":
        """A publisher for ``group`` of ``layer``, or None if ``layer.group_send`` must be used.

        Call on the event loop that will publish (the layer keeps its state per loop)."""
        found = plain_group_channel(layer, group)
        return None if found is None else cls(layer, *found)

    def serialize(self, message: dict[str, Any]) -> bytes:
        """The bytes :meth:`send` publishes for ``message`` (thread-safe: a writer's thread
        may prepare them)."""
        return self._layer.serialize(message)

    def pack(self, data: bytes) -> bytes:
        """The PUBLISH command of a message serialized by :meth:`serialize`, for a write of
        someone else's on the same Redis (the streamer's bridge: one write per batch)."""
        return pack_publish([(self.channel, data)])

    async def send(self, message: dict[str, Any], data: bytes | None = None) -> None:
        """``group_send(group, message)``: one PUBLISH, its reply awaited. ``data``: the
        message already serialized. Raises on failure (the connection is dropped and opened
        again on the next send)."""
        if data is None:
            data = self._layer.serialize(message)
        try:
            if self._conn is None:
                self._conn = await RespConnection.open(self.url, REPLY_TIMEOUT)
            await self._conn.publish([(self.channel, data)], timeout=REPLY_TIMEOUT)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

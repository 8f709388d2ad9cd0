"""GroupPublisher: channels-redis's group_send over our own RESP connection (real Redis)."""
from __future__ import annotations

import asyncio

from channels.layers import InMemoryChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer

from replication.publish.layer_publish import GroupPublisher


async def member_of(redis_url: str, group: str) -> tuple[RedisPubSubChannelLayer, str]:
    """A channels-redis layer, as in an endpoint, with a channel in ``group``."""
    layer = RedisPubSubChannelLayer(hosts=[{"address": redis_url, "protocol": 2}])
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return layer, channel


def test_a_group_member_receives_what_group_send_would_deliver(redis_server):
    """The member is a channels-redis layer as in an endpoint; the bytes are the layer's own."""
    async def scenario():
        layer, channel = await member_of(redis_server.url, "replication.lines")
        try:
            publisher = GroupPublisher.for_layer(layer, "replication.lines")
            assert publisher is not None
            assert publisher.channel == b"asgi__group__replication.lines"
            messages = [{"type": "replication.lines", "stream": "receipts", "writer": "w1", "prev": i, "new": i + 1,
                         "data": b"RDATA receipts w1 %d [\"x\"]\n" % (i + 1), "count": 1} for i in range(3)]
            for message in messages:
                await publisher.send(message)
            got = [await asyncio.wait_for(layer.receive(channel), 5) for _ in messages]
            assert got == messages
            # the same as the layer's own group_send, which is still what others may use
            await layer.group_send("replication.lines", messages[0])
            assert await asyncio.wait_for(layer.receive(channel), 5) == messages[0]
            await publisher.close()
        finally:
            await layer.flush()

    asyncio.run(scenario())


def test_reconnects_after_redis_closed_the_connection(private_redis):
    """Its own Redis: it kills the publishing client it finds."""
    import redis

    redis_server = private_redis

    async def scenario():
        layer, channel = await member_of(redis_server.url, "g")
        try:
            publisher = GroupPublisher.for_layer(layer, "g")
            await publisher.send({"type": "t", "n": 1})
            client = redis.Redis.from_url(redis_server.url)
            # kill only the publisher's connection (our RESP connection is the one that never subscribed)
            killed = [client.client_kill_filter(_id=info["id"]) for info in client.client_list()
                      if info.get("cmd") == "publish"]
            client.close()
            assert killed == [1]
            for _attempt in range(3):  # the first send after the kill may fail; the next reconnects
                try:
                    await publisher.send({"type": "t", "n": 2})
                    break
                except Exception:
                    continue
            received = [await asyncio.wait_for(layer.receive(channel), 5) for _ in range(2)]
            assert [m["n"] for m in received] == [1, 2]
            await publisher.close()
        finally:
            await layer.flush()

    asyncio.run(scenario())


def test_other_layers_keep_group_send():
    async def scenario():
        assert GroupPublisher.for_layer(InMemoryChannelLayer(), "g") is None
        # connection options beyond a plain URL: channels-redis knows what to do with them, we don't
        layer = RedisPubSubChannelLayer(hosts=[{"address": "redis://127.0.0.1:1", "retry_on_timeout": True}])
        assert GroupPublisher.for_layer(layer, "g") is None
        layer = RedisPubSubChannelLayer(hosts=[{"address": "redis://127.0.0.1:1", "protocol": 3}])
        assert GroupPublisher.for_layer(layer, "g") is None

    asyncio.run(scenario())

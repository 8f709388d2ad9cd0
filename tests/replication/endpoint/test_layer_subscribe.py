"""GroupSubscriber: a channel-layer group's messages over our own subscription (real Redis)."""
from __future__ import annotations

import asyncio

from channels.layers import InMemoryChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer

from replication.endpoint.layer_subscribe import GroupSubscriber
from replication.publish.layer_publish import GroupPublisher


async def _cancel(task: asyncio.Task, timeout: float = 10.0) -> None:
    """Cancel the subscriber's task and wait for it; if it does not end, fail with every
    task's stack (a subscription that outlives its cancel would otherwise hang the test)."""
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=timeout)
    if not done:
        stacks = []
        for t in asyncio.all_tasks():
            stacks.append(f"{t!r}\n" + "".join(f"  {f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}\n"
                                                  for f in t.get_stack()))
        raise AssertionError("the subscriber's task did not end on cancel:\n" + "\n".join(stacks))


def _message(i: int) -> dict:
    return {"type": "replication.lines", "stream": "receipts", "writer": "w1", "prev": i, "new": i + 1,
            "data": b"RDATA receipts w1 %d [\"x\"]\n" % (i + 1), "count": 1, "counts": {"RDATA": 1}}


def test_receives_what_group_send_and_the_group_publisher_send_in_order(redis_server):
    async def scenario():
        layer = RedisPubSubChannelLayer(hosts=[{"address": redis_server.url, "protocol": 2}])
        got: list[dict] = []
        subscribed = asyncio.Event()

        async def on_message(message: dict) -> None:
            got.append(message)

        subscriber = GroupSubscriber.for_layer(layer, "replication.lines", on_message=on_message,
                                               on_subscribed=subscribed.set)
        assert subscriber is not None
        task = asyncio.create_task(subscriber.run())
        try:
            await asyncio.wait_for(subscribed.wait(), 5)
            publisher = GroupPublisher.for_layer(layer, "replication.lines")
            sent = [_message(i) for i in range(200)]
            for message in sent[:100]:
                await publisher.send(message)
            await layer.group_send("replication.lines", sent[100])  # the layer's own bytes too
            for message in sent[101:]:
                await publisher.send(message)
            await publisher.send({"type": "other.group.member"})  # same channel, any message
            for _ in range(100):
                if len(got) == 201:
                    break
                await asyncio.sleep(0.02)
            assert got[:200] == sent and got[200] == {"type": "other.group.member"}
            assert subscriber.received == 201
            await publisher.close()
        finally:
            await _cancel(task)
            await layer.flush()

    asyncio.run(scenario())


def test_resubscribes_after_redis_dropped_it(private_redis):
    """A lost subscription is a new one (messages meanwhile are lost: the relay repairs).
    Its own Redis: it kills the subscribed client it finds."""
    import redis

    redis_server = private_redis

    async def scenario():
        layer = RedisPubSubChannelLayer(hosts=[{"address": redis_server.url, "protocol": 2}])
        got: list[int] = []
        subscriptions = []

        async def on_message(message: dict) -> None:
            got.append(message["n"])

        subscriber = GroupSubscriber.for_layer(layer, "g", on_message=on_message,
                                               on_subscribed=lambda: subscriptions.append(1))
        task = asyncio.create_task(subscriber.run())
        publisher = GroupPublisher.for_layer(layer, "g")
        try:
            for _ in range(100):
                if subscriptions:
                    break
                await asyncio.sleep(0.02)
            await publisher.send({"type": "t", "n": 1})
            client = redis.Redis.from_url(redis_server.url)
            killed = [client.client_kill_filter(_id=info["id"]) for info in client.client_list()
                      if info.get("cmd") in ("subscribe", "ping")]
            client.close()
            assert killed == [1]
            for _ in range(300):
                if len(subscriptions) == 2:
                    break
                await asyncio.sleep(0.02)
            assert len(subscriptions) == 2
            await publisher.send({"type": "t", "n": 2})
            for _ in range(100):
                if got == [1, 2]:
                    break
                await asyncio.sleep(0.02)
            assert got == [1, 2]
        finally:
            await publisher.close()
            await _cancel(task)
            await layer.flush()

    asyncio.run(scenario())


def test_other_layers_keep_receive():
    async def on_message(message: dict) -> None:
        pass

    async def scenario():
        assert GroupSubscriber.for_layer(InMemoryChannelLayer(), "g", on_message=on_message) is None
        layer = RedisPubSubChannelLayer(hosts=[{"address": "redis://127.0.0.1:1", "retry_on_timeout": True}])
        assert GroupSubscriber.for_layer(layer, "g", on_message=on_message) is None

    asyncio.run(scenario())


def _resp_message(channel: bytes, payload: bytes) -> bytes:
    return b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(channel), channel, len(payload), payload)


def test_messages_split_anywhere_between_reads_come_out_whole_and_in_order():
    """A batch of hundreds of KiB arrives in many reads, cut anywhere (inside the head, the
    payload, the CRLF after it) and sharing reads with the next messages and PONGs: each is
    gathered once its size is known and handed over whole, in order."""
    layer = RedisPubSubChannelLayer(hosts=["redis://127.0.0.1:1"])
    channel = b"asgi__group__replication.lines"
    big = b"RDATA receipts w1 %d [\"" + b"x" * 340 + b"\"]\n"
    sent = [_message(0), {**_message(1), "data": big * 1000}, _message(2), {**_message(3), "data": big * 1500},
            _message(4)]
    stream = b"".join(_resp_message(channel, layer.serialize(m)) for m in sent[:3])
    stream += b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"  # a PONG between messages
    stream += b"".join(_resp_message(channel, layer.serialize(m)) for m in sent[3:])
    # where the second message's payload ends: cuts just before, inside and after its CRLF
    second_end = sum(len(_resp_message(channel, layer.serialize(m))) for m in sent[:2])
    cut_sets = [[second_end - 3], [second_end - 2], [second_end - 1], [second_end], [20], [60],
                [second_end - 1, second_end + 5]]

    async def scenario(cuts: list[int]) -> tuple[list[dict], int]:
        got: list[dict] = []

        async def on_message(message: dict) -> None:
            got.append(message)

        subscriber = GroupSubscriber(layer, channel, "redis://127.0.0.1:1", on_message=on_message)
        start = 0
        for cut in [*cuts, len(stream)]:
            await subscriber._on_chunk(stream[start:cut])
            start = cut
        return got, subscriber.received

    for size in (4099, 65536, 262144, 1 << 22):
        got, received = asyncio.run(scenario(list(range(size, len(stream), size))))
        assert got == sent and received == len(sent), size
    for cuts in cut_sets:
        got, received = asyncio.run(scenario(cuts))
        assert got == sent and received == len(sent), cuts

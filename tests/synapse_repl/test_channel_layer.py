"""With REDIS_URL set, the channel layer is channels-redis pub/sub on a real Redis."""
import asyncio

from channels_redis.pubsub import RedisPubSubChannelLayer


def test_group_send_reaches_members_through_redis(redis_server):
    async def scenario():
        sender = RedisPubSubChannelLayer(hosts=[redis_server.url])
        receiver = RedisPubSubChannelLayer(hosts=[redis_server.url])  # as another process would
        try:
            channel = await receiver.new_channel()
            await receiver.group_add("positions", channel)
            await asyncio.sleep(0.2)  # let the SUBSCRIBE land
            await sender.group_send("positions", {"type": "position.advanced", "stream": "events", "token": 42})
            return await asyncio.wait_for(receiver.receive(channel), timeout=5)
        finally:
            await sender.flush()
            await receiver.flush()

    assert asyncio.run(scenario()) == {"type": "position.advanced", "stream": "events", "token": 42}

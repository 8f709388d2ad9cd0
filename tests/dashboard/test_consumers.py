"""The live WebSocket (``/ws/live/``) through the real ASGI application (session auth, origin
check) with Channels' communicators, against the throwaway PostgreSQL."""
from __future__ import annotations

import asyncio
import random
import re
from datetime import datetime, timezone

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from dashboard.feed import LOCAL_LAYER, stop_live_feed
from dashboard.models import EndpointStatus
from streams.conf import stream_writers
from streams.models import Receipt
from streams.runtime import StreamRuntime
from synapse_repl.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

#: Upper bound for a message that should come (never reached when things work).
WAIT = 20


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def communicator(cookie: bytes | None = None, origin: bytes = b"http://localhost") -> WebsocketCommunicator:
    # A browser sends the page's Host; the origin must match it (scheme, host and port).
    headers = [(b"origin", origin), (b"host", b"localhost")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, "/ws/live/", headers=headers)


@pytest.fixture
def staff_cookie():
    user = get_user_model().objects.create_user("operator", password="x" * 12, is_staff=True)
    return session_cookie(user)


@pytest.fixture(autouse=True)
def quiet_layers():
    """Each test's feed and channels are gone afterwards (the layers outlive event loops)."""
    yield

    async def flush():
        await stop_live_feed()
        await get_channel_layer().flush()
        await get_channel_layer(LOCAL_LAYER).flush()

    async_to_sync(flush)()


def run(scenario):
    async def wrapped():
        try:
            return await scenario()
        finally:
            await stop_live_feed()
    return async_to_sync(wrapped)()


async def next_of_type(comm: WebsocketCommunicator, kind: str, predicate=lambda m: True) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        message = await comm.receive_json_from(timeout=max(0.1, deadline - loop.time()))
        if message["type"] == kind and predicate(message):
            return message


def stream(message: dict, name: str) -> dict:
    return next(s for s in message["streams"] if s["name"] == name)


def test_anonymous_is_closed_before_anything_is_sent():
    async def scenario():
        comm = communicator()
        assert (await comm.connect())[0]
        assert await comm.receive_output(timeout=WAIT) == {"type": "websocket.close", "code": 4403}
        assert await comm.receive_nothing()

    run(scenario)


def test_non_staff_user_is_closed_before_anything_is_sent():
    user = get_user_model().objects.create_user("someone", password="x" * 12)
    cookie = session_cookie(user)

    async def scenario():
        comm = communicator(cookie)
        assert (await comm.connect())[0]
        assert await comm.receive_output(timeout=WAIT) == {"type": "websocket.close", "code": 4403}
        assert await comm.receive_nothing()

    run(scenario)


def test_foreign_origin_is_refused(staff_cookie):
    async def scenario():
        comm = communicator(staff_cookie, origin=b"http://evil.example")
        connected, _ = await comm.connect()
        assert not connected
        # the same host on another port, or over the other scheme, is another origin
        for origin in (b"http://localhost:8001", b"https://localhost"):
            comm = communicator(staff_cookie, origin=origin)
            connected, _ = await comm.connect()
            assert not connected, origin

    run(scenario)


def test_staff_gets_a_snapshot_then_updates_pushed_by_replication_group_messages(staff_cookie, settings):
    # The feed's own refresh is far away: an update within the test can only come from the
    # line batch the writer publishes on replication.lines.
    settings.DASHBOARD = {**settings.DASHBOARD, "FEED_REFRESH_SECONDS": 3600.0}
    rt = StreamRuntime(instance_name="master", writers=stream_writers(""))

    async def scenario():
        rt.stream_replication(loop=asyncio.get_running_loop(), layer=get_channel_layer())
        writer = await sync_to_async(rt.writer)("receipts")
        comm = communicator(staff_cookie)
        connected, _ = await comm.connect()
        assert connected
        snapshot = await next_of_type(comm, "snapshot")
        assert stream(snapshot, "receipts")["positions"] == {}
        assert snapshot["history"] == [] and snapshot["jobs"] == []  # no job has run

        ids = await sync_to_async(writer.append)(
            [[(Receipt, Receipt.synthetic(random.Random(1), n))] for n in range(3)])
        update = await next_of_type(comm, "update", lambda m: stream(m, "receipts")["positions"])
        receipts = stream(update, "receipts")
        assert receipts["positions"] == {"master": ids[-1]}
        assert receipts["linear"] == ids[-1]
        assert receipts["ahead"] == {"master": 0}
        await comm.disconnect()

    async def scenario_then_close():
        try:
            await scenario()
        finally:
            # The streamer publishes from this loop: close it while the loop still runs.
            await sync_to_async(rt.close, thread_sensitive=False)()

    run(scenario_then_close)


def test_pending_ids_age_into_stuck(staff_cookie, settings):
    settings.DASHBOARD = {**settings.DASHBOARD, "FEED_REFRESH_SECONDS": 0.2}
    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "STUCK_AFTER_SECONDS": 0.5}
    rt = StreamRuntime(instance_name="master", writers=stream_writers(""))
    gen = rt.generator("receipts")
    held = gen.get_next()
    pending_id = held.__enter__()
    try:
        async def scenario():
            comm = communicator(staff_cookie)
            assert (await comm.connect())[0]
            update = await next_of_type(comm, "update", lambda m: stream(m, "receipts")["stuck"])
            [pending] = stream(update, "receipts")["pending"]
            assert pending["stream_ids"] == [pending_id] and pending["stuck"] and pending["writer"] == "master"
            await comm.disconnect()

        run(scenario)
    finally:
        held.__exit__(None, None, None)
        rt.close()


def test_facts_per_second_are_sampled_for_the_chart(staff_cookie, settings):
    settings.DASHBOARD = {**settings.DASHBOARD, "FEED_REFRESH_SECONDS": 0.3}
    rt = StreamRuntime(instance_name="master", writers=stream_writers(""))

    async def scenario():
        writer = await sync_to_async(rt.writer)("receipts")
        comm = communicator(staff_cookie)
        assert (await comm.connect())[0]
        await next_of_type(comm, "update", lambda m: "sample" in m)  # a baseline exists
        await sync_to_async(writer.append)(
            [[(Receipt, Receipt.synthetic(random.Random(2), n))] for n in range(40)])
        update = await next_of_type(comm, "update", lambda m: m.get("sample", {}).get("rates", {}).get("receipts"))
        assert update["sample"]["rates"]["receipts"] > 0
        assert update["sample"]["rates"]["events"] == 0
        # A page opened now gets the history the chart draws.
        late = communicator(staff_cookie)
        assert (await late.connect())[0]
        snapshot = await next_of_type(late, "snapshot")
        assert any(p["rates"]["receipts"] > 0 for p in snapshot["history"])
        await comm.disconnect()
        await late.disconnect()

    try:
        run(scenario)
    finally:
        rt.close()


def test_endpoint_connections_reach_the_page(staff_cookie, settings):
    settings.DASHBOARD = {**settings.DASHBOARD, "FEED_REFRESH_SECONDS": 0.2}
    snapshot = {
        "server_name": "test", "counters": {"started_at": 0, "connections": 2, "rdata_sent": 5,
                                            "position_sent": 1, "other_sent": 3,
                                            "disconnects": {"ping timeout": 1}},
        "connections": [{"name": "worker1", "peer": "127.0.0.1:5555", "connected_at": 1.0, "last_ping_at": None,
                         "outbound_queue": 7, "streams": ["events"], "syncing_users": ["@a:test"],
                         "syncing_user_count": 1, "commands_in": 3, "lines_out": 9}],
        "recent_disconnects": [{"at": 2.0, "name": "worker2", "peer": "127.0.0.1:6666",
                                "reason": "ping timeout", "detail": "ping timeout"}],
    }

    async def scenario():
        comm = communicator(staff_cookie)
        assert (await comm.connect())[0]
        await sync_to_async(EndpointStatus.objects.create)(
            endpoint="host 127.0.0.1:9092", server_name="test", pid=1,
            updated_at=datetime.now(timezone.utc), snapshot=snapshot)
        update = await next_of_type(comm, "update", lambda m: m["endpoints"])
        [endpoint] = update["endpoints"]
        assert endpoint["connections"][0]["name"] == "worker1"
        assert endpoint["connections"][0]["outbound_queue"] == 7
        assert endpoint["recent_disconnects"][0]["reason"] == "ping timeout"
        assert endpoint["stale"] is False
        await comm.disconnect()

    run(scenario)


def test_full_mode_a_write_in_another_process_arrives_through_redis(staff_cookie, settings, redis_server, pg_url):
    """Full mode: ``write_facts`` in its own process publishes its line batch on Redis; the
    web process's feed hears it on ``replication.lines`` and pushes the new position (its
    own refresh is an hour away)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    settings.DASHBOARD = {**settings.DASHBOARD, "FEED_REFRESH_SECONDS": 3600.0}
    settings.CHANNEL_LAYERS = {**settings.CHANNEL_LAYERS, "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [{"address": redis_server.url, "protocol": 2}]},
    }}
    env = dict(os.environ, DATABASE_URL=pg_url, REDIS_URL=redis_server.url)

    def write_facts() -> str:
        done = subprocess.run([sys.executable, "manage.py", "write_facts", "account_data", "--count", "3",
                               "--per-txn", "3", "--no-progress"], cwd=Path(__file__).resolve().parents[2], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    async def scenario():
        comm = communicator(staff_cookie)
        assert (await comm.connect())[0]
        snapshot = await next_of_type(comm, "snapshot")
        assert stream(snapshot, "account_data")["positions"] == {}
        out = await sync_to_async(write_facts, thread_sensitive=False)()
        final = int(re.search(r"position (\d+),", out).group(1))
        await next_of_type(comm, "update", lambda m: stream(m, "account_data")["positions"] == {"master": final})
        await comm.disconnect()
        await stop_live_feed()
        await get_channel_layer().flush()

    run(scenario)


def test_a_feed_nobody_watches_stops(staff_cookie, settings):
    settings.DASHBOARD = {**settings.DASHBOARD, "FEED_REFRESH_SECONDS": 0.1}

    async def scenario():
        from dashboard import feed as feed_module

        comm = communicator(staff_cookie)
        assert (await comm.connect())[0]
        await next_of_type(comm, "snapshot")
        loop = asyncio.get_running_loop()
        feed = feed_module._feeds[loop]
        feed.idle_stop = 0.3
        assert feed.clients == 1
        await comm.disconnect()
        assert feed.clients == 0
        deadline = loop.time() + WAIT
        while loop.time() < deadline and not all(t.done() for t in feed._tasks):
            await asyncio.sleep(0.05)
        assert all(t.done() for t in feed._tasks) and feed.stopping
        assert loop not in feed_module._feeds
        # The next page gets a new, running feed.
        again = communicator(staff_cookie)
        assert (await again.connect())[0]
        await next_of_type(again, "snapshot")
        assert feed_module._feeds[loop] is not feed
        await again.disconnect()

    run(scenario)


def test_banner_health_turns_failing_with_the_reason_and_back(staff_cookie, settings):
    """The page's Live banner follows readiness, not just its socket: with this host's
    endpoint gone the feed pushes a failing ``health`` with the reason; once the endpoint's
    status row is fresh again (its process alive), an ok one."""
    import os
    import subprocess
    import sys

    from dashboard.health import endpoint_key

    settings.DASHBOARD = {**settings.DASHBOARD, "FEED_REFRESH_SECONDS": 0.2}
    settings.REDIS_URL = ""
    settings.HEALTH_CHECK_ENDPOINT = True
    listen = settings.SYNAPSE_REPL["REPLICATION_LISTEN"]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    def row(pid: int) -> None:
        EndpointStatus.objects.update_or_create(endpoint=endpoint_key(listen), defaults={
            "server_name": "localhost", "pid": pid, "updated_at": datetime.now(timezone.utc), "snapshot": {}})

    async def scenario():
        await sync_to_async(row)(gone.pid)
        comm = communicator(staff_cookie)
        connected, _ = await comm.connect()
        assert connected
        failing = await next_of_type(comm, "health", lambda m: m["status"] == "failing")
        assert failing["checks"] == {"database": "ok", "endpoint": "failing"}
        assert any(f"process {gone.pid} gone" in reason for reason in failing["reasons"])
        await sync_to_async(row)(os.getpid())
        ok = await next_of_type(comm, "health", lambda m: m["status"] == "ok")
        assert ok["checks"] == {"database": "ok", "endpoint": "ok"} and ok["reasons"] == []
        await comm.disconnect()

    run(scenario)

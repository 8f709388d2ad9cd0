"""Synapse wire compatibility on Redis: a plain redis-py subscriber, parsing with our codec,
sees byte-exact Synapse lines on ``<server_name>``, and REPLICATE is answered."""
from __future__ import annotations

import json
import random
import time

import pytest
import redis

from replication.protocol.commands import PositionCommand, parse_line
from replication.protocol.line_batch import encode_run
from rooms.models import CurrentStateDelta, Event
from streams.conf import stream_writers
from streams.models import Receipt
from streams.runtime import StreamRuntime

pytestmark = pytest.mark.django_db(transaction=True)


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


@pytest.fixture
def setup(redis_server):
    from channels_redis.pubsub import RedisPubSubChannelLayer

    server_name = f"bridge{random.getrandbits(32):x}.example"
    rt = StreamRuntime(instance_name="master", writers=stream_writers(""))
    rt.stream_replication(layer=RedisPubSubChannelLayer(hosts=[redis_server.url]),
                          redis_url=redis_server.url, server_name=server_name)
    client = redis.Redis.from_url(redis_server.url)
    sub = client.pubsub()
    sub.subscribe(server_name)
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    deadline = time.monotonic() + 10
    while rt.streamer.bridge is None or not rt.streamer.bridge.subscribed.is_set():
        assert time.monotonic() < deadline, "bridge did not subscribe"
        time.sleep(0.05)
    yield rt, client, sub, server_name
    sub.close()
    client.close()
    rt.close()


def read_lines(sub, count: int, timeout: float = 10.0) -> list[bytes]:
    out, deadline = [], time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        message = sub.get_message(timeout=0.5)
        if message and message["type"] == "message":
            out.append(message["data"])
    return out


def test_lines_are_byte_exact_synapse_lines(setup):
    rt, _, sub, _ = setup
    rng = random.Random(1)
    ev_before = rt.generator("events").get_current_token_for_writer("master")
    r_before = rt.generator("receipts").get_current_token_for_writer("master")
    ev = Event.synthetic(rng, 0) | {"type": "m.room.name", "state_key": "", "sender": "@é:hs"}
    (sid,) = rt.writer("events").append([[
        (Event, ev),
        (CurrentStateDelta, {"room_id": ev["room_id"], "type": "m.room.name", "state_key": "", "event_id": ev["event_id"]}),
    ]])
    receipt = Receipt.synthetic(rng, 1) | {"data": {"ts": 5, "note": "é☃"}}
    (rid,) = rt.writer("receipts").append([[(Receipt, receipt)]])
    got = read_lines(sub, 5)
    ev_row = ["ev", [ev["event_id"], ev["room_id"], "m.room.name", "", None, None, None, False, False]]
    state_row = ["state", [ev["room_id"], "m.room.name", "", ev["event_id"]]]
    r_row = [receipt["room_id"], "m.read", receipt["user_id"], receipt["event_id"], None, {"ts": 5, "note": "é☃"}]
    assert got == [
        # A writer new to this subscription first says where it starts (subscribers accept
        # a writer's RDATA only after a POSITION for it).
        f"POSITION events master {ev_before} {ev_before}".encode(),
        f"RDATA events master batch {compact(ev_row)}".encode(),
        f"RDATA events master {sid} {compact(state_row)}".encode(),
        f"POSITION receipts master {r_before} {r_before}".encode(),
        f"RDATA receipts master {rid} {compact(r_row)}".encode(),
    ]
    assert b"\\u00e9\\u2603" in got[4]  # Synapse's encoder escapes non-ASCII
    assert all(b"\n" not in line for line in got)
    for line in got:
        assert parse_line(line.decode()).to_line().encode() == line


def test_replicate_is_answered_with_positions(setup):
    rt, client, sub, server_name = setup
    rng = random.Random(2)
    ids = rt.writer("receipts").append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(3)])
    read_lines(sub, 4)
    client.publish(server_name, b"REPLICATE ")
    lines = read_lines(sub, 2)
    assert lines[0] == b"REPLICATE "
    assert parse_line(lines[1].decode()) == PositionCommand("receipts", "master", ids[-1], ids[-1])


def test_rolled_back_fact_is_a_position(setup):
    rt, _, sub, _ = setup
    before = rt.generator("account_data").get_current_token_for_writer("master")
    with pytest.raises(RuntimeError):
        with rt.writer("account_data").transaction(1):
            raise RuntimeError("rolled back")
    assert read_lines(sub, 2) == [f"POSITION account_data master {before} {before}".encode(),
                                  f"POSITION account_data master {before} {before + 1}".encode()]


# --- ordering of answers and batches ---------------------------------------------------------


def _ordering_violations(lines: list[bytes]) -> list[str]:
    """Positions announced below an RDATA of the same writer that came earlier.

    A subscriber that is not yet connected for a writer drops its RDATA until a POSITION for
    it; a later ``POSITION t t`` with ``t`` below those lines connects it *after* them, so they
    are never fetched: a lost batch.
    """
    seen: dict[tuple[str, str], int] = {}
    bad = []
    for raw in lines:
        cmd = parse_line(raw.decode())
        key = (getattr(cmd, "stream_name", None), getattr(cmd, "instance_name", None))
        if cmd.NAME == "RDATA" and cmd.token is not None:
            seen[key] = max(seen.get(key, 0), cmd.token)
        elif cmd.NAME == "POSITION" and cmd.new_token < seen.get(key, 0):
            bad.append(f"{raw.decode()} after RDATA up to {seen[key]}")
    return bad


def test_replicate_answers_never_fall_behind_published_lines(redis_server):
    """REPLICATE answers and line batches race inside a writer (one is the reading task, the
    other the streamer). An answer must never say ``POSITION t t`` after lines above ``t``
    went out: Redis restarts make both need a fresh connection at the same moment."""
    import asyncio

    from replication.protocol.commands import RdataCommand
    from replication.publish.redis_bridge import SynapseRedisBridge

    server_name = f"race{random.getrandbits(32):x}.example"
    upto = {("events", "w1"): 0}
    client = redis.Redis.from_url(redis_server.url)
    sub = client.pubsub()
    sub.subscribe(server_name)
    assert sub.get_message(timeout=5)["type"] == "subscribe"

    async def scenario() -> None:
        bridge = SynapseRedisBridge(redis_server.url, server_name, announce=lambda: [
            PositionCommand(s, w, t, t) for (s, w), t in upto.items()])
        bridge.start()
        await asyncio.wait_for(bridge.subscribed.wait(), 10)
        for _round in range(40):
            # Each round: the publisher's connections are gone (as after a Redis restart),
            # then a REPLICATE arrives while the streamer publishes its next batch.
            if bridge._publisher is not None:
                await bridge._publisher.close()
                bridge._publisher = None
            prev = upto[("events", "w1")]
            new = prev + 3
            run, _, _ = encode_run("events", "w1", prev, new, [(t, [["x", t]]) for t in range(prev + 1, new + 1)])

            async def streamer() -> None:
                upto[("events", "w1")] = new
                await bridge.publish_run(run)

            # What the reading task does when it hears a REPLICATE, racing the streamer.
            await asyncio.gather(bridge.answer_replicate(), streamer())
        await bridge.stop()

    asyncio.run(scenario())
    got = read_lines(sub, 10_000, timeout=3)  # everything (the bridge has stopped)
    sub.close()
    client.close()
    assert sum(1 for line in got if line.startswith(b"RDATA")) == 120
    assert _ordering_violations(got) == []


def test_bridge_notices_a_redis_restart_and_announces_again(redis_server):
    """The bridge's subscription must not be silently restored by a client library: a
    REPLICATE published while it was away would go unanswered and nothing would announce the
    writer's position again. After a restart it announces (unasked) and answers again."""
    import asyncio

    from replication.protocol.resp import RespConnection, parse_messages
    from replication.publish.redis_bridge import SynapseRedisBridge

    server_name = f"restart{random.getrandbits(32):x}.example"
    announced = []

    def announce():
        announced.append(time.monotonic())
        return [PositionCommand("events", "w1", 7, 7)]

    async def wait(predicate, what: str) -> None:
        deadline = time.monotonic() + 20
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def scenario() -> list[bytes]:
        bridge = SynapseRedisBridge(redis_server.url, server_name, announce=announce)
        bridge.start()
        await wait(bridge.subscribed.is_set, "the first subscription")
        assert (bridge.resubscriptions, len(announced)) == (1, 1)
        await asyncio.to_thread(redis_server.kill)
        await asyncio.to_thread(redis_server.start, port=redis_server.port)
        await wait(lambda: bridge.subscribed.is_set() and bridge.resubscriptions >= 2, "a resubscription")
        assert len(announced) >= 2  # announced again, unasked
        # ... and it hears the channel again: a REPLICATE is answered.
        sub = await RespConnection.open(redis_server.url)
        assert await sub.command("SUBSCRIBE", server_name) == [b"subscribe", server_name.encode(), 1]
        pub = await RespConnection.open(redis_server.url)
        await pub.publish([(server_name.encode(), b"REPLICATE ")])
        heard, buf = [], b""
        while len(heard) < 2:
            buf += await sub.read_chunk(10)
            messages, end = parse_messages(buf)
            heard += messages
            buf = buf[end:]
        for conn in (sub, pub):
            await conn.close()
        await bridge.stop()
        return heard

    assert asyncio.run(scenario()) == [b"REPLICATE ", b"POSITION events w1 7 7"]


def test_settle_waits_until_dropped_lines_are_announced(redis_server):
    """A writer about to exit after Redis came back must first announce the lines it had
    to drop, or subscribers that missed them would have nobody to tell them."""
    import asyncio

    from replication.protocol.commands import RdataCommand
    from replication.publish.redis_bridge import SynapseRedisBridge

    server_name = f"settle{random.getrandbits(32):x}.example"
    upto = {("events", "w1"): 0}

    async def scenario() -> None:
        bridge = SynapseRedisBridge(redis_server.url, server_name, announce=lambda: [
            PositionCommand(s, w, t, t) for (s, w), t in upto.items()])
        bridge.start()
        assert await bridge.settle(10)  # nothing dropped: settled once subscribed
        await asyncio.to_thread(redis_server.kill)
        upto[("events", "w1")] = 5
        await bridge.publish_run(encode_run("events", "w1", 0, 5, [(t, [["x", t]]) for t in range(1, 6)])[0])
        assert bridge._stale == {("events", "w1"): 5}
        assert not await bridge.settle(0.5)  # Redis is still down
        await asyncio.to_thread(redis_server.start, port=redis_server.port)
        assert await bridge.settle(15)
        assert bridge._stale == {} and bridge.subscribed.is_set()
        await bridge.stop()

    asyncio.run(scenario())


def test_endpoint_bridge_volunteers_changed_positions(redis_server):
    """Endpoints publish a (settled) position when it changes, unasked: a subscriber whose
    REPLICATE came before a writer went still still learns where the writer stopped."""
    import asyncio

    from replication.protocol.resp import RespConnection, parse_messages
    from replication.publish.redis_bridge import SynapseRedisBridge

    server_name = f"volunteer{random.getrandbits(32):x}.example"
    settled = {("events", "w0"): 3}

    async def scenario() -> list[bytes]:
        bridge = SynapseRedisBridge(redis_server.url, server_name, volunteer_every=0.05, announce=lambda: [
            PositionCommand(s, w, t, t) for (s, w), t in sorted(settled.items())])
        bridge.start()
        assert await bridge.settle(10)
        sub = await RespConnection.open(redis_server.url)
        assert await sub.command("SUBSCRIBE", server_name) == [b"subscribe", server_name.encode(), 1]
        await asyncio.sleep(0.3)  # unchanged positions are not repeated
        settled[("events", "w1")] = 9
        heard, buf = [], b""
        deadline = time.monotonic() + 10
        while not heard and time.monotonic() < deadline:
            buf += await sub.read_chunk(1)
            messages, end = parse_messages(buf)
            heard += messages
            buf = buf[end:]
        await asyncio.sleep(0.3)
        buf += await sub.read_chunk(0.1)
        heard += parse_messages(buf)[0]
        await sub.close()
        await bridge.stop()
        return heard

    assert asyncio.run(scenario()) == [b"POSITION events w1 9 9"]


def test_transactions_completing_out_of_order_go_out_in_order(setup):
    """Several transactions of one writer in flight (threads, each on its own connection, as
    ``write_facts --concurrency``), a later one completing first: every fact goes out once,
    in stream order, and only once everything below it is complete."""
    import threading

    from django.db import connections

    rt, _, sub, _ = setup
    writer = rt.writer("receipts")
    before = writer.generator.get_current_token_for_writer("master")
    one_completed, holding = threading.Event(), threading.Event()
    real_commit_rows = writer._commit_rows

    def commit_rows(by_model, sql, params, **kwargs):
        # (append writes and commits its transaction in _commit_rows, its IDs reserved)
        if not holding.is_set():
            # The first transaction (the lowest IDs) stays uncommitted until a later one completed.
            holding.set()
            assert one_completed.wait(30)
        real_commit_rows(by_model, sql, params, **kwargs)

    def write(thread: int) -> None:
        rng = random.Random(thread)
        try:
            for n in range(25):
                writer.append([[(Receipt, Receipt.synthetic(rng, n))] for _ in range(4)])
                one_completed.set()
        finally:
            connections.close_all()

    from unittest import mock

    with mock.patch.object(writer, "_commit_rows", commit_rows):
        threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
        threads[0].start()
        assert holding.wait(30)
        for t in threads[1:]:
            t.start()
        for t in threads:
            t.join(60)
    assert one_completed.is_set()
    ids = sorted(Receipt.objects.values_list("stream_id", flat=True))
    assert len(ids) == 400
    lines = [parse_line(line.decode()) for line in read_lines(sub, 401)]
    assert lines[0] == PositionCommand("receipts", "master", before, before)
    tokens = [cmd.token for cmd in lines[1:]]
    assert tokens == ids  # each fact once, ascending


# --- one write per batch -----------------------------------------------------------------------


def test_the_layer_message_goes_out_in_the_bridges_write(setup):
    """With the channel layer on the bridge's Redis, a batch is one write on one connection:
    the channel-layer message (what endpoints relay) arrives whole, and the streamer's own
    layer connection is never opened. While the bridge is not subscribed (its lines are
    dropped), the layer message still goes out, on that connection."""
    rt, client, sub, _ = setup
    streamer = rt.streamer
    publisher = streamer._group_publisher
    assert publisher is not None and publisher.url == streamer.bridge.url
    layer_sub = client.pubsub()
    layer_sub.subscribe(publisher.channel)
    assert layer_sub.get_message(timeout=5)["type"] == "subscribe"
    rng = random.Random(3)
    ids = rt.writer("receipts").append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(3)])
    assert len(read_lines(sub, 4)) == 4  # POSITION + 3 RDATA on the Synapse channel
    (data,) = read_lines(layer_sub, 1)
    message = streamer.layer.deserialize(data)
    assert (message["stream"], message["writer"], message["new"], message["count"]) == ("receipts", "master",
                                                                                        ids[-1], 3)
    assert [parse_line(line).token for line in message["data"].decode().splitlines()] == ids
    streamer.flush()
    assert publisher._conn is None  # nothing went out on a second connection
    assert streamer.published_messages == 1 and streamer.published_lines == 3

    bridge, loop = streamer.bridge, streamer._loop
    loop.call_soon_threadsafe(bridge.subscribed.clear)  # as when Redis dropped the subscription
    time.sleep(0.1)
    dropped = bridge.dropped
    (rid,) = rt.writer("receipts").append([[(Receipt, Receipt.synthetic(rng, 9))]])
    (data,) = read_lines(layer_sub, 1)
    assert streamer.layer.deserialize(data)["new"] == rid
    streamer.flush()
    assert bridge.dropped == dropped + 1 and publisher._conn is not None
    assert streamer.published_messages == 2
    loop.call_soon_threadsafe(bridge.subscribed.set)  # so that closing announces the dropped line
    layer_sub.close()

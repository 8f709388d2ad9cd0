"""The RESP2 pieces of the Redis hot paths, against a real Redis where it matters."""
from __future__ import annotations

import asyncio

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.protocol.resp import (
    LineSniffer,
    RespConnection,
    RespError,
    message_head,
    pack_command,
    pack_publish,
    pack_publish_to,
    parse_messages,
    parse_reply,
)


def test_pack_command_and_publish():
    assert pack_command("PUBLISH", b"c", 5) == b"*3\r\n$7\r\nPUBLISH\r\n$1\r\nc\r\n$1\r\n5\r\n"
    assert pack_publish([(b"c", b"x y"), (b"c/USER_IP", b"")]) == (
        pack_command("PUBLISH", b"c", b"x y") + pack_command("PUBLISH", b"c/USER_IP", b""))
    assert pack_publish_to(b"hs.example", [b"RDATA a b 1 []", b"", b"x\r\ny"]) == \
        pack_publish([(b"hs.example", b"RDATA a b 1 []"), (b"hs.example", b""), (b"hs.example", b"x\r\ny")])
    assert pack_publish_to(b"c", []) == b""


@pytest.mark.parametrize("wire, value", [
    (b"+PONG\r\n", b"PONG"),
    (b":42\r\n", 42),
    (b"$3\r\na\r\n\r\n", b"a\r\n"),
    (b"$-1\r\n", None),
    (b"*2\r\n$4\r\npong\r\n$0\r\n\r\n", [b"pong", b""]),
    (b"*-1\r\n", None),
])
def test_parse_reply(wire, value):
    assert parse_reply(wire) == (value, len(wire))
    for cut in range(len(wire)):  # every prefix is incomplete, never wrong
        assert parse_reply(wire[:cut]) is None


def test_parse_messages_fast_path_and_leftovers():
    msg = b"*3\r\n$7\r\nmessage\r\n$2\r\nhs\r\n$5\r\nRDATA\r\n"
    confirm = b"*3\r\n$9\r\nsubscribe\r\n$2\r\nhs\r\n:1\r\n"
    wire = confirm + msg + msg
    assert parse_messages(wire) == ([[b"subscribe", b"hs", 1], b"RDATA", b"RDATA"], len(wire))
    for cut in range(len(wire)):
        got, rest = parse_messages(wire[:cut])
        more, end = parse_messages(wire[:cut][rest:] + wire[cut:])
        assert got + more == [[b"subscribe", b"hs", 1], b"RDATA", b"RDATA"]


def _message(channel: bytes, payload: bytes) -> bytes:
    return b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(channel), channel, len(payload), payload)


_replies = st.lists(st.one_of(
    st.tuples(st.sampled_from([b"hs", b"hs2", b"h", b"hs/USER_IP"]),
              st.binary(max_size=20) | st.sampled_from([b"RDATA s w 1 []", b"hs\r\n$", b"\r\n$3\r\n"]))
    .map(lambda cp: _message(*cp)),
    st.sampled_from([b"*2\r\n$4\r\npong\r\n$0\r\n\r\n", b"*3\r\n$9\r\nsubscribe\r\n$2\r\nhs\r\n:1\r\n"]),
), max_size=8).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(_replies, st.integers(0, 400))
def test_parse_messages_with_a_channel_head_parses_the_same(wire, cut):
    """A subscriber's own channel's head only spares a search: the same replies and the same
    rest, whole or cut anywhere, whatever the other channels' names and the payloads hold."""
    head = message_head(b"hs")
    assert parse_messages(wire, 0, head) == parse_messages(wire)
    part = wire[:cut]
    assert parse_messages(part, 0, head) == parse_messages(part)


def test_sniffer_picks_messages_by_prefix_across_chunks():
    def message(payload: bytes) -> bytes:
        return b"*3\r\n$7\r\nmessage\r\n$2\r\nhs\r\n$%d\r\n%s\r\n" % (len(payload), payload)

    replicate, other = message(b"REPLICATE "), message(b"REPLICATE events 0")
    rdata = message(b'RDATA s w 1 ["REPLICATE ","REMOTE_SERVER_UP x"]')
    up, lock = message(b"REMOTE_SERVER_UP other.example"), message(b'LOCK_RELEASED ["w","n","k"]')
    wire = rdata + replicate + up + other + b":1\r\n" + lock + replicate + rdata + up
    expected = [b"REPLICATE ", b"REMOTE_SERVER_UP other.example", b"REPLICATE events 0",
                b'LOCK_RELEASED ["w","n","k"]', b"REPLICATE ", b"REMOTE_SERVER_UP other.example"]
    for size in (1, 2, 3, 7, 40, len(wire)):
        sniffer = LineSniffer([b"REPLICATE ", b"REMOTE_SERVER_UP ", b"LOCK_RELEASED "])
        got = [p for i in range(0, len(wire), size) for p in sniffer.feed(wire[i:i + size])]
        assert got == expected, size
    # a payload that never ends is not kept beyond max_line
    sniffer = LineSniffer([b"REMOTE_SERVER_UP "], max_line=100)
    assert sniffer.feed(b"\r\n$500\r\nREMOTE_SERVER_UP " + b"x" * 200) == []
    assert sniffer.feed(b"\r\n") == [] and sniffer.feed(up) == [b"REMOTE_SERVER_UP other.example"]


def test_publish_and_subscribe_against_redis(redis_server):
    async def scenario():
        sub = await RespConnection.open(redis_server.url)
        assert await sub.command("SUBSCRIBE", b"ch") == [b"subscribe", b"ch", 1]
        pub = await RespConnection.open(redis_server.url)
        payloads = [b"line %d" % i for i in range(1000)]
        await pub.publish([(b"ch", p) for p in payloads] + [(b"other", b"x")])
        got, buf = [], b""
        while len(got) < 1000:
            buf += await sub.read_chunk(5)
            messages, end = parse_messages(buf)
            got += messages
            buf = buf[end:]
        assert got == payloads
        with pytest.raises(RespError):
            await pub.command("NOSUCHCOMMAND")
        await pub.close()
        await sub.close()

    asyncio.run(scenario())


def test_auth_and_refused_connection(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.config_set("requirepass", "s3cret")
    try:
        async def scenario():
            conn = await RespConnection.open(redis_server.url.replace("redis://", "redis://:s3cret@"))
            assert await conn.command("PING") == b"PONG"
            await conn.close()
            with pytest.raises(RespError, match="WRONGPASS|invalid"):
                await RespConnection.open(redis_server.url.replace("redis://", "redis://:nope@"))

        asyncio.run(scenario())
    finally:
        redis.Redis.from_url(redis_server.url.replace("redis://", "redis://:s3cret@")).config_set("requirepass", "")
        client.close()

    async def refused():
        from testing.services import free_port

        with pytest.raises(RespError, match="cannot connect"):
            await RespConnection.open(f"redis://127.0.0.1:{free_port()}/0", timeout=2)

    asyncio.run(refused())

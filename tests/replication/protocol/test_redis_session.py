"""The shared Redis subscription core (replication/protocol/redis_session.py): its decisions,
in process with a fake clock, and the adapter against a real Redis."""
from __future__ import annotations

import asyncio

import pytest

from replication.protocol.redis_session import (
    Due,
    Phase,
    RedisSubscription,
    SubscriptionMachine,
    SubscriptionPolicy,
)
from replication.protocol.resp import READ_SIZE, RespConnection, parse_messages

POLICY = SubscriptionPolicy(ping_interval=5, silence_timeout=15, confirm_timeout=10,
                            first_delay=0.25, max_delay=5, jitter=0.1)


def live_machine(now: float = 100.0, rng=lambda: 0.5) -> SubscriptionMachine:
    m = SubscriptionMachine(POLICY, rng=rng)
    m.attempt(now)
    m.confirmed(now)
    return m


def test_confirmations_are_bounded_from_the_attempt():
    m = SubscriptionMachine(POLICY)
    m.attempt(100.0)
    assert m.phase is Phase.CONFIRMING
    assert m.confirm_time_left(103.0) == pytest.approx(7.0)
    assert m.confirm_time_left(200.0) > 0  # a last look, never a zero timeout
    assert m.poll(200.0) is Due.NOTHING  # not live: nothing to ping


def test_a_silent_connection_is_pinged_every_interval_then_given_up():
    m = live_machine(100.0)
    assert m.poll(104.9) is Due.NOTHING
    assert m.wake_in(104.0) == pytest.approx(0.5)  # never sleeps past a tick
    assert m.wake_in(104.8) == pytest.approx(0.2)  # ... nor past the PING
    assert m.poll(105.0) is Due.PING
    m.pinged(105.0)
    assert m.poll(106.0) is Due.NOTHING  # one PING per interval, not one per poll
    assert m.poll(110.0) is Due.PING
    m.pinged(110.0)
    assert m.poll(114.9) is Due.NOTHING
    assert m.poll(115.0) is Due.GIVE_UP
    assert "15.0 s" in m.give_up_reason


def test_a_busy_connection_is_never_pinged_and_an_answer_restarts_the_count():
    m = live_machine(100.0)
    for t in range(101, 200):
        m.heard(float(t))
        assert m.poll(t + 0.9) is Due.NOTHING
    m.pinged(199.0)
    assert m.poll(204.0) is Due.PING  # silent for 5 s since the last message
    m.pinged(204.0)
    m.heard(204.1)  # the PONG
    assert m.poll(209.0) is Due.NOTHING  # the PONG counts as heard
    assert m.poll(209.2) is Due.PING
    m.pinged(209.2)
    assert m.poll(219.0) is Due.PING and m.poll(219.2) is Due.GIVE_UP  # 15 s after the PONG


def test_back_off_doubles_to_the_cap_with_jitter_and_resets_only_when_established():
    draws = iter([0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    m = SubscriptionMachine(POLICY, rng=lambda: next(draws))
    delays = []
    for _ in range(7):
        m.attempt(0.0)
        delays.append(m.lost())
        assert m.phase is Phase.IDLE
    # 0.25 -10 %, 0.5 +10 %, then exact (the draw in the middle), capped at 5 s
    assert delays == pytest.approx([0.225, 0.55, 1.0, 2.0, 4.0, 5.0, 5.0])
    m.attempt(0.0)
    m.confirmed(0.0)  # subscribed, but the owner's first PUBLISH was refused (an ACL)
    assert m.lost() == pytest.approx(5.0)
    m.attempt(0.0)
    m.confirmed(0.0)
    m.established()
    assert m.lost() == pytest.approx(0.25)


def test_jitter_spreads_the_reconnects_of_many_processes():
    import random

    rng = random.Random(7)
    firsts = {round(SubscriptionMachine(POLICY, rng=rng.random).lost(), 4) for _ in range(50)}
    assert len(firsts) > 40 and min(firsts) >= 0.225 and max(firsts) <= 0.275


def test_the_adapter_subscribes_runs_the_hook_first_and_resubscribes_after_a_kill(redis_server):
    """Against a real Redis: the hook runs once every channel is confirmed, chunks follow,
    and a connection killed by Redis (CLIENT KILL) is a new subscription after a back-off."""
    channels = [b"session-test-a", b"session-test-b"]

    async def scenario():
        events: list[str] = []
        buf = bytearray()

        async def subscribed():
            events.append("subscribed")

        def chunk(data: bytes) -> None:
            buf.extend(data)

        admin = await RespConnection.open(redis_server.url)

        async def pubsub_clients() -> dict[str, str]:
            """id -> number of channels, of every subscribed client of the (shared) Redis."""
            listing = (await admin.command("CLIENT", "LIST", "TYPE", "pubsub")).decode().splitlines()
            fields = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in listing]
            return {c["id"]: c.get("sub", "") for c in fields}

        others = await pubsub_clients()  # other tests' subscribers still connected
        sub = RedisSubscription(redis_server.url, channels, on_subscribed=subscribed, on_chunk=chunk,
                                on_lost=lambda reason: events.append(f"lost {reason is not None}"),
                                policy=SubscriptionPolicy(first_delay=0.05), name="test")
        task = asyncio.create_task(sub.run())

        async def wait(predicate, what):
            for _ in range(800):  # 20 s: a loaded machine
                if predicate():
                    return
                await asyncio.sleep(0.025)
            raise AssertionError(f"never happened: {what}; {events}")

        await wait(lambda: events == ["subscribed"], "subscribed")
        await admin.command("PUBLISH", channels[1], b"one")
        await wait(lambda: b"one" in buf, "the message")
        assert parse_messages(bytes(buf))[0] == [b"one"]
        # ours: the one new client subscribed to two channels (the Redis is the session's)
        ours = [cid for cid, n in (await pubsub_clients()).items() if cid not in others and n == "2"]
        assert len(ours) == 1
        await admin.command("CLIENT", "KILL", "ID", ours[0])
        await wait(lambda: events.count("subscribed") == 2, "resubscribed")
        assert events == ["subscribed", "lost True", "subscribed"]
        assert sub.counters["subscriptions"] == 2 and sub.established
        sub.stop()
        await asyncio.wait_for(task, 5)
        assert events[-1] == "lost False"  # stopped: not a loss
        await admin.close()

    asyncio.run(scenario())


def test_read_pause_gathers_what_arrives_meanwhile(redis_server):
    """With ``read_pause`` (the bridge's), messages published while the owner pauses come as
    one chunk."""
    async def scenario():
        chunks: list[bytes] = []
        subscribed = asyncio.Event()

        async def on_subscribed():
            subscribed.set()

        sub = RedisSubscription(redis_server.url, [b"pause-test"], on_subscribed=on_subscribed,
                                on_chunk=chunks.append, name="test", read_pause=2.0)
        task = asyncio.create_task(sub.run())
        admin = await RespConnection.open(redis_server.url)
        try:
            await asyncio.wait_for(subscribed.wait(), 10)
            await admin.command("PUBLISH", b"pause-test", b"first")
            for _ in range(200):
                if chunks:
                    break
                await asyncio.sleep(0.01)
            assert parse_messages(b"".join(chunks))[0] == [b"first"]
            for i in range(4):  # one at a time, each answered: during the pause
                await admin.command("PUBLISH", b"pause-test", b"later %d" % i)
            for _ in range(400):
                if len(parse_messages(b"".join(chunks))[0]) == 5:
                    break
                await asyncio.sleep(0.01)
            assert parse_messages(b"".join(chunks))[0] == [b"first", *(b"later %d" % i for i in range(4))]
            assert len(chunks) == 2
        finally:
            await admin.close()
            sub.stop()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_read_pause_never_follows_a_full_read(monkeypatch):
    """A backlog bigger than one read is read on at once: only a read that emptied the socket
    is followed by the pause (else a subscriber could fall behind a busy channel)."""
    from replication.protocol import redis_session

    reads = [b"a" * READ_SIZE, b"b" * READ_SIZE, b"c" * 10, b"d" * READ_SIZE, b"e" * 3]
    log: list[str] = []

    class ScriptedConnection:
        async def read_chunk(self, timeout=None):
            if not reads:
                sub.stop()
                return b""
            return reads.pop(0)

    real_sleep = asyncio.sleep

    async def sleep(delay, *args):
        if delay == 0.5:
            log.append("pause")
        await real_sleep(0)

    def on_chunk(chunk: bytes) -> None:
        log.append(f"{chunk[:1].decode()}{len(chunk)}")

    async def scenario():
        nonlocal sub
        sub = RedisSubscription("redis://127.0.0.1:1", [b"c"], on_subscribed=lambda: None, on_chunk=on_chunk,
                                name="test", read_pause=0.5)
        monkeypatch.setattr(redis_session.asyncio, "sleep", sleep)
        assert await sub._read(ScriptedConnection()) == "stopped"

    sub = None
    asyncio.run(scenario())
    assert log == [f"a{READ_SIZE}", f"b{READ_SIZE}", "c10", "pause", f"d{READ_SIZE}", "e3", "pause"]


def test_cancelling_run_ends_even_a_session_that_loses_the_cancellation():
    """run() cancelled while its session does not end on the cancellation passed on to it
    (as when asyncio loses one in a race): run() still ends cancelled, and the session with
    it (told to stop, cancelled again), instead of the canceller waiting forever."""

    class Stubborn(RedisSubscription):
        swallowed = 0

        async def _session(self) -> str:
            while not self._stopping:
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    self.swallowed += 1  # lost: reads on
            return "stopped"

    async def scenario():
        async def nothing() -> None:
            pass

        sub = Stubborn("redis://127.0.0.1:9", [b"c"], on_subscribed=nothing, on_chunk=lambda chunk: None)
        task = asyncio.create_task(sub.run())
        await asyncio.sleep(0.05)
        session = sub._session_task
        assert session is not None and not session.done()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        assert task in done and task.cancelled()
        assert session.done() and sub.swallowed >= 1

    asyncio.run(scenario())


# --- what an outage is worth saying (OutageNotice) ------------------------------------------------


def test_an_outage_is_said_once_as_it_starts_once_still_down_and_once_back():
    import logging

    from replication.protocol.redis_session import OutageNotice

    notice = OutageNotice("Redis subscription to hs")
    said = [notice.failed(10.0, "Redis closed the connection", was_up=True)]
    said += [notice.failed(10.0 + i, "connection refused", was_up=False) for i in range(1, 30)]
    said.append(notice.up(45.5))
    lines = [s for s in said if s is not None]
    assert [level for level, _ in lines] == [logging.WARNING, logging.WARNING, logging.INFO]
    assert "lost: Redis closed the connection" in lines[0][1]
    assert "still down: connection refused" in lines[1][1]
    assert lines[2][1] == "Redis subscription to hs back after 35.5 s (29 failed attempts)"
    # up while nothing was down says nothing; a second outage is told again from its start
    assert notice.up(50.0) is None
    assert notice.failed(60.0, "gone", was_up=True)[1].endswith("lost: gone; retrying (said again when it is back)")


def test_a_connection_that_never_came_up_says_so_once():
    from replication.protocol.redis_session import OutageNotice

    notice = OutageNotice("USER_IP lease on Redis")
    first = notice.failed(0.0, "connection refused", was_up=False)
    assert first is not None and "cannot connect: connection refused" in first[1]
    assert notice.failed(1.0, "connection refused", was_up=False) is not None  # still down (once)
    assert all(notice.failed(t, "connection refused", was_up=False) is None for t in range(2, 40))

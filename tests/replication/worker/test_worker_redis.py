"""RedisReplicationWorker against a real redis-server, a scripted writer side and a fake
catch-up endpoint.

The writer side (:class:`FakeWriters`) is played with a plain redis-py client, as a writer
process or endpoint would: it subscribes to the channel, answers ``REPLICATE `` with
``POSITION <stream> <writer> <t> <t>`` for every writer it plays (and announces them when it
(re)subscribes itself, as ``synapse/replication/tcp/redis.py`` does), and publishes RDATA lines as it writes facts, which
the catch-up endpoint (``CatchUpSource`` of test_worker.py) serves too. Each test uses its own
channel (server name): the ``redis_server`` fixture is shared by the whole session.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid

import pytest
from django.core.management import CommandError, call_command
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from common.url_redaction import redact_url
from replication.protocol.commands import batch_updates
from replication.worker.redis_worker import RedisReplicationWorker
from tests.replication.worker.test_worker import MANAGE_PY, RecordingHarness, _jsonl, catchup, run, wait_until  # noqa: F401 (fixture)

STREAMS = ["events", "receipts", "caches", "typing"]


def unique_channel() -> str:
    return f"t{uuid.uuid4().hex[:10]}.test.hs"


def plain_client(url: str) -> Redis:
    """A redis-py client that fails fast instead of retrying (the test decides)."""
    return Redis.from_url(url, protocol=2, retry=Retry(NoBackoff(), 0),
                          socket_connect_timeout=1, single_connection_client=True)


# --- the writer side ---------------------------------------------------------------------


class FakeWriters:
    """Writers (and endpoints) on channel ``channel``, as seen through Redis."""

    def __init__(self, url: str, channel: str, catchup, answer_replicate: bool = True) -> None:
        self.url, self.channel, self.catchup = url, channel, catchup
        self.answer_replicate = answer_replicate
        self.positions: dict[tuple[str, str], int] = {}
        self.received: list[tuple[float, bytes]] = []  # (monotonic time, message)
        self.replicates = 0
        self.subscriptions = 0
        self.lost = 0  # lines that could not be published (Redis down)
        self.subscribed = asyncio.Event()
        self.publisher = plain_client(url)
        self._lock = asyncio.Lock()  # one publisher, FIFO: the channel order is ours

    async def __aenter__(self) -> "FakeWriters":
        self.task = asyncio.create_task(self._follow())
        await asyncio.wait_for(self.subscribed.wait(), 5)
        return self

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.publisher.aclose()

    async def _follow(self) -> None:
        """Subscribe, (re)announce, answer REPLICATE; resubscribe whenever Redis goes away."""
        while True:
            client = plain_client(self.url)
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                while (await pubsub.get_message(timeout=1.0) or {}).get("type") != "subscribe":
                    pass
                self.subscriptions += 1
                self.subscribed.set()
                await self.announce()
                while True:
                    message = await pubsub.get_message(timeout=0.2)
                    if not message or message["type"] != "message":
                        continue
                    self.received.append((time.monotonic(), message["data"]))
                    if message["data"] == b"REPLICATE ":
                        self.replicates += 1
                        if self.answer_replicate:
                            await self.announce()
            except (RedisError, OSError):
                self.subscribed.clear()
                await asyncio.sleep(0.05)
            finally:
                try:
                    await pubsub.aclose()
                    await client.aclose()
                except (RedisError, OSError):
                    pass

    async def publish(self, *lines: str | bytes) -> None:
        async with self._lock:
            for line in lines:
                try:
                    await self.publisher.publish(self.channel, line)
                except (RedisError, OSError):
                    self.lost += 1

    async def announce(self) -> None:
        await self.publish(*(f"POSITION {s} {w} {t} {t}" for (s, w), t in self.positions.items()))

    async def write(self, stream: str, writer: str, token: int, *rows, publish: bool = True) -> None:
        """One fact: recorded for catch-up first, then published as RDATA (batch rows)."""
        self.catchup.add(stream, writer, token, *rows)
        self.positions[(stream, writer)] = token
        if publish:
            await self.publish(*(
                f"RDATA {stream} {writer} {'batch' if t is None else t} "
                + json.dumps(row, separators=(",", ":"))
                for t, row in batch_updates([(token, row) for row in rows])))

    def replicate_times(self) -> list[float]:
        return [t for t, data in self.received if data == b"REPLICATE "]


class Harness(RecordingHarness):
    """A Redis worker on ``channel``, recording what it delivers."""

    def __init__(self, url: str, channel: str, catchup, **kwargs) -> None:
        super().__init__(kwargs)
        self.worker = RedisReplicationWorker(
            name="w1", redis_url=url, server_name=channel, catchup_url=catchup.url,
            streams=STREAMS, **kwargs)


class Proxy:
    """A TCP proxy in front of Redis that can play a dead network.

    ``freeze()``: the connections open now stay open but nothing more gets through (no FIN,
    no RST: what a worker sees when a NAT or a VM drops its connection). New connections are
    forwarded normally. While ``release_subscribe`` is clear, data from Redis that contains a
    SUBSCRIBE confirmation is held back; ``released_at`` is when it was let through.
    """

    def __init__(self, port: int) -> None:
        self.target_port = port
        self.frozen: set[int] = set()
        self.pairs = 0
        self.release_subscribe = asyncio.Event()
        self.release_subscribe.set()
        self.released_at: float | None = None

    async def __aenter__(self) -> "Proxy":
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.tasks: set[asyncio.Task] = set()
        self.writers: list[asyncio.StreamWriter] = []
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in self.writers:
            writer.close()

    def freeze(self) -> None:
        self.frozen.update(range(self.pairs))

    async def _accept(self, client_reader, client_writer) -> None:
        pair = self.pairs
        self.pairs += 1
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [client_writer, server_writer]
        for reader, writer, downstream in ((client_reader, server_writer, False),
                                           (server_reader, client_writer, True)):
            task = asyncio.create_task(self._pump(pair, reader, writer, downstream))
            self.tasks.add(task)

    async def _pump(self, pair, reader, writer, downstream) -> None:
        try:
            while data := await reader.read(65536):
                if downstream and b"subscribe" in data and not self.release_subscribe.is_set():
                    await self.release_subscribe.wait()
                    self.released_at = time.monotonic()
                if pair in self.frozen:
                    continue  # swallowed: the peer hears nothing, the socket stays open
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            if pair not in self.frozen:
                writer.close()


# --- tests -----------------------------------------------------------------------------------


def test_subscribes_first_then_publishes_replicate(redis_server, catchup):
    """REPLICATE goes out only once the SUBSCRIBE is confirmed, so the answers reach us."""
    channel = unique_channel()

    async def scenario():
        async with FakeWriters(redis_server.url, channel, catchup) as writers, \
                Proxy(redis_server.port) as proxy:
            writers.positions[("events", "master")] = 0
            proxy.release_subscribe.clear()  # hold the worker's SUBSCRIBE confirmation
            async with Harness(proxy.url, channel, catchup) as h:
                await asyncio.sleep(0.5)
                assert writers.replicates == 0 and not h.worker.connected
                proxy.release_subscribe.set()
                await wait_until(lambda: writers.replicates == 1, what="REPLICATE")
                assert writers.replicate_times()[0] >= proxy.released_at
                # Byte for byte, trailing space, no newline (the rest is our POSITION's echo).
                assert [data for _, data in writers.received if data.startswith(b"REPLICATE")] \
                    == [b"REPLICATE "]
                await writers.write("events", "master", 1, ["ev", ["$1"]])
                await wait_until(lambda: h.facts, what="a fact")
                assert h.facts == [("events", "master", 1, [["ev", ["$1"]]])]
                assert h.worker.connected
                counters = h.worker.counters
                # The worker was subscribed when REPLICATE was published: it heard its own.
                assert counters["replicate_sent"] == counters["replicate_seen"] == 1
                assert counters["connections"] == 1 and counters["position"] == 1
                assert catchup.requests == []
            assert not h.worker.connected

    run(scenario())


def test_batch_rows_are_delivered_together_and_once(redis_server, catchup):
    channel = unique_channel()

    async def scenario():
        async with FakeWriters(redis_server.url, channel, catchup) as writers, \
                Harness(redis_server.url, channel, catchup) as h:
            writers.positions[("receipts", "master")] = 0
            await wait_until(lambda: writers.replicates == 1, what="REPLICATE")
            await wait_until(lambda: h.worker.counters.get("position") == 1, what="POSITION")
            receipt = lambda user, event: ["!r", "m.read", user, event, None, {}]  # noqa: E731
            await writers.write("receipts", "master", 1, receipt("@a", "$1"), receipt("@b", "$1"),
                                receipt("@c", "$1"))
            await writers.write("receipts", "master", 2, receipt("@d", "$2"))
            await writers.publish('RDATA receipts master 2 ["!r","m.read","@d","$2",null,{}]')
            await wait_until(lambda: len(h.facts) == 2, what="two facts")
            await asyncio.sleep(0.2)
            assert [(t, [r[2] for r in rows]) for _, _, t, rows in h.facts] == [
                (1, ["@a", "@b", "@c"]), (2, ["@d"])]
            assert h.worker.counters["rdata"] == 5
            assert catchup.requests == []

    run(scenario())


def test_gap_is_caught_up_over_http(redis_server, catchup):
    catchup.page_size = 2
    channel = unique_channel()

    async def scenario():
        async with FakeWriters(redis_server.url, channel, catchup) as writers:
            for token in (1, 2, 4, 5):  # written before the worker started
                await writers.write("events", "master", token, ["ev", [f"${token}"]])
            async with Harness(redis_server.url, channel, catchup) as h:
                await wait_until(lambda: h.tokens() == [1, 2, 4, 5], what="the first catch-up")
                await writers.write("events", "master", 6, ["ev", ["$6"]])  # live
                await writers.write("events", "master", 7, ["ev", ["$7"]], publish=False)  # lost
                await writers.write("events", "master", 8, ["ev", ["$8"]], publish=False)
                await writers.publish("POSITION events master 7 8")  # prev 7 > current 6
                await wait_until(lambda: len(h.facts) == 7, what="seven facts")
                await asyncio.sleep(0.1)
                assert h.tokens() == [1, 2, 4, 5, 6, 7, 8]
                assert catchup.requests == [("events", "master", 0, 5), ("events", "master", 2, 5),
                                            ("events", "master", 6, 8)]
                assert h.worker.positions() == {("events", "master"): 8}

    run(scenario())


def test_own_echoes_and_malformed_messages_are_dropped(redis_server, catchup):
    channel = unique_channel()
    bad = [b"", b"GARBAGE", b"RDATA events master notatoken []", b"RDATA events master 3 [nojson",
           b"POSITION events master", b"POSITION events master 1 x", b"\xff\xfe not utf-8"]

    async def scenario():
        async with FakeWriters(redis_server.url, channel, catchup) as writers, \
                Harness(redis_server.url, channel, catchup) as h:
            writers.positions[("events", "master")] = 0
            await wait_until(lambda: h.worker.counters.get("position") == 1, what="POSITION")
            await writers.publish(*bad)
            # Echoes of what an instance named like us published: never applied.
            await writers.publish('RDATA events w1 1 ["ev",["$mine"]]', "POSITION events w1 4 4")
            # Valid lines a TCP worker would never get (no direction checks on Redis): ignored.
            await writers.publish("SERVER other.hs", "USER_SYNC x @u:hs None start 1", "REPLICATE ",
                                  "REPLICATE events 5")
            await writers.write("events", "master", 1, ["ev", ["$1"]])
            await wait_until(lambda: h.facts, what="the good fact")
            await asyncio.sleep(0.1)
            assert h.facts == [("events", "master", 1, [["ev", ["$1"]]])]
            counters = h.worker.counters
            assert counters["malformed"] == len(bad)
            assert counters["own_echoes"] == 2
            assert counters["connections"] == 1  # never reconnected over any of it
            assert catchup.requests == []
            assert ("events", "w1") not in h.worker.positions()

    run(scenario())


def test_redis_restart_mid_stream_reconnects_and_catches_up(redis_server, catchup):
    """Kill Redis while facts flow, write more while it is down, restart it on its port."""
    channel = unique_channel()
    writers_names = ("master", "w2")

    def rows(writer: str, token: int) -> list:
        return [["ev", [f"${writer}{token}"]]] * (2 if token % 3 == 0 else 1)

    async def scenario():
        async with FakeWriters(redis_server.url, channel, catchup) as writers, \
                Harness(redis_server.url, channel, catchup) as h:
            for w in writers_names:
                writers.positions[("events", w)] = 0
            await wait_until(lambda: h.worker.counters.get("position") == 2, what="positions")
            for token in range(1, 6):
                for w in writers_names:
                    await writers.write("events", w, token, *rows(w, token))
            await wait_until(lambda: len(h.facts) == 10, what="ten live facts")

            redis_server.kill()
            await wait_until(lambda: not h.worker.connected, what="the worker noticing")
            for token in range(6, 9):  # written while Redis is down: never published
                await writers.write("events", "master", token, *rows("master", token))
            await writers.write("events", "w2", 6, *rows("w2", 6))
            assert writers.lost >= 4
            await asyncio.sleep(0.3)  # a few failed reconnection attempts
            await asyncio.to_thread(redis_server.start, port=redis_server.port)

            await wait_until(lambda: h.worker.positions() == {("events", "master"): 8,
                                                              ("events", "w2"): 6},
                             timeout=10, what="the catch-up after the restart")
            for w, token in (("master", 9), ("w2", 7)):  # live again
                await writers.write("events", w, token, *rows(w, token))
            await wait_until(lambda: len(h.facts) == 16, what="sixteen facts")
            await asyncio.sleep(0.2)

            for w, last in (("master", 9), ("w2", 7)):
                assert h.tokens("events", w) == list(range(1, last + 1))
                assert [r for s, ww, t, r in h.facts if ww == w] == [
                    rows(w, t) for t in range(1, last + 1)]
            counters = h.worker.counters
            assert counters["connections"] == 2
            # REPLICATE published again on the new subscription (and heard back by ourselves).
            # Whether the writers answered it or announced first when they resubscribed
            # themselves depends on who got back first; either way the positions arrive.
            assert counters["replicate_sent"] == counters["replicate_seen"] == 2
            assert writers.replicates >= 1 and writers.subscriptions == 2
            assert counters["connection_attempts"] >= 3  # it kept trying while Redis was down
            assert ("events", "master", 5, 8) in catchup.requests
            assert ("events", "w2", 5, 6) in catchup.requests
            assert h.worker.connected

    try:
        run(scenario())
    finally:  # the server is shared with the rest of the session
        if redis_server.proc is None or redis_server.proc.poll() is not None:
            redis_server.start(port=redis_server.port)


def test_a_silent_connection_is_noticed_by_ping(redis_server, catchup):
    """Synapse issue #9010: a connection that died without a FIN must not go unnoticed."""
    channel = unique_channel()

    async def scenario():
        async with FakeWriters(redis_server.url, channel, catchup) as writers, \
                Proxy(redis_server.port) as proxy, \
                Harness(proxy.url, channel, catchup, ping_interval=0.1, ping_timeout=1.5) as h:
            writers.positions[("events", "master")] = 0
            await writers.write("events", "master", 1, ["ev", ["$1"]], publish=False)
            await wait_until(lambda: h.facts, what="the first fact")
            await asyncio.sleep(0.3)  # pings are answered: still the same connection
            assert h.worker.counters["connections"] == 1
            proxy.freeze()
            await writers.write("events", "master", 2, ["ev", ["$2"]])  # lost in the void
            await wait_until(lambda: h.worker.counters.get("connections") == 2, timeout=5,
                             what="a new connection")
            await wait_until(lambda: h.tokens() == [1, 2], what="the lost fact, caught up")
            assert h.worker.counters["ping_timeouts"] == 1

    run(scenario())


# --- the management command --------------------------------------------------------------


@pytest.mark.slow
def test_command_follows_redis_into_a_jsonl_file(redis_server, catchup, tmp_path):
    jsonl = tmp_path / "facts.jsonl"
    channel = unique_channel()

    async def scenario():
        async with FakeWriters(redis_server.url, channel, catchup) as writers:
            for token in (1, 2):
                await writers.write("events", "master", token, ["ev", [f"${token}"]])
            env = {**os.environ, "DJANGO_SETTINGS_MODULE": "synapse_repl.settings",
                   "LOG_LEVEL": "WARNING", "REDIS_URL": ""}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(MANAGE_PY), "replication_worker", "--name", "w9", "--redis",
                "--redis-url", redis_server.url, "--catchup-url", catchup.url,
                "--server-name", channel, "--streams", "events,receipts", "--jsonl", str(jsonl),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
            try:
                await wait_until(lambda: writers.replicates == 1, timeout=15, what="REPLICATE")
                await writers.write("events", "master", 3, ["ev", ["$3"]])
                await writers.write("receipts", "w2", 1, ["!r", "m.read", "@u", "$3", None, {}])
                await wait_until(lambda: len(_jsonl(jsonl)) == 3, what="three lines")
                await asyncio.sleep(2.5)  # past a report of its status (dashboard.worker_status)
            finally:
                proc.send_signal(signal.SIGTERM)
                stdout, stderr = await asyncio.wait_for(proc.communicate(), 10)
            assert proc.returncode == 0, stderr.decode()
            # The worker reports where it stands to the database only: on Synapse's channel it
            # said REPLICATE and nothing else (no NAME, no POSITION of its own, nothing naming it).
            ours = [m for _, m in writers.received if not m.startswith((b"RDATA ", b"POSITION "))]
            assert ours == [b"REPLICATE "], ours
            assert not any(b"w9" in m for _, m in writers.received)
            assert f"redis {redis_server.url} channel {channel!r}" in stdout.decode()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    # receipts/w2 was announced by no POSITION before its RDATA: dropped (the next POSITION
    # of that writer would fetch it), exactly as on TCP.
    assert _jsonl(jsonl) == [("events", "master", t) for t in (1, 2, 3)]
    assert catchup.requests == [("events", "master", 0, 2)]


def test_command_arguments(settings):
    settings.REDIS_URL = ""
    with pytest.raises(CommandError, match="--connect cannot be used with --redis"):
        call_command("replication_worker", "--name", "w", "--redis", "--connect", "127.0.0.1:1")
    with pytest.raises(CommandError, match="--connect cannot be used with --redis"):
        call_command("replication_worker", "--name", "w", "--redis-url", "redis://h",
                     "--connect", "127.0.0.1:1")
    with pytest.raises(CommandError, match="pass --redis-url URL or set REDIS_URL"):
        call_command("replication_worker", "--name", "w", "--redis")
    with pytest.raises(CommandError, match="Redis URL must specify"):
        call_command("replication_worker", "--name", "w", "--redis-url", "http://h:1")


def test_redact_url():
    assert redact_url("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("redis://user:s3cret@h/0") == "redis://user:***@h/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"

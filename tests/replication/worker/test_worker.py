"""ReplicationWorker against a scripted replication server and a fake catch-up endpoint.

Real sockets on 127.0.0.1: the server is an asyncio listener each test drives line by line
(what it sends, when it drops the connection); the catch-up endpoint is ``http.server`` in a
thread, serving pages of a fact log the test controls.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.parse
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches

from replication.worker import tcp_worker as worker_module
from replication.worker.cache_invalidation import DjangoCacheInvalidator
from replication.worker.catchup_client import parse_instance_map
from replication.worker.tcp_worker import ReplicationWorker
from testing.processes import jsonl_records

SERVER_NAME = "test.hs"
MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"


# --- the scripted replication server ---------------------------------------------------------


class Peer:
    """The server's end of one worker connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pings = 0

    async def line(self, timeout: float = 5.0, skip_pings: bool = True) -> str:
        while True:
            raw = await asyncio.wait_for(self.reader.readline(), timeout)
            if not raw:
                raise EOFError("worker closed the connection")
            line = raw.decode().rstrip("\n")
            if skip_pings and line.startswith("PING "):
                self.pings += 1
                continue
            return line

    async def handshake(self, *lines: str, server_name: str = SERVER_NAME) -> list[str]:
        """Read NAME/PING/REPLICATE, then send SERVER, PING and ``lines``."""
        hello = [await self.line(skip_pings=False) for _ in range(3)]
        self.send(f"SERVER {server_name}", "PING 1", *lines)
        return hello

    def send(self, *lines: str) -> None:
        self.writer.write("".join(line + "\n" for line in lines).encode())

    async def listen(self, seconds: float) -> list[str]:
        """Everything but PINGs the worker sends during ``seconds`` (PINGs are counted)."""
        lines, deadline = [], time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = await self.line(left, skip_pings=False)
            except asyncio.TimeoutError:
                break
            if line.startswith("PING "):
                self.pings += 1
            else:
                lines.append(line)
        return lines

    async def closed_by_worker(self, timeout: float = 5.0) -> list[str]:
        lines = []
        while True:
            try:
                lines.append(await self.line(timeout, skip_pings=False))
            except EOFError:
                return lines

    def drop(self) -> None:
        self.writer.close()


class FakeReplicationServer:
    def __init__(self) -> None:
        self.peers: asyncio.Queue[Peer] = asyncio.Queue()
        self._all: list[Peer] = []

    async def __aenter__(self) -> "FakeReplicationServer":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        for peer in self._all:
            peer.drop()
        await self._server.wait_closed()

    async def _accept(self, reader, writer) -> None:
        peer = Peer(reader, writer)
        self._all.append(peer)
        await self.peers.put(peer)

    async def accept(self, timeout: float = 5.0) -> Peer:
        return await asyncio.wait_for(self.peers.get(), timeout)


# --- the fake catch-up endpoint -----------------------------------------------------------


class CatchUpSource:
    """Serves ``get_repl_stream_updates`` pages from ``facts[(stream, writer)]``, like
    Synapse: rows in ``(from, upto]``, whole tokens, limited past ``page_size`` rows; the
    path must end with a transaction ID (404 ``M_UNRECOGNIZED`` without), and an answer is
    kept under its ID: a repeated ID gets the first answer back (``txn_ids``: every ID seen)."""

    PATH = re.compile(r"^/_synapse/replication/get_repl_stream_updates/([^/]+)/([^/]+)$")

    def __init__(self, page_size: int = 100) -> None:
        self.page_size = page_size
        self.facts: dict[tuple[str, str], dict[int, list]] = defaultdict(dict)
        self.requests: list[tuple[str, str, int, int]] = []
        self.txn_ids: list[str] = []
        self.kept: dict[str, dict] = {}
        self.fail_next = 0
        self.delay = 0.0
        self.lock = threading.Lock()

    def add(self, stream: str, writer: str, token: int, *rows) -> None:
        with self.lock:
            self.facts[(stream, writer)][token] = list(rows)

    def page(self, stream: str, writer: str, from_token: int, upto_token: int) -> dict:
        with self.lock:
            facts = self.facts[(stream, writer)]
            updates, limited, upto = [], False, upto_token
            for token in sorted(t for t in facts if from_token < t <= upto_token):
                if len(updates) >= self.page_size:
                    limited, upto = True, updates[-1][0]
                    break
                updates.extend([token, row] for row in facts[token])
            return {"updates": updates, "upto_token": upto, "limited": limited}

    def start(self, port: int = 0) -> str:
        source = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                match = source.PATH.match(url.path)
                request = (match and match[1], query.get("instance_name"),
                           int(query.get("from_token", -1)), int(query.get("upto_token", -1)))
                with source.lock:
                    source.requests.append(request)
                    if match:
                        source.txn_ids.append(match[2])
                    fail = source.fail_next > 0
                    source.fail_next -= fail
                    kept = source.kept.get(match[2]) if match else None
                time.sleep(source.delay)
                if not match:
                    self._reply(404, {"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"})
                elif kept is not None:
                    self._reply(200, kept)
                elif fail:
                    self._reply(502, {"errcode": "M_UNKNOWN", "error": "writer unavailable"})
                else:
                    answer = source.page(*request)
                    with source.lock:
                        answer = source.kept.setdefault(match[2], answer)
                    self._reply(200, answer)

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def catchup():
    source = CatchUpSource()
    source.url = source.start()
    yield source
    source.httpd.shutdown()
    source.httpd.server_close()


# --- helpers ---------------------------------------------------------------------------------


async def wait_until(predicate, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class RecordingHarness:
    """Runs ``self.worker`` (set by a subclass) as a task, recording what it delivers."""

    worker: Any  # a ReplicationWorker or RedisReplicationWorker

    def __init__(self, kwargs: dict) -> None:
        self.facts: list[tuple[str, str, int, list]] = []
        kwargs.setdefault("on_facts", self._record)
        kwargs.setdefault("reconnect_first_delay", 0.05)

    async def _record(self, stream, writer, token, rows) -> None:
        self.facts.append((stream, writer, token, rows))

    def tokens(self, stream: str = "events", writer: str = "master") -> list[int]:
        return [t for s, w, t, _ in self.facts if (s, w) == (stream, writer)]

    async def __aenter__(self) -> "Harness":
        self.task = asyncio.create_task(self.worker.run())
        return self

    async def __aexit__(self, *exc) -> None:
        self.worker.stop()
        await asyncio.wait_for(self.task, 5)


class Harness(RecordingHarness):
    """A worker wired to the fake server and catch-up source."""

    def __init__(self, server, catchup, **kwargs) -> None:
        super().__init__(kwargs)
        self.worker = ReplicationWorker(
            name="w1", host="127.0.0.1", port=server.port, server_name=SERVER_NAME,
            catchup_url=catchup.url, streams=["events", "receipts", "caches", "typing"], **kwargs)


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))


# --- tests -----------------------------------------------------------------------------------


def test_handshake_and_live_rdata(catchup):
    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, catchup) as h:
            peer = await server.accept()
            name, ping, replicate = await peer.handshake(
                "POSITION events master 0 0",
                'RDATA events master 1 ["ev",["$a"]]')
            assert name == "NAME w1"
            assert re.fullmatch(r"PING \d{13}", ping)
            assert replicate == "REPLICATE "
            await wait_until(lambda: h.facts, what="a fact")
            assert h.worker.connected
            assert h.facts == [("events", "master", 1, [["ev", ["$a"]]])]
            assert h.worker.positions() == {("events", "master"): 1}
            assert catchup.requests == []
        assert not h.worker.connected

    run(scenario())


def test_wrong_server_name_is_refused_then_retried(catchup):
    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, catchup) as h:
            peer = await server.accept()
            await peer.handshake("POSITION events master 0 0", 'RDATA events master 1 ["x"]',
                                 server_name="evil.hs")
            assert await peer.closed_by_worker() == ["ERROR Wrong remote"]
            assert h.worker.counters["wrong_remote"] == 1
            assert not h.worker.connected
            second = await server.accept()  # it keeps trying
            await second.handshake()
            await wait_until(lambda: h.worker.connected, what="connected")
            assert h.facts == []

    run(scenario())


def test_batch_rows_are_delivered_together(catchup):
    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, catchup) as h:
            peer = await server.accept()
            await peer.handshake(
                "POSITION receipts master 0 0",
                'RDATA receipts master batch ["!r","m.read","@a","$1",null,{}]',
                'RDATA receipts master batch ["!r","m.read","@b","$1",null,{}]',
                'RDATA receipts master 1 ["!r","m.read","@c","$1",null,{}]',
                'RDATA receipts master 2 ["!r","m.read","@d","$2",null,{}]')
            await wait_until(lambda: len(h.facts) == 2, what="two facts")
            assert [(t, [r[2] for r in rows]) for _, _, t, rows in h.facts] == [
                (1, ["@a", "@b", "@c"]), (2, ["@d"])]

    run(scenario())


def test_gap_is_caught_up_over_http_page_by_page(catchup):
    catchup.page_size = 2
    catchup.delay = 0.1  # live RDATA arrives while the catch-up is in flight
    for token in (1, 2, 4, 5, 7):
        catchup.add("events", "master", token, ["ev", [f"${token}"]])
    catchup.add("events", "master", 4, ["state", ["!r"]], ["ev", ["$4"]])  # one fact, two rows

    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, catchup) as h:
            peer = await server.accept()
            await peer.handshake("POSITION events master 7 7", 'RDATA events master 8 ["ev",["$8"]]')
            await wait_until(lambda: len(h.facts) == 6, what="six facts")
            assert h.tokens() == [1, 2, 4, 5, 7, 8]
            assert h.facts[2][3] == [["state", ["!r"]], ["ev", ["$4"]]]
            # Pages of at least two rows, a token's rows never split: 1-2, 4 (two rows), 5-7.
            assert catchup.requests == [("events", "master", 0, 7), ("events", "master", 2, 7),
                                        ("events", "master", 4, 7)]
            assert h.worker.positions() == {("events", "master"): 8}
            assert h.worker.counters["catch_up_requests"] == 3

    run(scenario())


def test_failed_catch_up_is_retried_until_it_succeeds(catchup):
    catchup.fail_next = 2
    catchup.add("receipts", "master", 3, ["!r", "m.read", "@u", "$3", None, {}])

    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, catchup) as h:
            peer = await server.accept()
            await peer.handshake("POSITION receipts master 3 3")
            await wait_until(lambda: h.facts, what="the caught-up fact")
            assert h.tokens("receipts") == [3]
            assert h.worker.counters["catch_up_failures"] == 2
            assert catchup.requests == [("receipts", "master", 0, 3)] * 3
            await asyncio.sleep(0.2)
            assert len(h.facts) == 1

    run(scenario())


def test_catch_up_from_an_unreachable_writer_is_retried_until_it_comes_up():
    """Nothing listens at the catch-up URL at first (the writer is down): the worker keeps
    retrying with back-off, and fetches the facts once the writer is back."""
    from testing.services import free_port

    port = free_port()
    source = CatchUpSource()
    source.url = f"http://127.0.0.1:{port}"
    source.add("receipts", "master", 3, ["!r", "m.read", "@u", "$3", None, {}])

    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, source) as h:
            peer = await server.accept()
            await peer.handshake("POSITION receipts master 3 3")
            await wait_until(lambda: h.worker.counters.get("catch_up_failures", 0) >= 2, timeout=10,
                             what="two failed catch-ups")
            assert h.facts == [] and h.worker.positions().get(("receipts", "master"), 0) == 0
            source.start(port)  # the writer is back
            await wait_until(lambda: h.facts, timeout=15, what="the caught-up fact")
            assert h.tokens("receipts") == [3]
            assert source.requests == [("receipts", "master", 0, 3)]
            await asyncio.sleep(0.2)
            assert len(h.facts) == 1

    try:
        run(scenario())
    finally:
        if hasattr(source, "httpd"):
            source.httpd.shutdown()
            source.httpd.server_close()


def test_reconnect_after_a_drop_neither_repeats_nor_skips(catchup):
    for token in range(1, 7):
        catchup.add("events", "master", token, ["ev", [f"${token}"]])

    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, catchup) as h:
            peer = await server.accept()
            await peer.handshake("POSITION events master 0 0",
                                 'RDATA events master 1 ["ev",["$1"]]',
                                 'RDATA events master batch ["ev",["$2"]]',
                                 'RDATA events master 2 ["ev",["$2"]]',
                                 'RDATA events master batch ["ev",["half"]]')
            await wait_until(lambda: len(h.facts) == 2, what="two facts")
            peer.drop()  # facts 3-5 are written while the worker is away
            peer = await server.accept()
            await peer.handshake('RDATA events master 5 ["ev",["before POSITION: dropped"]]',
                                 "POSITION events master 5 5",
                                 'RDATA events master 6 ["ev",["$6"]]')
            await wait_until(lambda: len(h.facts) == 6, what="six facts")
            await asyncio.sleep(0.2)
            assert h.tokens() == [1, 2, 3, 4, 5, 6]
            assert [rows for *_, rows in h.facts] == [[["ev", [f"${t}"]]] for t in [1]] + [
                [["ev", ["$2"]], ["ev", ["$2"]]]] + [[["ev", [f"${t}"]]] for t in range(3, 7)]
            assert catchup.requests == [("events", "master", 2, 5)]
            assert h.worker.counters["connections"] == 2

    run(scenario())


def test_every_catch_up_request_has_a_fresh_txn_id(catchup):
    """The catch-up source keeps each answer under its txn_id, as Synapse does: a worker that
    reused an ID would get (0, 3] again for the second gap and skip facts 4-6 silently."""
    for token in (1, 2, 3):
        catchup.add("receipts", "master", token, ["!r", "m.read", "@u", f"${token}", None, {}])

    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, catchup) as h:
            peer = await server.accept()
            await peer.handshake("POSITION receipts master 3 3")
            await wait_until(lambda: len(h.facts) == 3, what="the first three facts")
            peer.drop()
            for token in (4, 5, 6):
                catchup.add("receipts", "master", token, ["!r", "m.read", "@u", f"${token}", None, {}])
            peer = await server.accept()
            await peer.handshake("POSITION receipts master 6 6")
            await wait_until(lambda: len(h.facts) == 6, what="all six facts")
            assert h.tokens("receipts") == [1, 2, 3, 4, 5, 6]
            assert catchup.requests == [("receipts", "master", 0, 3), ("receipts", "master", 3, 6)]
            assert len(set(catchup.txn_ids)) == len(catchup.txn_ids) == 2

    run(scenario())


def test_catch_up_asks_the_writer_named_in_the_instance_map(catchup):
    """instance_urls (REPLICATION_INSTANCE_MAP, --instance-url): w2's facts come from w2's own
    endpoint; writers not in the map from catchup_url."""
    other = CatchUpSource()
    other.url = other.start()
    try:
        catchup.add("receipts", "master", 1, ["!r", "m.read", "@u", "$1", None, {}])
        other.add("receipts", "w2", 2, ["!r", "m.read", "@v", "$2", None, {}])

        async def scenario():
            async with FakeReplicationServer() as server, \
                    Harness(server, catchup, instance_urls={"w2": other.url}) as h:
                peer = await server.accept()
                await peer.handshake("POSITION receipts master 1 1", "POSITION receipts w2 2 2")
                await wait_until(lambda: len(h.facts) == 2, what="a fact of each writer")
                assert sorted((w, t) for _, w, t, _ in h.facts) == [("master", 1), ("w2", 2)]
                assert catchup.requests == [("receipts", "master", 0, 1)]
                assert other.requests == [("receipts", "w2", 0, 2)]

        run(scenario())
    finally:
        other.httpd.shutdown()
        other.httpd.server_close()


def test_parse_instance_map():
    assert parse_instance_map("") == {}
    assert parse_instance_map(" w1=http://10.0.0.1:8000 , w2=https://h:1/prefix") == {
        "w1": "http://10.0.0.1:8000", "w2": "https://h:1/prefix"}
    for bad in ("w1", "w1=", "=http://h:1", "w1=ftp://h", "w1=http://", "w1=http://a:1,w1=http://b:1"):
        with pytest.raises(ValueError):
            parse_instance_map(bad)


def test_caches_rows_invalidate_the_django_cache(catchup):
    cache = caches["default"]
    cache.clear()
    inv = DjangoCacheInvalidator()
    inv.set("get_user_by_id", ["@bob:hs"], "bob")
    inv.set("get_user_by_id", ["@eve:hs"], "eve")
    inv.set("get_rooms_for_user", ["@bob:hs"], ["!a"])
    inv.set("get_rooms_for_user", ["@eve:hs"], ["!b"])
    inv.set("get_event", ["a:b", "c"], 1)
    inv.set("get_event", ["a", "b:c"], 2)
    assert cache.get("get_user_by_id:@bob%3Ahs", version=inv.generation("get_user_by_id")) == "bob"

    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, catchup) as h:
            peer = await server.accept()
            await peer.handshake("POSITION caches master 0 0",
                                 'RDATA caches master 1 ["get_user_by_id",["@bob:hs"],1700000000000]',
                                 'RDATA caches master 2 ["get_rooms_for_user",null,1700000000001]',
                                 'RDATA caches master 3 ["get_event",["a:b","c"],1700000000002]')
            await wait_until(lambda: len(h.facts) == 3, what="three invalidations")

    run(scenario())
    assert inv.get("get_user_by_id", ["@bob:hs"]) is None
    assert inv.get("get_user_by_id", ["@eve:hs"]) == "eve"
    assert inv.get("get_rooms_for_user", ["@bob:hs"]) is None
    assert inv.get("get_rooms_for_user", ["@eve:hs"]) is None
    assert inv.get("get_event", ["a:b", "c"]) is None
    assert inv.get("get_event", ["a", "b:c"]) == 2
    inv.set("get_rooms_for_user", ["@eve:hs"], ["!c"])  # new entries live in the new generation
    assert inv.get("get_rooms_for_user", ["@eve:hs"]) == ["!c"]


def test_slow_callback_does_not_stop_pings_or_other_streams(catchup, monkeypatch):
    monkeypatch.setattr("replication.protocol.connection.PING_INTERVAL", 0.2)
    monkeypatch.setattr(worker_module, "TICK", 0.05)
    delivered = []

    def slow_on_facts(stream, writer, token, rows):  # sync: runs off the event loop
        if stream == "events":
            time.sleep(1.5)
        delivered.append((stream, token))

    async def scenario():
        async with FakeReplicationServer() as server, \
                Harness(server, catchup, on_facts=slow_on_facts) as h:
            peer = await server.accept()
            await peer.handshake("POSITION events master 0 0", "POSITION typing master 0 0",
                                 'RDATA events master 1 ["ev",["$1"]]')
            await asyncio.sleep(0.1)
            peer.send('RDATA typing master 1 ["!r",["@u"]]')
            # While the events callback sleeps, the worker keeps pinging and typing goes on.
            assert await peer.listen(0.8) == []
            assert peer.pings >= 3
            assert delivered == [("typing", 1)]
            assert ("events", "master") not in h.worker.positions()
            await wait_until(lambda: len(delivered) == 2, what="the slow fact")
            assert h.worker.positions()[("events", "master")] == 1

    run(scenario())
    assert delivered == [("typing", 1), ("events", 1)]


def test_silent_server_times_out_and_is_reconnected(catchup, monkeypatch):
    monkeypatch.setattr("replication.protocol.connection.PING_TIMEOUT", 0.3)
    monkeypatch.setattr(worker_module, "TICK", 0.05)

    async def scenario():
        async with FakeReplicationServer() as server, Harness(server, catchup) as h:
            peer = await server.accept()
            await peer.handshake()  # sends one PING, then nothing
            assert "ERROR ping timeout" in await peer.closed_by_worker()
            await server.accept()
            assert h.worker.counters["ping_timeouts"] == 1

    run(scenario())


def test_typing_reset_is_delivered_after_writer_restart(catchup):
    resets = []

    async def scenario():
        async with FakeReplicationServer() as server, \
                Harness(server, catchup, on_reset=lambda s, w: resets.append((s, w))) as h:
            peer = await server.accept()
            await peer.handshake("POSITION typing master 0 0",
                                 'RDATA typing master 1 ["!r",["@u"]]',
                                 'RDATA typing master 2 ["!r",[]]')
            await wait_until(lambda: len(h.facts) == 2, what="two typing facts")
            peer.drop()  # the typing writer restarts: its serial starts again at 0
            peer = await server.accept()
            await peer.handshake("POSITION typing master 0 0", 'RDATA typing master 1 ["!s",["@v"]]')
            await wait_until(lambda: len(h.facts) == 3, what="the fact after the reset")
            assert h.tokens("typing") == [1, 2, 1]
            assert resets == [("typing", "master")]

    run(scenario())


# --- the management command --------------------------------------------------------------


async def _start_command(port: int, catchup_url: str, jsonl: Path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "synapse_repl.settings", "LOG_LEVEL": "WARNING"}
    return await asyncio.create_subprocess_exec(
        sys.executable, str(MANAGE_PY), "replication_worker", "--name", "w9",
        "--connect", f"127.0.0.1:{port}", "--catchup-url", catchup_url,
        "--server-name", SERVER_NAME, "--streams", "events,receipts", "--jsonl", str(jsonl),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)


def _jsonl(path: Path) -> list[tuple[str, str, int]]:
    return [(f["stream"], f["writer"], f["token"]) for f in jsonl_records(path)]


@pytest.mark.slow
def test_command_writes_each_fact_once_and_resumes_from_its_file(catchup, tmp_path):
    jsonl = tmp_path / "facts.jsonl"
    for token in range(1, 5):
        catchup.add("events", "master", token, ["ev", [f"${token}"]])

    async def scenario():
        async with FakeReplicationServer() as server:
            proc = await _start_command(server.port, catchup.url, jsonl)
            peer = await server.accept(timeout=15)
            assert (await peer.handshake("POSITION events master 2 2",
                                         'RDATA events master 3 ["ev",["$3"]]'))[0] == "NAME w9"
            await wait_until(lambda: len(_jsonl(jsonl)) == 3, what="three lines")
            proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 10)
            assert proc.returncode == 0, stderr.decode()

            proc = await _start_command(server.port, catchup.url, jsonl)  # same file: resume
            peer = await server.accept(timeout=15)
            await peer.handshake("POSITION events master 4 4")
            await wait_until(lambda: len(_jsonl(jsonl)) == 4, what="the fourth line")
            proc.send_signal(signal.SIGINT)
            _, stderr = await asyncio.wait_for(proc.communicate(), 10)
            assert proc.returncode == 0, stderr.decode()

    asyncio.run(asyncio.wait_for(scenario(), 40))
    assert _jsonl(jsonl) == [("events", "master", t) for t in (1, 2, 3, 4)]
    assert catchup.requests == [("events", "master", 0, 2), ("events", "master", 3, 4)]


def test_jsonl_sink_timestamps_only_when_asked(tmp_path):
    from synapse_repl.management.commands.replication_worker import JsonlSink

    plain, stamped = JsonlSink(str(tmp_path / "plain.jsonl")), JsonlSink(str(tmp_path / "stamped.jsonl"), True)
    before = time.time()
    for sink in (plain, stamped):
        sink("events", "w1", 7, ["ev", ["$7"]])
        sink.close()
    (p,) = map(json.loads, (tmp_path / "plain.jsonl").read_text().splitlines())
    (s,) = map(json.loads, (tmp_path / "stamped.jsonl").read_text().splitlines())
    assert p == {"stream": "events", "writer": "w1", "token": 7, "rows": ["ev", ["$7"]]}
    assert {k: v for k, v in s.items() if k != "at"} == p
    assert before - 0.001 <= s["at"] <= time.time()
    # A stamped file is resumed from like any other.
    resumed = JsonlSink(str(tmp_path / "stamped.jsonl"))
    resumed.close()
    assert resumed.positions == {("events", "w1"): 7}


def test_command_refuses_an_unreadable_instance_map(settings):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--instance-url: cannot read 'w1'"):
        call_command("replication_worker", "--name", "w", "--instance-url", "w1")
    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "REPLICATION_INSTANCE_MAP": "w1=nowhere"}
    with pytest.raises(CommandError, match="REPLICATION_INSTANCE_MAP: cannot read 'w1=nowhere'"):
        call_command("replication_worker", "--name", "w")

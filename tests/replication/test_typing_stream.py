"""The typing stream (replication/typing_stream.py): the in-memory state, its writer, the relay's rule
for a writer that restarted, and a whole cluster on Redis: the typing writer (the web
process), an endpoint, a raw TCP client and a worker: RDATA arrives live, catch-up is
served from the writer's memory, and a writer restart makes the worker start over."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import time
import urllib.request

import pytest

from replication.http.replication_secret import bearer_header
from replication.protocol.commands import PositionCommand, RdataCommand, parse_line
from replication.typing_stream import TypingRefused, TypingState, TypingWriter
from streams.notifier import PositionNotifier
from streams.writer import WireJournal
from testing.processes import ProcessGroup, jsonl_records, wait_port
from testing.services import free_port
from tests.replication.endpoint.test_endpoint import LineClient

SERVER_NAME = "test.example"
WAIT = 30


# -- the state ---------------------------------------------------------------------------------

def test_changes_get_serials_and_full_rows():
    s = TypingState()
    assert s.set_typing("!r1", "@a", True, 100) == (1, ["!r1", ["@a"]])
    assert s.set_typing("!r1", "@b", True, 100) == (2, ["!r1", ["@a", "@b"]])
    assert s.set_typing("!r1", "@a", True, 500) is None  # already typing: only the timeout moves
    assert s.set_typing("!r2", "@a", False, 0) is None  # not typing: nothing to stop
    assert s.set_typing("!r1", "@a", False, 0) == (3, ["!r1", ["@b"]])
    assert s.set_typing("!r1", "@b", False, 0) == (4, ["!r1", []])  # nobody types: an empty list


def test_expiry_stops_users_whose_timeout_passed():
    s = TypingState()
    s.set_typing("!r1", "@a", True, 100)
    s.set_typing("!r1", "@b", True, 300)
    s.set_typing("!r2", "@c", True, 150)
    assert s.expire(99) == []
    assert s.expire(200) == [(4, ["!r1", ["@b"]]), (5, ["!r2", []])]
    assert s.typing_in("!r1") == ["@b"] and s.typing_in("!r2") == []


def test_updates_since_one_row_per_room_at_its_latest_serial_strict_limit():
    s = TypingState()
    s.set_typing("!r1", "@a", True, 10**9)  # 1
    s.set_typing("!r2", "@a", True, 10**9)  # 2
    s.set_typing("!r1", "@b", True, 10**9)  # 3
    s.set_typing("!r3", "@a", True, 10**9)  # 4
    assert s.updates_since(0, 4, 100).updates == [(2, ["!r2", ["@a"]]), (3, ["!r1", ["@a", "@b"]]),
                                                  (4, ["!r3", ["@a"]])]
    page = s.updates_since(0, 4, 2)
    assert (page.updates, page.upto_token, page.limited) == ([(2, ["!r2", ["@a"]]), (3, ["!r1", ["@a", "@b"]])], 3, True)
    assert s.updates_since(3, 4, 2).updates == [(4, ["!r3", ["@a"]])]
    assert s.updates_since(4, 4, 100).updates == [] and s.updates_since(9, 20, 100).updates == []


def test_state_is_bounded():
    s = TypingState(max_rooms=2, max_users_per_room=2)
    s.set_typing("!r1", "@a", True, 10)
    s.set_typing("!r1", "@b", True, 10)
    with pytest.raises(TypingRefused):
        s.set_typing("!r1", "@c", True, 10)
    s.set_typing("!r2", "@a", True, 10)
    with pytest.raises(TypingRefused):
        s.set_typing("!r3", "@a", True, 10)  # two rooms with someone typing already
    s.set_typing("!r2", "@a", False, 0)
    s.set_typing("!r3", "@a", True, 10)  # r2 is quiet: r3 may come, r2's serial is forgotten
    assert s.rooms() == 2 and [row[0] for _, row in s.updates_since(0, 99, 100).updates] == ["!r1", "!r3"]


def test_writer_announces_changes_in_order_with_their_rows():
    notifier = PositionNotifier()
    advances = []
    notifier.subscribe(advances.append)
    writer = TypingWriter("tw", notifier, clock=lambda: 1000.0, expiry_interval=None)
    writer.journal = WireJournal()
    writer.announce()
    writer.apply([("!r1", "@a", True, 30_000), ("!r1", "@b", True, 30_000)])
    writer.set_typing("!r1", "@a", True)  # no change: no advance
    writer.set_typing("!r1", "@a", False)
    assert [(a.stream_name, a.instance_name, a.prev_token, a.new_token) for a in advances] == [
        ("typing", "tw", 0, 0), ("typing", "tw", 0, 2), ("typing", "tw", 2, 3)]
    # each advance carries the rows of its changes (the journal keeps them until then)
    assert [list(a.facts) for a in advances] == [[], [(1, [["!r1", ["@a"]]]), (2, [["!r1", ["@a", "@b"]]])],
                                                 [(3, [["!r1", ["@b"]]])]]
    assert len(writer.journal) == 0
    writer.clock = lambda: 1031.0  # @b's 30 s are over
    assert writer.expire() == 1
    assert advances[-1].new_token == 4 and writer.updates_since(3, 4, 10).updates == [(4, ["!r1", []])]


# -- the relay ---------------------------------------------------------------------------------

def test_relay_passes_a_typing_writer_restart_on_as_a_position_below():
    from replication.endpoint.relay import ReplicationRelay
    from replication.protocol.line_batch import WriterRun

    async def run() -> list[str]:
        relay = ReplicationRelay(poll_interval=3600)
        sent: list[str] = []

        async def deliver(seq, batch):
            sent.extend(batch.data.decode().splitlines())

        relay.attach("c", deliver)

        def batch(stream, prev, new, *lines):
            # as a writer publishes it, read back as the relay reads it
            return WriterRun.from_message({"stream": stream, "writer": "tw", "prev": prev, "new": new,
                                           "data": "".join(line + "\n" for line in lines).encode(),
                                           "count": len(lines)})

        # first heard: where it starts, then the rows
        await relay.on_run(batch("typing", 0, 2, 'RDATA typing tw 2 ["!r",["@a"]]'))
        await relay.on_run(batch("typing", 2, 3, 'RDATA typing tw 3 ["!r",[]]'))  # contiguous: relayed
        await relay.on_run(batch("typing", 0, 1, 'RDATA typing tw 1 ["!r",["@b"]]'))  # the writer restarted
        await relay.on_run(batch("typing", 1, 2, 'RDATA typing tw 2 ["!r",[]]'))
        await relay.on_run(batch("receipts", 0, 5, "POSITION receipts tw 0 5"))
        await relay.on_run(batch("receipts", 0, 3, "POSITION receipts tw 0 3"))  # old news: dropped
        return sent

    # The first batch heard is passed on after a POSITION where it starts: a bare POSITION at
    # its end made a worker that never heard of the writer start there and skip its rows
    # (the embedded default lost each run's first typing change).
    assert asyncio.run(run()) == [
        "POSITION typing tw 0 0", 'RDATA typing tw 2 ["!r",["@a"]]',
        'RDATA typing tw 3 ["!r",[]]', "POSITION typing tw 0 0",
        'RDATA typing tw 1 ["!r",["@b"]]', 'RDATA typing tw 2 ["!r",[]]', "POSITION receipts tw 5 5"]


# -- a cluster ---------------------------------------------------------------------------------

class TypingCluster(ProcessGroup):
    def __init__(self, pg_url, tmp, redis_url) -> None:
        super().__init__(tmp)
        self.env = {**os.environ, "DATABASE_URL": pg_url, "SERVER_NAME": SERVER_NAME,
                    "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
        self.repl_port, self.web_port = free_port(), free_port()
        try:  # an endpoint left running by a web process that did not start would load the rest of the run
            self.endpoint = self.start("endpoint", "manage.py", "runreplication", "--listen",
                                       f"127.0.0.1:{self.repl_port}")
            wait_port(self.repl_port, self.endpoint, tmp / "endpoint.log")
            self.start_web()
        except BaseException:
            self.stop()
            raise

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def start_web(self) -> None:
        self.web = self.start("web", "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port),
                              "synapse_repl.asgi:application")
        wait_port(self.web_port, self.web, self.tmp / "web.log")

    def write_typing(self, count: int, seed: int) -> str:
        """``write_facts typing`` against the web process, run in this process (what it sends
        goes over HTTP either way; a process of its own would only add its start-up)."""
        import io

        from django.core.management import call_command

        out = io.StringIO()
        call_command("write_facts", "typing", "--count", str(count), "--per-txn", "2", "--seed", str(seed),
                     "--url", self.web_url, "--no-progress", stdout=out)
        return out.getvalue().strip().splitlines()[-1]

    def catch_up(self, from_token: int, upto_token: int) -> dict:
        from django.conf import settings

        url = (f"{self.web_url}/_synapse/replication/get_repl_stream_updates/typing/{secrets.token_hex(5)}"
               f"?instance_name=master&from_token={from_token}&upto_token={upto_token}")
        request = urllib.request.Request(url, headers=bearer_header(settings.REPLICATION_SECRET))
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())


@pytest.fixture
def typing_cluster(pg_url, tmp_path, redis_server):
    c = TypingCluster(pg_url, tmp_path, redis_server.url)
    yield c
    c.stop()


def rdata_until(client: LineClient, token: int) -> list[RdataCommand | PositionCommand]:
    got = []
    deadline = time.monotonic() + WAIT
    while True:
        cmd = parse_line(client.read_line(max(0.1, deadline - time.monotonic())))
        if isinstance(cmd, (RdataCommand, PositionCommand)) and cmd.stream_name == "typing":
            got.append(cmd)
            if isinstance(cmd, RdataCommand) and cmd.token == token:
                return got


@pytest.mark.django_db(transaction=True)
def test_typing_reaches_a_tcp_worker_live_and_through_catch_up(typing_cluster):
    c = typing_cluster
    assert c.write_typing(6, seed=1).endswith("position 6")  # before any worker: catch-up's job
    expected = c.catch_up(0, 6)
    assert not expected["limited"] and expected["updates"] and all(t <= 6 for t, _ in expected["updates"])

    raw = LineClient(c.repl_port)
    raw.send("NAME raw", "REPLICATE ")
    jsonl = c.tmp / "worker.jsonl"
    c.start("worker", "manage.py", "replication_worker", "--name", "worker", "--connect",
            f"127.0.0.1:{c.repl_port}", "--catchup-url", c.web_url, "--server-name", SERVER_NAME,
            "--streams", "typing", "--jsonl", str(jsonl))

    def typing_facts():
        return [(f["token"], f["rows"]) for f in jsonl_records(jsonl) if f["stream"] == "typing"]

    def wait(predicate, what):
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        pytest.fail(f"{what}; worker has {typing_facts()}; log {(c.tmp / 'worker.log').read_text()[-1500:]}")

    # Everything written before it connected came through catch-up, from the writer's memory.
    wait(lambda: typing_facts() == [(t, [row]) for t, row in expected["updates"]], "caught up")

    assert c.write_typing(3, seed=2).endswith("position 9")
    live = rdata_until(raw, 9)
    assert [cmd.token for cmd in live if isinstance(cmd, RdataCommand)] == [7, 8, 9]
    wait(lambda: [t for t, _ in typing_facts()][-3:] == [7, 8, 9], "RDATA 7-9 delivered")
    assert [rows for t, rows in typing_facts() if t > 6] == [[cmd.row] for cmd in live if isinstance(cmd, RdataCommand)]

    # The writer restarts: its serials start again from 0, and the worker starts over.
    c.web.send_signal(signal.SIGTERM)
    c.web.wait(timeout=15)
    c.start_web()
    assert c.write_typing(1, seed=3).endswith("position 1")
    after = rdata_until(raw, 1)
    assert any(isinstance(cmd, PositionCommand) and cmd.new_token == 0 for cmd in after)
    wait(lambda: typing_facts()[-1][0] == 1, "the worker took token 1 after the restart")
    raw.close()


def test_only_the_typing_writer_takes_changes():
    from streams.id_generator import NotAWriter
    from streams.runtime import StreamRuntime

    with pytest.raises(NotAWriter, match="not the writer of typing"):
        StreamRuntime(instance_name="w2", writers={"typing": ("master",)}).typing()


@pytest.mark.django_db
@pytest.mark.parametrize("body, message", [
    (b"not json", "not JSON"),
    (b'{"updates": []}', "at least one change"),
    (b'{"updates": [{"room_id": "r", "user_id": "@u:hs", "typing": true}]}', "room_id"),
    (b'{"updates": [{"room_id": "!r:hs", "user_id": "@u:hs\\u0000", "typing": true}]}', "user_id"),
    (b'{"updates": [{"room_id": "!r:hs", "user_id": "@u:hs", "typing": 1}]}', "typing must be"),
    (b'{"updates": [{"room_id": "!r:hs", "user_id": "@u:hs", "typing": true, "timeout": -1}]}', "timeout"),
])
def test_typing_view_refuses_bad_bodies(client, settings, body, message):
    response = client.post("/_synapse/replication/typing", body, content_type="application/json",
                           headers=bearer_header(settings.REPLICATION_SECRET))
    assert response.status_code == 400 and message in response.json()["error"]


@pytest.mark.django_db
def test_typing_view_and_catch_up_in_this_process(client, settings):
    from streams.runtime import runtime

    auth = bearer_header(settings.REPLICATION_SECRET)
    assert client.post("/_synapse/replication/typing", b"{}", content_type="application/json").status_code == 401
    start = runtime().typing().current_token
    body = {"updates": [{"room_id": "!v:hs", "user_id": "@a:hs", "typing": True},
                        {"room_id": "!v:hs", "user_id": "@b:hs", "typing": True, "timeout": 10**9}]}
    answer = client.post("/_synapse/replication/typing", json.dumps(body), content_type="application/json",
                         headers=auth).json()
    assert answer == {"stream_id": start + 2, "writer": runtime().instance_name}
    page = client.get(f"/_synapse/replication/get_repl_stream_updates/typing/txn{start}?from_token={start}"
                      f"&upto_token={start + 2}", headers=auth).json()
    assert page == {"updates": [[start + 2, ["!v:hs", ["@a:hs", "@b:hs"]]]], "upto_token": start + 2, "limited": False}


@pytest.mark.django_db(transaction=True)
def test_typing_in_the_endpoints_own_process_reaches_a_tcp_worker():
    """The embedded default's shape (no Redis): the endpoint runs in the typing writer's
    process, and the in-memory layer carries the typing RDATA to its TCP connections."""
    from asgiref.sync import sync_to_async
    from django.apps import apps
    from django.conf import settings

    from replication.endpoint.server import start_endpoint
    from streams.runtime import runtime

    assert not settings.REDIS_URL
    config = apps.get_app_config("streams")
    old_runtime, config.runtime = getattr(config, "runtime", None), None
    port = free_port()

    async def run() -> list[str]:
        streams = await sync_to_async(runtime, thread_sensitive=False)()
        endpoint, server = await start_endpoint("127.0.0.1", port, streams=streams)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"NAME embedded-worker\nREPLICATE \n")
            await writer.drain()
            typing = await sync_to_async(runtime().typing, thread_sensitive=False)()
            await sync_to_async(typing.apply, thread_sensitive=False)(
                [("!e:hs", "@a:hs", True, 30_000), ("!e:hs", "@b:hs", True, 30_000)])
            lines: list[str] = []
            while not any(line.startswith("RDATA typing") and " 2 " in line for line in lines):
                line = await asyncio.wait_for(reader.readline(), WAIT)
                assert line, f"connection closed after {lines}"
                lines.append(line.decode().rstrip("\n"))
            writer.close()
            return [line for line in lines if " typing " in line]
        finally:
            server.close()
            await endpoint.relay.stop()
            await endpoint.broadcast.stop()
            await endpoint.user_ips.stop()
            if config.runtime is not None:  # its streamer publishes from this loop: stop it here
                await sync_to_async(config.runtime.close, thread_sensitive=False)()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

    try:
        lines = asyncio.run(run())
    finally:
        config.runtime = old_runtime
    assert lines[-2:] == ['RDATA typing master 1 ["!e:hs",["@a:hs"]]', 'RDATA typing master 2 ["!e:hs",["@a:hs","@b:hs"]]']

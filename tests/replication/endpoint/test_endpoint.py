"""The TCP replication endpoint (``manage.py runreplication``) as a real process on a real
socket, against the throwaway PostgreSQL: handshake, RDATA/POSITION for facts written by
another process, bad input, congestion, USER_SYNC, the legacy protocol generation."""
from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replication.protocol.commands import PositionCommand, RdataCommand, parse_line
from rooms.models import CurrentStateDelta, Event
from streams.conf import stream_writers
from streams.models import Receipt
from streams.runtime import StreamRuntime
from testing.processes import database_url, stop_process, wait_port
from testing.services import free_port

ROOT = Path(__file__).resolve().parents[3]
SERVER_NAME = "test.example"
pytestmark = pytest.mark.django_db(transaction=True)


class LineClient:
    """A netcat-like client: send lines, read lines."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.closed = False

    def send(self, *lines: str) -> None:
        self.sock.sendall("".join(line + "\n" for line in lines).encode())

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_line(self, timeout: float = 10.0) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no line within {timeout} s; buffered {self.buf[:200]!r}")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def read_until(self, predicate, timeout: float = 10.0) -> list[str]:
        lines = []
        while True:
            line = self.read_line(timeout)
            if line is None:
                raise AssertionError(f"connection closed; got {lines[-5:]}")
            lines.append(line)
            if predicate(line):
                return lines

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def endpoint_process(pg_url: str, log_path: Path, redis_url: str):
    """``runreplication`` on a free port; yields (port, its log opened for reading)."""
    port = free_port()
    log = open(log_path, "w+")
    env = dict(os.environ, DATABASE_URL=pg_url, SERVER_NAME=SERVER_NAME, POSITION_POLL_SECONDS="0.05",
               STREAM_WRITERS="events=master,w2;receipts=master,w2", PYTHONUNBUFFERED="1",
               REDIS_URL=redis_url)
    proc = subprocess.Popen([sys.executable, "manage.py", "runreplication", "--listen", f"127.0.0.1:{port}"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc, log_path)
        yield port, log
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture
def endpoint(pg_url, tmp_path, redis_server):
    """An endpoint of the test's own, for the tests that write facts: it starts from the
    database as the test left it."""
    with endpoint_process(pg_url, tmp_path / "endpoint.log", redis_server.url) as running:
        yield running


@pytest.fixture(scope="module")
def protocol_endpoint(django_db_setup, django_db_blocker, tmp_path_factory, redis_server):
    """One endpoint for the module's tests that only speak the protocol (handshake, bad input,
    USER_SYNC) and write no fact: what each proves does not depend on a fresh process, and
    each would otherwise pay its start-up."""
    with endpoint_process(database_url(), tmp_path_factory.mktemp("endpoint") / "endpoint.log",
                          redis_server.url) as running:
        yield running


@pytest.fixture
def writer_runtime(redis_server):
    """A writer in this process publishing its lines through Redis, as writer processes do."""
    from channels_redis.pubsub import RedisPubSubChannelLayer

    rt = StreamRuntime(instance_name="master", writers=stream_writers("events=master,w2;receipts=master,w2"))
    rt.stream_replication(layer=RedisPubSubChannelLayer(hosts=[redis_server.url]))
    yield rt
    rt.close()


def handshake(port: int) -> LineClient:
    c = LineClient(port)
    assert c.read_line() == f"SERVER {SERVER_NAME}"
    assert c.read_line().startswith("PING ")
    c.send("NAME test-worker", "PING 1", "REPLICATE ")
    return c


def test_handshake_announces_every_stream_and_writer(protocol_endpoint):
    port, _ = protocol_endpoint
    c = handshake(port)
    expected = {("events", "master"), ("events", "w2"), ("backfill", "master"), ("backfill", "w2"),
                ("receipts", "master"), ("receipts", "w2"), ("account_data", "master"),
                ("to_device", "master")}
    announced: dict[tuple[str, str], PositionCommand] = {}
    while not expected <= set(announced):
        cmd = parse_line(c.read_line())
        if isinstance(cmd, PositionCommand):
            announced[(cmd.stream_name, cmd.instance_name)] = cmd
    assert all(cmd.prev_token == cmd.new_token for cmd in announced.values())
    c.close()


def test_facts_from_another_process_arrive_as_rdata(endpoint, writer_runtime):
    port, _ = endpoint
    c = handshake(port)
    c.read_until(lambda line: line.startswith("POSITION to_device"))
    rng = random.Random(1)
    ids = writer_runtime.writer("receipts").append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(3)])
    # A multi-row fact: an event and its state delta share one stream ID.
    ev = Event.synthetic(rng, 0) | {"type": "m.room.name", "state_key": ""}
    (ev_id,) = writer_runtime.writer("events").append([[
        (Event, ev),
        (CurrentStateDelta, {"room_id": ev["room_id"], "type": "m.room.name", "state_key": "", "event_id": ev["event_id"]}),
    ]])
    got = []
    while len([x for x in got if x.token is not None]) < 4:
        cmd = parse_line(c.read_line())
        if isinstance(cmd, RdataCommand):
            got.append(cmd)
    receipts = [cmd for cmd in got if cmd.stream_name == "receipts"]
    assert [(cmd.instance_name, cmd.token) for cmd in receipts] == [("master", i) for i in ids]
    events = [cmd for cmd in got if cmd.stream_name == "events"]
    assert [cmd.token for cmd in events] == [None, ev_id]  # batch, then the fact's token
    assert events[0].row == ["ev", [ev["event_id"], ev["room_id"], "m.room.name", "", None, None, None, False, False]]
    assert events[1].row == ["state", [ev["room_id"], "m.room.name", "", ev["event_id"]]]
    c.close()


def test_position_without_rows(endpoint, writer_runtime):
    """A rolled-back fact advances the position with no row: POSITION, not RDATA."""
    port, _ = endpoint
    c = handshake(port)
    c.read_until(lambda line: line.startswith("POSITION to_device"))
    gen = writer_runtime.generator("account_data")
    before = gen.get_current_token_for_writer("master")
    with pytest.raises(RuntimeError):
        with writer_runtime.writer("account_data").transaction(2):
            raise RuntimeError("rolled back")
    # Nothing was recorded in stream_positions for a failed write; a later write is.
    from streams.models import AccountData

    (sid,) = writer_runtime.writer("account_data").append([[(AccountData, AccountData.synthetic(random.Random(), 0))]])
    assert sid == before + 3
    lines = c.read_until(lambda line: "account_data" in line and line.startswith("RDATA"))
    rdata = parse_line(lines[-1])
    assert rdata.token == sid
    c.close()


@pytest.mark.parametrize("bad, error", [
    ("FOO bar", "ERROR failed to parse line"),
    ("RDATA events master 5 []", "ERROR invalid command: RDATA"),
    ("POSITION caches w1 5", "ERROR failed to parse line"),
    ("USER_SYNC abcde @u:hs DEV pause 1", "ERROR failed to parse line"),
])
def test_bad_lines_get_error_and_close_others_unaffected(protocol_endpoint, bad, error):
    port, log = protocol_endpoint
    other = handshake(port)
    c = handshake(port)
    c.send(bad)
    lines = c.read_until(lambda line: line.startswith("ERROR"))
    assert lines[-1].startswith(error)
    assert c.read_line(timeout=5) is None or c.read_line(timeout=5) is None  # closed
    # The server keeps serving everyone else.
    other.send("PING 2")
    third = handshake(port)
    third.close()
    other.close()


def test_blank_lines_are_ignored_and_long_lines_rejected(protocol_endpoint):
    port, _ = protocol_endpoint
    c = handshake(port)
    c.send("", "   ", "PING 3")
    c.send_raw(b"PING " + b"x" * 20000 + b"\n")
    lines = c.read_until(lambda line: line.startswith("ERROR"))
    assert lines[-1] == "ERROR Line length exceeded"
    c.close()


def test_half_line_then_disconnect_does_not_hurt_server(protocol_endpoint):
    port, _ = protocol_endpoint
    c = LineClient(port)
    c.send_raw(b"REPLIC")
    c.close()
    c2 = handshake(port)
    c2.close()


def test_congested_worker_is_disconnected(endpoint, writer_runtime):
    port, log = endpoint
    c = handshake(port)
    c.read_until(lambda line: line.startswith("POSITION to_device"))
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    rng = random.Random(2)
    w = writer_runtime.writer("receipts")
    for _ in range(40):  # 40,000 facts that the client never reads
        w.append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(1000)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        log.seek(0)
        if "disconnected: failed to keep up" in log.read():
            break
        time.sleep(0.2)
    else:
        log.seek(0)
        pytest.fail("worker was not disconnected for congestion:\n" + log.read()[-2000:])
    # The endpoint still serves new connections.
    handshake(port).close()
    c.close()


def test_netcat_transcript_legacy_generation(endpoint, writer_runtime):
    port, _ = endpoint
    rng = random.Random(3)
    ids = writer_runtime.writer("receipts").append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(3)])
    time.sleep(0.3)  # let the endpoint see the new position
    c = LineClient(port)
    assert c.read_line() == f"SERVER {SERVER_NAME}"
    c.read_line()
    c.send(f"REPLICATE receipts {ids[0]}")
    lines = c.read_until(lambda line: line.startswith("POSITION receipts"))
    rdata = [line.split(" ", 3) for line in lines if line.startswith("RDATA")]
    assert [(r[1], int(r[2])) for r in rdata] == [("receipts", ids[1]), ("receipts", ids[2])]
    assert lines[-1] == f"POSITION receipts {ids[2]}"
    # ...then live, in the same format.
    (new_id,) = writer_runtime.writer("receipts").append([[(Receipt, Receipt.synthetic(rng, 9))]])
    line = c.read_until(lambda line: line.startswith("RDATA"))[-1]
    assert line.startswith(f"RDATA receipts {new_id} [")
    c.close()


def test_user_sync_kept_per_connection(protocol_endpoint):
    """USER_SYNC is accepted (and CLEAR_USER_SYNC); the connection stays up."""
    port, _ = protocol_endpoint
    c = handshake(port)
    c.send("USER_SYNC abcde @u:hs None start 1700000000000", "USER_SYNC abcde @v:hs DEV start 1",
           "USER_SYNC abcde @u:hs None end 2", "CLEAR_USER_SYNC abcde", "FEDERATION_ACK fed1 12",
           'USER_IP @u:hs ["tok","1.2.3.4","UA",null,1700000000000]', "PING 5")
    c.send("NAME still-here")
    time.sleep(0.3)
    c.send("PING 6")
    c.sock.settimeout(0.5)
    with pytest.raises((TimeoutError, socket.timeout)):
        c.read_until(lambda line: line.startswith("ERROR"), timeout=0.5)
    c.close()

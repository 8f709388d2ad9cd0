"""The endpoint's limits as an attacker would try them: ``runreplication`` as a real process
on a real socket. Commands whose cost a plain rate limit does not see (a legacy ``REPLICATE``
storm, long user IDs, a NAME with a NUL byte) and connections that squat the caps (idle
connections, a byte a second). Each test fails on an endpoint without these limits."""
from __future__ import annotations

import random
import socket
import time
from datetime import datetime, timezone

import pytest

from replication.endpoint.legacy import PAGE_ROWS
from streams.conf import stream_writers
from streams.models import Receipt
from streams.runtime import StreamRuntime
from testing.processes import database_url
from tests.replication.endpoint.test_endpoint import SERVER_NAME, LineClient, handshake
from tests.replication.endpoint.test_limits import connect_from, running_endpoint, wait_for_log

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def short_timeouts_endpoint(django_db_setup, tmp_path_factory):
    """One endpoint with a 2 s handshake deadline and a 2 s line deadline, for the tests that
    each close one misbehaving connection and read nothing cumulative (counters, connection
    lists) back: one process start instead of one each."""
    with running_endpoint(database_url(), tmp_path_factory.mktemp("attackers") / "endpoint.log",
                          REPLICATION_HANDSHAKE_TIMEOUT="2", REPLICATION_LINE_TIMEOUT="2") as running:
        yield running


def snapshot_after(port: int, since: datetime, predicate=lambda snapshot: True, timeout: float = 20) -> dict:
    """The first snapshot the endpoint on ``port`` published (dashboard_endpoint_status)
    after ``since`` that satisfies ``predicate`` (the module's shared endpoint publishes its
    own row beside it)."""
    from dashboard.models import EndpointStatus

    deadline = time.monotonic() + timeout
    while True:
        row = EndpointStatus.objects.filter(endpoint__endswith=f":{port}", updated_at__gt=since).first()
        if row is not None and predicate(row.snapshot):
            return row.snapshot
        assert time.monotonic() < deadline, f"no such snapshot published: {row and row.snapshot}"
        time.sleep(0.1)


def read_all(client: LineClient, timeout: float = 10) -> list[str]:
    lines = []
    while (line := client.read_line(timeout)) is not None:
        lines.append(line)
    return lines


def small_receive_buffer_client(port: int) -> LineClient:
    """A client that will not read: its receive buffer is small, so back-pressure comes soon."""
    client = LineClient.__new__(LineClient)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    client.sock, client.buf, client.closed = sock, b"", False
    return client


def test_legacy_replicate_storm_is_paged_and_throttled_while_a_worker_connects(pg_url, tmp_path):
    """4 connections x 25 ``REPLICATE receipts 0`` against 10,000 receipts, never reading, and
    one that sends 60: each connection has one read in flight for the stream (the others were
    replaced), reads a page only once the last one left (its queue never holds more than a
    page), the 60-line one is refused for its cost, the reads end with the connections, and a
    worker connecting meanwhile gets its POSITION lines. Before: every line read the whole
    history into memory, and the storm connections were sent everything they did not read."""
    history = 10_000
    rt = StreamRuntime(instance_name="master", writers=stream_writers("receipts=master"))
    rng = random.Random(14)
    try:
        ids = []
        for chunk in range(history // 1000):
            ids += rt.writer("receipts").append(
                [[(Receipt, Receipt.synthetic(rng, chunk * 1000 + i))] for i in range(1000)])
    finally:
        rt.close()
    with running_endpoint(pg_url, tmp_path / "endpoint.log", STREAM_WRITERS="receipts=master",
                          REPLICATION_SEND_BUFFER_BYTES="16384") as (port, read_log):
        storm = []
        for i in range(4):
            c = small_receive_buffer_client(port)
            c.send(f"NAME storm{i}", *["REPLICATE receipts 0"] * 25)
            storm.append(c)
        flooder = small_receive_buffer_client(port)
        flooder.send("NAME flooder", *["REPLICATE receipts 0"] * 60)
        # A healthy worker connects meanwhile and is served.
        started = time.monotonic()
        worker = handshake(port)
        worker.read_until(lambda line: line.startswith("POSITION receipts master"))
        first_position = time.monotonic() - started
        assert "disconnected: command rate exceeded" in wait_for_log(read_log, "command rate exceeded")
        t0 = datetime.now(timezone.utc)

        def storm_paused(snapshot):
            queues = {c["name"]: c for c in snapshot["connections"] if c["name"].startswith("storm")}
            reads = snapshot["history_reads"]
            return len(queues) == 4 and all(c["outbound_queue"] > 0 for c in queues.values()) \
                and reads.get("started", 0) >= 4 * 25

        snapshot = snapshot_after(port, t0, storm_paused)
        reads = snapshot["history_reads"]
        # One read in flight per stream and connection: 25 lines, 24 replaced, for each.
        # The flooder: NAME and 49 of them fit the burst of 5000, one more per 100 ms the
        # endpoint took to get through its lines (the bucket refills at 1000/s; a loaded
        # machine made it 50); never all 60.
        flooder_reads = reads["started"] - 4 * 25
        assert 49 <= flooder_reads < 60, reads
        assert reads["replaced"] == 4 * 24 + flooder_reads - 1
        assert reads["most_active"] <= 5
        # Paged under back-pressure: no storm connection has more than a page waiting for it,
        # and none was sent the whole history.
        queues = [c["outbound_queue"] for c in snapshot["connections"] if c["name"].startswith("storm")]
        assert max(queues) <= PAGE_ROWS + 10, queues
        assert reads["rows"] < 4 * history
        assert "failed to keep up" not in read_log()
        for c in storm:
            c.close()
        t1 = datetime.now(timezone.utc)
        done = snapshot_after(port, t1, lambda s: not s["connections"] or all(
            c["name"] == "test-worker" for c in s["connections"]))
        ended = done["history_reads"]
        assert ended["active"] == 0 and ended["cancelled"] == 5  # one per connection, with it
        assert ended["started"] == ended["replaced"] + ended["cancelled"] + ended.get("completed", 0)
        # A reader that does read gets every row once, in order, then the position.
        reader = LineClient(port)
        reader.send("REPLICATE receipts 0")
        lines = reader.read_until(lambda line: line.startswith("POSITION receipts"), timeout=30)
        tokens = [int(line.split(" ", 3)[2]) for line in lines if line.startswith("RDATA")]
        assert tokens == ids and lines[-1] == f"POSITION receipts {ids[-1]}"
        reader.close()
        worker.close()
        print(f"worker's first POSITION after {first_position * 1000:.1f} ms during the storm; {reads}")


def test_user_ip_with_a_16_kb_user_id_is_refused(short_timeouts_endpoint):
    port, read_log = short_timeouts_endpoint
    c = handshake(port)
    c.send('USER_IP @' + "u" * 16_000 + ':hs ["tok","1.2.3.4","UA",null,1700000000000]')
    lines = read_all(c)
    assert lines[-1].startswith("ERROR invalid USER_IP: user ID '@uuu"), lines[-1][:200]
    assert "longer than 255 bytes" in lines[-1] and len(lines[-1]) < 200
    assert "disconnected: bad line" in wait_for_log(read_log, "disconnected: bad line")


def test_syncing_users_are_capped_per_connection(pg_url, tmp_path):
    with running_endpoint(pg_url, tmp_path / "endpoint.log",
                          REPLICATION_MAX_SYNCING_USERS_PER_CONNECTION="100") as (port, read_log):
        c = handshake(port)
        c.send(*[f"USER_SYNC abcde @user{n}:hs DEV start 1" for n in range(1000)])
        c.send("NAME syncer")
        t0 = datetime.now(timezone.utc)
        snapshot = snapshot_after(port, t0, lambda s: any(x["name"] == "syncer" for x in s["connections"]))
        (conn,) = snapshot["connections"]
        assert conn["syncing_user_count"] == 100  # and the connection is still there
        assert "syncing users over the cap" in read_log()
        c.close()


def test_name_with_nul_is_refused_and_the_endpoint_status_stays_writable(pg_url, tmp_path):
    """A NAME with a NUL byte made every later status write fail on PostgreSQL (a JSON string
    cannot hold \\u0000), so /metrics said the endpoint was down."""
    with running_endpoint(pg_url, tmp_path / "endpoint.log") as (port, read_log):
        bad = LineClient(port)
        bad.send("NAME evil\x00name", "PING 1", "REPLICATE ")
        lines = read_all(bad)
        assert lines[-1] == "ERROR invalid NAME: name 'evil\\x00name': contains control or non-printable characters"
        good = handshake(port)
        good.send("NAME good-worker")
        t0 = datetime.now(timezone.utc)
        snapshot = snapshot_after(port, t0, lambda s: [c["name"] for c in s["connections"]] == ["good-worker"])
        assert snapshot["counters"]["disconnects"] == {"bad line": 1}
        assert "could not record the endpoint status" not in read_log()
        good.close()


def test_300_idle_connections_from_one_address_and_a_worker_still_connects(pg_url, tmp_path):
    """With the default caps (200 per address): each newcomer takes the place of the oldest
    connection still in its handshake, so the worker is admitted, and nothing takes its place."""
    with running_endpoint(pg_url, tmp_path / "endpoint.log") as (port, read_log):
        idle = [connect_from("127.0.0.1", port) for _ in range(300)]
        worker = connect_from("127.0.0.1", port)
        assert worker.read_line() == f"SERVER {SERVER_NAME}"
        worker.send("NAME worker", "PING 1", "REPLICATE ")
        worker.read_until(lambda line: line.startswith("POSITION to_device"))
        more = [connect_from("127.0.0.1", port) for _ in range(20)]  # squatters keep coming
        t0 = datetime.now(timezone.utc)
        snapshot = snapshot_after(port, t0, lambda s: s["counters"]["disconnects"].get("evicted") == 300 + 1 + 20 - 200)
        names = [c["name"] for c in snapshot["connections"]]
        assert len(names) == 200 and names.count("worker") == 1  # the oldest squatters went, never the worker
        assert read_all(idle[0])[-1] == "ERROR Too many connections"  # the oldest went first
        worker.send("PING 2")
        with pytest.raises(TimeoutError):  # still connected, nothing to say
            while (line := worker.read_line(timeout=0.5)) is not None:
                assert line.startswith(("PING", "POSITION")), line  # the rest of REPLICATE's answer
        for c in idle + more + [worker]:
            c.close()


def test_a_peer_that_never_subscribes_is_closed_at_the_handshake_deadline(short_timeouts_endpoint):
    port, read_log = short_timeouts_endpoint
    squatter = LineClient(port)
    squatter.send("NAME squatter", "PING 1")  # but no REPLICATE
    worker = handshake(port)
    lines = read_all(squatter, timeout=15)
    assert lines[-1] == "ERROR handshake timeout"
    assert "disconnected: handshake timeout" in wait_for_log(read_log, "handshake timeout")
    worker.send("PING 2")  # the worker, which subscribed at once, stays
    worker.read_until(lambda line: line.startswith("POSITION to_device"))
    worker.close()


def test_a_byte_a_second_slow_loris_is_closed(short_timeouts_endpoint):
    """A subscribed peer that sends a line a byte at a time (each byte well within the ping
    timeout) is closed once the line has been arriving for REPLICATION_LINE_TIMEOUT."""
    port, read_log = short_timeouts_endpoint
    loris = handshake(port)
    loris.read_until(lambda line: line.startswith("POSITION to_device"))
    sent = 0
    deadline = time.monotonic() + 15
    error = None
    for byte in (b"USER_SYNC abcde @u:hs DEV start 1" * 10):
        assert time.monotonic() < deadline, "the slow line was never cut off"
        try:
            loris.send_raw(bytes([byte]))
            sent += 1
            line = loris.read_line(timeout=0.5)
        except TimeoutError:
            continue
        except OSError:
            break
        if line is None or line.startswith("ERROR"):
            error = line
            break
    assert error == "ERROR line timeout", (error, sent)
    assert sent < len("USER_SYNC abcde @u:hs DEV start 1")  # the line never ended
    assert "disconnected: line timeout" in wait_for_log(read_log, "line timeout")

"""Who may connect to the TCP endpoint, and how much (replication/endpoint/admission.py,
ratelimit.py, tcp.py back-pressure): ``runreplication`` as a real process on a real socket."""
from __future__ import annotations

import contextlib
import os
import random
import re
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from replication.endpoint import tcp
from streams.conf import stream_writers
from streams.models import Receipt
from streams.runtime import StreamRuntime
from testing.line_workers import LineWorkers
from testing.processes import database_url, stop_process
from testing.services import free_port
from tests.replication.endpoint.test_endpoint import SERVER_NAME, LineClient, handshake

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def running_endpoint(pg_url: str, log_path: Path, **env_extra: str):
    """``runreplication`` with extra settings; yields (port, read_log)."""
    port = free_port()
    log = open(log_path, "w+")
    env = dict(os.environ, DATABASE_URL=pg_url, SERVER_NAME=SERVER_NAME, POSITION_POLL_SECONDS="0.05",
               PYTHONUNBUFFERED="1")
    env.update(env_extra)
    proc = subprocess.Popen([sys.executable, "manage.py", "runreplication", "--listen", f"127.0.0.1:{port}"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def read_log() -> str:
        return log_path.read_text()

    try:
        deadline = time.monotonic() + 30
        while "listening on" not in read_log():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"endpoint did not start: {read_log()}")
            time.sleep(0.1)
        yield port, read_log
    finally:
        stop_process(proc)
        log.close()


def wait_for_log(read_log, text: str, count: int = 1, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while (log := read_log()).count(text) < count:
        if time.monotonic() > deadline:
            pytest.fail(f"{text!r} not logged {count} times:\n{log[-3000:]}")
        time.sleep(0.1)
    return log


def connect_from(source: str, port: int) -> LineClient:
    """A LineClient whose socket comes from ``source`` (any 127.x.y.z is local on Linux)."""
    client = LineClient.__new__(LineClient)
    client.sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    client.buf, client.closed = b"", False
    return client


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_peer_outside_allowed_networks_gets_not_one_byte(pg_url, tmp_path, tls):
    """Closed before anything is written: no SERVER line, and with TLS not even a handshake."""
    extra = {}
    if tls:
        cert, key = self_signed(tmp_path, "endpoint")
        extra = {"REPLICATION_TLS_CERT": str(cert), "REPLICATION_TLS_KEY": str(key)}
    with running_endpoint(pg_url, tmp_path / "endpoint.log", REPLICATION_ALLOWED_NETWORKS="10.0.0.0/8,::1/128",
                          **extra) as (port, read_log):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        hello = b"NAME intruder\nREPLICATE \n"
        if tls:  # a real ClientHello: a TLS server that admitted us would answer it
            import ssl

            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            client = ssl.create_default_context(cafile=str(cert)).wrap_bio(
                incoming, outgoing, server_hostname="localhost")
            with pytest.raises(ssl.SSLWantReadError):
                client.do_handshake()
            hello = outgoing.read()
        try:
            sock.sendall(hello)
        except OSError:
            pass  # already closed by the server: fine
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        sock.close()
        assert received == b""  # EOF (or reset) before a single byte: no SERVER line
        assert "refused 127.0.0.1: address not allowed" in wait_for_log(read_log, "refused 127.0.0.1")


def worker_from(source: str, port: int) -> LineClient:
    """A connection that finished its handshake (NAME, PING, REPLICATE) and so holds its slot."""
    c = connect_from(source, port)
    assert c.read_line() == f"SERVER {SERVER_NAME}"
    c.send("NAME w", "PING 1", "REPLICATE ")
    c.read_until(lambda line: line.startswith("POSITION to_device"))
    return c


def test_global_and_per_address_connection_caps(pg_url, tmp_path):
    with running_endpoint(pg_url, tmp_path / "endpoint.log", REPLICATION_MAX_CONNECTIONS="5",
                          REPLICATION_MAX_CONNECTIONS_PER_ADDRESS="3") as (port, read_log):
        first = [worker_from("127.0.0.1", port) for _ in range(3)]
        over_address = connect_from("127.0.0.1", port)
        assert over_address.read_line() == "ERROR Too many connections"
        assert over_address.read_line() is None  # closed
        others = [worker_from("127.0.0.2", port) for _ in range(2)]  # 5 in all
        over_total = connect_from("127.0.0.3", port)
        assert over_total.read_line() == "ERROR Too many connections"
        assert over_total.read_line() is None
        log = read_log()
        assert "refused 127.0.0.1: too many connections from this address" in log
        assert "refused 127.0.0.3: too many connections" in log
        # A slot freed is a slot given again (the count follows closed connections).
        first[0].close()
        wait_for_log(read_log, "disconnected: shut down")
        again = connect_from("127.0.0.3", port)
        assert again.read_line() == f"SERVER {SERVER_NAME}"
        for c in first[1:] + others + [again]:
            c.close()


@pytest.fixture(scope="module")
def rate_limited_endpoint(django_db_setup, tmp_path_factory):
    """One endpoint with a small command rate for both floods (the rate is per connection:
    each flood's connections are new)."""
    with running_endpoint(database_url(), tmp_path_factory.mktemp("flood") / "endpoint.log",
                          REPLICATION_COMMAND_RATE="20", REPLICATION_COMMAND_BURST="50") as running:
        yield running


@pytest.mark.parametrize("flood_line", ["PING 1", "USER_SYNC abcde @u:hs DEV start 1"])
def test_command_flood_gets_error_and_is_disconnected(rate_limited_endpoint, flood_line):
    port, read_log = rate_limited_endpoint
    dropped_before = read_log().count("disconnected: command rate exceeded")
    polite = handshake(port)  # 3 commands
    flooder = handshake(port)
    flooder.sock.sendall((flood_line + "\n").encode() * 2000)
    lines = []
    while (line := flooder.read_line()) is not None:
        lines.append(line)
    assert lines[-1] == "ERROR Too many commands"
    wait_for_log(read_log, "disconnected: command rate exceeded", count=dropped_before + 1)
    # Within the burst, the polite worker is unaffected: it is still served.
    polite.send("PING 2", "PING 3", "REPLICATE ")
    polite.read_until(lambda line: line.startswith("POSITION to_device"))
    polite.read_until(lambda line: line.startswith("POSITION to_device"))
    polite.close()


# --- TLS ---------------------------------------------------------------------------------------


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1 (openssl CLI, Debian's)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def tls_client(port: int, ca: Path, hostname: str) -> LineClient:
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    client = LineClient.__new__(LineClient)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sock = context.wrap_socket(raw, server_hostname=hostname)
    client.buf, client.closed = b"", False
    return client


def test_tls_endpoint_and_verifying_worker(pg_url, tmp_path):
    import asyncio
    import ssl

    from replication.endpoint.tls import client_context
    from replication.worker.tcp_worker import ReplicationWorker

    cert, key = self_signed(tmp_path, "endpoint")
    other_cert, _ = self_signed(tmp_path, "other")
    with running_endpoint(pg_url, tmp_path / "endpoint.log", REPLICATION_TLS_CERT=str(cert),
                          REPLICATION_TLS_KEY=str(key)) as (port, read_log):
        c = tls_client(port, cert, "localhost")
        assert c.read_line() == f"SERVER {SERVER_NAME}"
        c.close()
        # The client verifies: another CA, or another name, and the handshake fails.
        with pytest.raises(ssl.SSLCertVerificationError):
            tls_client(port, other_cert, "localhost")
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
            tls_client(port, cert, "replication.example")
        # A plain-text client gets no replication line out of a TLS endpoint.
        plain = LineClient(port)
        plain.send("NAME plain", "REPLICATE ")
        try:
            line = plain.read_line()
        except (ConnectionResetError, TimeoutError):
            line = None
        assert line is None or not line.startswith("SERVER")
        plain.close()

        # The worker: TLS, verifying the certificate against REPLICATION_TLS_CA and 127.0.0.1.
        async def follow() -> ReplicationWorker:
            worker = ReplicationWorker(host="127.0.0.1", port=port, ssl=client_context(str(cert)),
                                       name="tls-worker", server_name=SERVER_NAME,
                                       catchup_url="http://127.0.0.1:1", streams=["receipts"])
            task = asyncio.create_task(worker.run())
            while worker.counters.get("connections", 0) < 1:
                await asyncio.sleep(0.05)
            worker.stop()
            await asyncio.wait_for(task, 30)
            return worker

        worker = asyncio.run(asyncio.wait_for(follow(), 60))
        assert worker.counters["connections"] == 1
        assert "tls-worker" in wait_for_log(read_log, "replication tls-worker")


def test_worker_tls_settings(settings):
    import ssl

    from replication.endpoint.tls import client_context_from_settings

    assert client_context_from_settings() is None  # default: plain TCP on loopback
    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "REPLICATION_TLS": True}
    context = client_context_from_settings()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


# --- memory: workers that never read -----------------------------------------------------------


def published_idle_queues(port: int, since: datetime, timeout: float = 30) -> dict[str, int]:
    """The idle workers' outbound queues in the first snapshot the endpoint on ``port`` published
    after ``since`` (the module's shared endpoint publishes its own row beside it)."""
    from dashboard.models import EndpointStatus

    deadline = time.monotonic() + timeout
    while not (row := EndpointStatus.objects.filter(endpoint__endswith=f":{port}", updated_at__gt=since).first()):
        assert time.monotonic() < deadline, "the endpoint published no snapshot"
        time.sleep(0.05)
    return {c["name"]: c["outbound_queue"] for c in row.snapshot["connections"] if c["name"].startswith("idle")}


def test_workers_that_never_read_are_dropped_the_others_get_everything(pg_url, tmp_path, redis_server):
    """The issue's 200 workers of which 50 never read: the 50 are disconnected for failing to
    keep up once REPLICATION_MAX_PENDING_COMMANDS are queued for them (their queues, as the
    endpoint publishes them, never exceed it: memory stays bounded), and the 150 others
    receive every fact exactly once. Latency and RSS: benchmarks/bench_idle_workers.py."""
    readers_n, idle_n, max_pending, chunk_size = 150, 50, 2000, 500
    with running_endpoint(pg_url, tmp_path / "endpoint.log", REDIS_URL=redis_server.url,
                          STREAM_WRITERS="receipts=master", REPLICATION_MAX_PENDING_COMMANDS=str(max_pending),
                          REPLICATION_MAX_CONNECTIONS_PER_ADDRESS="250") as (port, read_log):
        workers = LineWorkers(port, stream="receipts")
        for i in range(idle_n):
            workers.connect(f"idle{i}", reads=False)
        for i in range(readers_n):
            workers.connect(f"reader{i}")
        workers.wait_replicating()
        from channels_redis.pubsub import RedisPubSubChannelLayer

        rt = StreamRuntime(instance_name="master", writers=stream_writers("receipts=master"))
        rt.stream_replication(layer=RedisPubSubChannelLayer(hosts=[redis_server.url]))
        written: list[int] = []
        queues: dict[str, int] = {}  # most commands seen queued for each idle worker
        rng = random.Random(7)
        try:
            # Chunks of facts, each read by every reader before the next is written: readers
            # are never far behind, the idle ones fall behind by everything. After each chunk,
            # the endpoint's next published snapshot: a chunk is a quarter of the cap, so each
            # idle worker is seen with a queue under the cap at least once before its drop.
            for chunk in range(100):
                written += rt.writer("receipts").append(
                    [[(Receipt, Receipt.synthetic(rng, chunk * chunk_size + i))] for i in range(chunk_size)])
                workers.wait_for_token(written[-1])
                queues_now = published_idle_queues(port, since=datetime.now(timezone.utc))
                for name, queue in queues_now.items():
                    queues[name] = max(queues.get(name, 0), queue)
                if read_log().count("disconnected: failed to keep up") >= idle_n:
                    break
            log = read_log()  # before the readers close
        finally:
            rt.close()
            workers.stop()
        dropped = set(re.findall(r"replication (idle\d+) \(\S+\) disconnected: failed to keep up", log))
        assert dropped == {f"idle{i}" for i in range(idle_n)}, log[-3000:]
        assert not re.search(r"replication reader\d+ \(\S+\) disconnected", log), log[-3000:]
        # The endpoint queued for each idle one (its snapshots show it), never past the cap.
        assert sorted(name for name, queue in queues.items() if queue > 0) == sorted(dropped), queues
        assert max(queues.values()) <= max_pending
        for w in workers.reading:
            assert w.closed_at is None and not w.errors, (w.name, w.errors)
            assert list(w.tokens) == written, f"{w.name}: {len(w.tokens)} of {len(written)} facts"
        print(f"{len(written)} facts written until the {idle_n} idle workers were dropped; "
              f"most queued for one: {max(queues.values())}")


def _facts_until_dropped(pg_url, tmp_path, redis_server, check_reset: bool = False, **env: str) -> int:
    """Facts written (100 at a time, each read by a reading worker first) until one worker
    that never reads is dropped for failing to keep up, with REPLICATION_MAX_PENDING_COMMANDS
    = 200: the rest of what it was sent sat in the kernel's buffers."""
    with running_endpoint(pg_url, tmp_path / "endpoint.log", REDIS_URL=redis_server.url,
                          STREAM_WRITERS="receipts=master", REPLICATION_MAX_PENDING_COMMANDS="200",
                          **env) as (port, read_log):
        workers = LineWorkers(port, stream="receipts")
        idle = workers.connect("idle0", reads=False)
        workers.connect("reader0")
        workers.wait_replicating()
        from channels_redis.pubsub import RedisPubSubChannelLayer

        rt = StreamRuntime(instance_name="master", writers=stream_writers("receipts=master"))
        rt.stream_replication(layer=RedisPubSubChannelLayer(hosts=[redis_server.url]))
        rng, written = random.Random(11), 0
        try:
            while not re.search(r"replication idle0 \(\S+\) disconnected: failed to keep up", read_log()):
                assert written < 40_000, "the non-reading worker was never dropped"
                ids = rt.writer("receipts").append(
                    [[(Receipt, Receipt.synthetic(rng, written + i))] for i in range(100)])
                written += 100
                workers.wait_for_token(ids[-1])
            if check_reset:
                # The dropped worker wakes up and reads what it was sent, to the ERROR and
                # the end: the close completes, and the endpoint's reset due 5 s after the
                # drop must not fire on the finished transport (it once logged a traceback).
                idle.sock.settimeout(30)
                received = b""
                while chunk := idle.sock.recv(1 << 16):
                    received += chunk
                assert received.endswith(b"ERROR Failed to keep up\n"), received[-200:]
                time.sleep(tcp.ABORT_AFTER_SECONDS + 1)
                assert "Traceback" not in read_log(), read_log()[-3000:]
        finally:
            rt.close()
            workers.stop()
        return written


def test_send_buffer_setting_bounds_what_a_non_reader_pins_in_the_kernel(pg_url, tmp_path, redis_server):
    """REPLICATION_SEND_BUFFER_BYTES fixes the kernel send buffer of each connection: a worker
    that never reads is dropped after the pending cap plus ~what that buffer holds, instead of
    after the ~4 MiB (about 12,000 lines) that the kernel's autotuning lets it pin."""
    fixed = _facts_until_dropped(pg_url, tmp_path, redis_server, check_reset=True, REPLICATION_SEND_BUFFER_BYTES="16384")
    # 200 queued + (2 x 16 KiB send buffer + the worker's ~8 KiB receive buffer) / ~300-byte
    # lines ~= 340, and the chunk of 100 in flight: well under 1,000.
    assert fixed <= 1_000, fixed
    (tmp_path / "autotuned").mkdir()
    autotuned = _facts_until_dropped(pg_url, tmp_path / "autotuned", redis_server)
    assert autotuned >= 3 * fixed, (autotuned, fixed)
    print(f"non-reader dropped after {fixed} facts with a 16 KiB send buffer, {autotuned} autotuned")

"""End to end with real processes: writers (``write_facts``), the TCP endpoint
(``runreplication``), the catch-up endpoint (daphne), and workers (``replication_worker``),
on the throwaway PostgreSQL. Workers must end with every fact exactly once, in per-writer
order, whatever happens to their connection."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from django.db import connections

from testing.processes import ProcessGroup, jsonl_records, wait_port
from testing.services import free_port

SERVER_NAME = "cluster.example"
WRITERS = "receipts=w1,w2"
#: facts each writer writes while a worker is cut off
PER_WRITER = 1_000
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Proxy:
    """A TCP proxy in front of the endpoint whose connections can be cut at will."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> int:
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass
        return len(pairs)

    def close(self) -> None:
        self.listener.close()
        self.cut()


class Cluster(ProcessGroup):
    def __init__(self, pg_url: str, tmp: Path, redis_url: str | None, endpoint_env: dict | None = None) -> None:
        super().__init__(tmp)
        self.env = dict(os.environ, DATABASE_URL=pg_url, SERVER_NAME=SERVER_NAME, STREAM_WRITERS=WRITERS,
                        POSITION_POLL_SECONDS="0.05", PYTHONUNBUFFERED="1")
        self.env.pop("REDIS_URL", None)
        if redis_url:
            self.env["REDIS_URL"] = redis_url
        self.repl_port, self.web_port = free_port(), free_port()
        try:  # a part that did not start must not leave the other running for the rest of the run
            self.endpoint = self.start("endpoint", "manage.py", "runreplication", "--listen",
                                       f"127.0.0.1:{self.repl_port}", env=endpoint_env)
            wait_port(self.repl_port, self.endpoint, tmp / "endpoint.log")
            self.web = self.start("web", "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port),
                                  "synapse_repl.asgi:application")
            wait_port(self.web_port, self.web, tmp / "web.log")
        except BaseException:
            self.stop()
            raise

    def worker(self, name: str, port: int) -> subprocess.Popen:
        return self.start(name, "manage.py", "replication_worker", "--name", name,
                          "--connect", f"127.0.0.1:{port}", "--catchup-url", f"http://127.0.0.1:{self.web_port}",
                          "--server-name", SERVER_NAME, "--streams", "receipts",
                          "--jsonl", str(self.tmp / f"{name}.jsonl"))

    def write(self, instance: str, count: int, per_txn: int, rate: float | None = None) -> subprocess.Popen:
        limit = ("--rate", str(rate)) if rate else ()
        return self.start(f"writer-{instance}", "manage.py", "write_facts", "receipts", "--count", str(count),
                          "--per-txn", str(per_txn), "--no-progress", *limit, env={"INSTANCE_NAME": instance})

    def facts(self, name: str) -> list[dict]:
        return jsonl_records(self.tmp / f"{name}.jsonl")

    def count(self, name: str) -> int:
        """How many facts worker ``name`` has delivered so far (its lines, without parsing them:
        the test polls this)."""
        path = self.tmp / f"{name}.jsonl"
        return path.read_bytes().count(b"\n") if path.exists() else 0



@pytest.fixture(params=["redis", "no-redis"])
def cluster(request, pg_url, tmp_path):
    """With Redis, writers' line batches reach the endpoint through the channel layer; without
    it, the endpoint sees writers of other processes only in stream_positions, and workers
    fetch every fact through the catch-up endpoint."""
    redis_url = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    c = Cluster(pg_url, tmp_path, redis_url)
    yield c
    c.stop()


def expected_facts() -> set[tuple[str, int]]:
    with connections["default"].cursor() as cur:
        cur.execute("SELECT DISTINCT instance_name, stream_id FROM receipts_linearized")
        return set(cur.fetchall())


def wait_for(cluster: Cluster, names: list[str], total: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(cluster.count(n) >= total for n in names):
            return
        time.sleep(0.5)
    counts = {n: cluster.count(n) for n in names}
    logs = {n: (cluster.tmp / f"{n}.log").read_text()[-1500:] for n in names}
    pytest.fail(f"workers did not receive {total} facts in time: {counts}\n{logs}")


def wait_connected(cluster: Cluster, names: list[str], timeout: float = 120) -> None:
    """Until every worker in ``names`` follows (a loaded machine starts them slowly)."""
    deadline = time.monotonic() + timeout
    for name in names:
        log = cluster.tmp / f"{name}.log"
        while "replication connected to" not in (log.read_text(errors="replace") if log.exists() else ""):
            assert time.monotonic() < deadline, f"{name} did not connect"
            time.sleep(0.1)


def check_exactly_once_in_order(cluster: Cluster, name: str, expected: set[tuple[str, int]]) -> None:
    facts = cluster.facts(name)
    got = [(f["writer"], f["token"]) for f in facts]
    assert len(got) == len(set(got)), f"{name} received a fact twice"
    assert set(got) == expected, f"{name}: missing {len(expected - set(got))}, unexpected {len(set(got) - expected)}"
    for writer in {w for w, _ in got}:
        tokens = [t for w, t in got if w == writer]
        assert tokens == sorted(tokens), f"{name}: {writer}'s facts out of order"


def test_three_workers_two_writers_one_cut_off(cluster):
    proxy = Proxy(cluster.repl_port)
    try:
        workers = ["wk1", "wk2", "wk3"]
        cluster.worker("wk1", cluster.repl_port)
        cluster.worker("wk2", cluster.repl_port)
        cluster.worker("wk3", proxy.port)  # the one we cut off
        wait_connected(cluster, workers)
        # 100 facts/s each (>= 10 s of writing): on a quiet machine unlimited writers were
        # done before the second cut, and a reconnected wk3 had nothing left to wait for. What
        # a cut exercises (lines lost on the way, the reconnect, catch-up) does not grow with
        # the rate; every fact costs each process CPU.
        writers = [cluster.write("w1", PER_WRITER, 10, rate=100), cluster.write("w2", PER_WRITER, 25, rate=100)]
        # Cut wk3 off twice while the facts flow, each time once it follows again through the
        # proxy (it reconnects with back-off) and has received 200 more facts (a second of
        # both writers).
        cut = 0
        for _ in range(2):
            deadline = time.monotonic() + 60
            start = cluster.count("wk3")
            while ((cluster.count("wk3") < start + 200 or not proxy.pairs)
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            cut += proxy.cut()
        assert cut >= 2
        for w in writers:
            assert w.wait(timeout=180) == 0
        expected = expected_facts()
        assert len(expected) == 2 * PER_WRITER
        wait_for(cluster, workers, 2 * PER_WRITER)
        for name in workers:
            check_exactly_once_in_order(cluster, name, expected)
        assert "disconnected" in (cluster.tmp / "endpoint.log").read_text()
    finally:
        proxy.close()


@pytest.fixture
def congestible_cluster(pg_url, tmp_path, redis_server):
    """On Redis (only live lines can congest), its endpoint with a small outbound backlog cap
    and a fixed kernel send buffer (docs/security.md, "Outbound backlog"): a worker that stops
    reading is dropped ~2,500 facts after it stopped instead of the ~12,000 the defaults let it hold (the
    limits themselves: endpoint/test_limits.py)."""
    c = Cluster(pg_url, tmp_path, redis_server.url,
                endpoint_env={"REPLICATION_MAX_PENDING_COMMANDS": "1000", "REPLICATION_SEND_BUFFER_BYTES": "16384"})
    yield c
    c.stop()


def test_worker_that_stops_reading_is_dropped_and_catches_up(congestible_cluster):
    cluster = congestible_cluster
    worker = cluster.worker("slow", cluster.repl_port)
    wait_connected(cluster, ["slow"])
    # The worker stops reading once the facts flow to it, not before the writer has started:
    # the endpoint drops a worker silent for 25 s (PING_TIMEOUT) for that instead, and a
    # writer process starting on a loaded machine can take longer than that.
    writer = cluster.write("w1", 6_000, 100, rate=1000)
    deadline = time.monotonic() + 120
    while not cluster.count("slow"):
        assert time.monotonic() < deadline and writer.poll() is None, "no fact reached the worker live"
        time.sleep(0.05)
    worker.send_signal(signal.SIGSTOP)  # stops reading: its socket buffers fill up
    try:
        log = cluster.tmp / "endpoint.log"
        deadline = time.monotonic() + 60
        while "failed to keep up" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGCONT)
    assert writer.wait(timeout=180) == 0
    expected = expected_facts()
    assert len(expected) == 6_000
    wait_for(cluster, ["slow"], len(expected))
    check_exactly_once_in_order(cluster, "slow", expected)

"""A multi-process cluster on Redis pub/sub while Redis is killed and restarted (issue: the
cluster survives Redis faults). Real PostgreSQL, real Redis, separate OS processes:
2 writers on ``events`` + 1 on ``account_data``, 2 TCP endpoints, a catch-up web process,
and 3 workers (two over TCP, one over Redis directly)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from django.db import connections

from testing.processes import ProcessGroup, wait_port
from testing.services import free_port

SERVER_NAME = "faults.example"
WRITERS = "events=w1,w2;account_data=w3"
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.faults]
#: facts each of the three writers writes, and how fast (facts/s): ~11 s of writing, so both
#: Redis kills land while the facts flow even on a quiet machine (faster writers could finish
#: before the second one). What a kill exercises (lines lost, writers announcing their
#: positions again, catch-up) does not grow with the rate; every fact costs each process of
#: the cluster CPU.
PER_WRITER = 700
RATE = 60
#: facts the Redis worker receives between two kills (a bit over a second of the three writers)
BETWEEN_KILLS = 200


class RedisCluster(ProcessGroup):
    def __init__(self, pg_url: str, redis_url: str, tmp: Path, *, writers: str = WRITERS,
                 streams: str = "events,account_data", endpoints: int = 2) -> None:
        super().__init__(tmp)
        self.streams = streams
        self.env = dict(os.environ, DATABASE_URL=pg_url, REDIS_URL=redis_url, SERVER_NAME=SERVER_NAME,
                        STREAM_WRITERS=writers, POSITION_POLL_SECONDS="0.2", PYTHONUNBUFFERED="1")
        self.web_port = free_port()
        self.endpoint_ports = []
        try:  # a part that did not start must not leave the others running for the rest of the run
            self.web = self.start("web", "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port),
                                  "synapse_repl.asgi:application")
            for i in range(endpoints):
                port = free_port()
                proc = self.start(f"endpoint{i}", "manage.py", "runreplication", "--listen", f"127.0.0.1:{port}")
                wait_port(port, proc, tmp / f"endpoint{i}.log")
                self.endpoint_ports.append(port)
            wait_port(self.web_port, self.web, tmp / "web.log")
        except BaseException:
            self.stop()
            raise

    def worker(self, name: str, *transport: str) -> subprocess.Popen:
        return self.start(name, "manage.py", "replication_worker", "--name", name, *transport,
                          "--catchup-url", f"http://127.0.0.1:{self.web_port}", "--server-name", SERVER_NAME,
                          "--streams", self.streams, "--jsonl", str(self.tmp / f"{name}.jsonl"))

    def write(self, instance: str, stream: str, count: int, per_txn: int, rate: float) -> subprocess.Popen:
        return self.start(f"writer-{instance}", "manage.py", "write_facts", stream, "--count", str(count),
                          "--per-txn", str(per_txn), "--rate", str(rate), "--no-progress",
                          env={"INSTANCE_NAME": instance})

    def count(self, name: str) -> int:
        """How many facts worker ``name`` has delivered so far."""
        path = self.tmp / f"{name}.jsonl"
        return path.read_bytes().count(b"\n") if path.exists() else 0

    def log_count(self, name: str, text: str) -> int:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace").count(text) if path.exists() else 0

    def facts(self, name: str) -> list[tuple[str, str, int]]:
        path = self.tmp / f"{name}.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            if line.strip():
                f = json.loads(line)
                out.append((f["stream"], f["writer"], f["token"]))
        return out



#: What a worker logs once it follows (TCP: the server accepted; Redis: SUBSCRIBE confirmed).
CONNECTED = {"tcp": "replication connected to", "red": "replication subscribed to"}


def wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def database_facts() -> set[tuple[str, str, int]]:
    with connections["default"].cursor() as cur:
        cur.execute("SELECT 'events', instance_name, stream_ordering FROM events WHERE stream_ordering > 0 "
                    "UNION ALL SELECT 'account_data', instance_name, stream_id FROM account_data")
        return set(cur.fetchall())


def test_cluster_survives_redis_restarts(pg_url, redis_server, tmp_path):
    cluster = RedisCluster(pg_url, redis_server.url, tmp_path)
    try:
        workers = {"tcp0": ("--connect", f"127.0.0.1:{cluster.endpoint_ports[0]}"),
                   "tcp1": ("--connect", f"127.0.0.1:{cluster.endpoint_ports[1]}"),
                   "redis": ("--redis",)}
        for name, transport in workers.items():
            cluster.worker(name, *transport)
        # Every worker follows before the first write (a loaded machine starts them slowly).
        for name in workers:
            wait_for(lambda: cluster.log_count(name, CONNECTED[name[:3]]) >= 1, f"{name} to connect")
        writers = [
            cluster.write("w1", "events", PER_WRITER, 10, RATE),
            cluster.write("w2", "events", PER_WRITER, 20, RATE),
            cluster.write("w3", "account_data", PER_WRITER, 10, RATE),
        ]
        # Kill Redis twice while the facts flow (each time once the Redis worker has received
        # another BETWEEN_KILLS facts), for about a second each time.
        progress = 0
        for fault in range(2):
            wait_for(lambda: cluster.count("redis") >= progress + BETWEEN_KILLS, "facts to flow to the Redis worker")
            # ... and every writer subscribed again after the previous kill: a kill during its
            # resubscription is a failed attempt, not the loss of a subscription, and the
            # assertion below counts losses
            wait_for(lambda: all(cluster.log_count(f"writer-{w}", f"Redis subscription to {SERVER_NAME} (writer) back")
                                 >= fault for w in ("w1", "w2", "w3")), "the writers to resubscribe")
            assert all(w.poll() is None for w in writers), "the writers finished before the fault"
            redis_server.kill()
            time.sleep(1)
            redis_server.start(port=redis_server.port)
            progress = cluster.count("redis")
        for w in writers:
            assert w.wait(timeout=240) == 0, (tmp_path / f"writer-{w.args}.log")
        expected = database_facts()
        assert len(expected) == 3 * PER_WRITER

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if all(cluster.count(n) >= len(expected) for n in workers):
                break
            time.sleep(0.5)
        for name in workers:
            got = cluster.facts(name)
            assert len(got) == len(set(got)), f"{name} received a fact twice"
            missing = expected - set(got)
            assert not missing, f"{name} misses {len(missing)} facts, e.g. {sorted(missing)[:3]}:\n" + \
                (tmp_path / f"{name}.log").read_text()[-2000:]
            assert set(got) == expected
            for key in {(s, w) for s, w, _ in got}:
                tokens = [t for s, w, t in got if (s, w) == key]
                assert tokens == sorted(tokens), f"{name}: {key} out of order"
                # The worker's final position for each writer is the writer's last fact.
                assert tokens[-1] == max(t for s, w, t in expected if (s, w) == key)
        # The faults really happened and were seen: the Redis worker subscribed three times,
        # and every writer lost its subscription twice.
        assert cluster.log_count("redis", CONNECTED["red"]) >= 3
        for w in ("w1", "w2", "w3"):
            assert cluster.log_count(f"writer-{w}", f"Redis subscription to {SERVER_NAME} (writer) lost") >= 2
    finally:
        cluster.stop()
        if redis_server.proc.poll() is not None:
            redis_server.start(port=redis_server.port)

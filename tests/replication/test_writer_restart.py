"""A writer process killed (SIGKILL) mid-transaction and restarted while workers follow the
cluster (issue: faults). Real PostgreSQL, real Redis, separate OS processes: 2 writers on
``receipts``, a TCP endpoint, the catch-up web process, and 2 workers (one over TCP, one over
Redis directly).

While the writer is down, readers see the stream's linear position held back just below its
stuck ID, and the stuck ID is reported; the other writer goes on, and workers follow it (they
go by each writer's position, not the linear one). The restarted writer recovers its position
from the database, and every worker ends with every fact exactly once, in per-writer order.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from django.db import connections

from streams.conf import stream_writers
from streams.runtime import StreamRuntime
from streams.stream_status import stream_status
from testing.processes import ROOT
from tests.replication.test_redis_faults import CONNECTED, RedisCluster

WRITERS = "receipts=w1,w2"
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.faults]


def fetch(sql: str, params=()) -> list[tuple]:
    with connections["default"].cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def database_facts() -> set[tuple[str, str, int]]:
    return {("receipts", w, t) for w, t in fetch("SELECT instance_name, stream_id FROM receipts_linearized")}


def wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_writer_killed_and_restarted_with_workers_attached(pg_url, redis_server, tmp_path):
    cluster = RedisCluster(pg_url, redis_server.url, tmp_path, writers=WRITERS, streams="receipts", endpoints=1)
    workers = {"tcp": ("--connect", f"127.0.0.1:{cluster.endpoint_ports[0]}"), "redis": ("--redis",)}
    reader = None
    try:
        for name, transport in workers.items():
            cluster.worker(name, *transport)
        for name in workers:
            wait_for(lambda: cluster.log_count(name, CONNECTED[name[:3]]) >= 1, f"{name} to connect")
        w2 = cluster.write("w2", "receipts", 3000, 10, 600)
        # w1 writes 400 facts, then dies holding a reserved ID with its row inserted but
        # not committed.
        holder = subprocess.Popen(
            [sys.executable, "-m", "tests.streams.hold_reservation", "receipts", "400"],
            cwd=ROOT, env={**cluster.env, "INSTANCE_NAME": "w1"}, stdout=subprocess.PIPE,
            stderr=open(tmp_path / "holder.log", "wb"), text=True)
        cluster.procs.append(holder)
        line = holder.stdout.readline()
        assert line.strip().isdigit(), (tmp_path / "holder.log").read_text()
        stuck_id = int(line)
        (w1_before,), = fetch("SELECT max(stream_id) FROM receipts_linearized WHERE instance_name = 'w1'")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert w2.wait(timeout=240) == 0

        # w1 is down. Its row never appears; w2 went on well past the stuck ID.
        assert fetch("SELECT count(*) FROM receipts_linearized WHERE stream_id = %s", [stuck_id]) == [(0,)]
        (w2_last,), = fetch("SELECT max(stream_id) FROM receipts_linearized WHERE instance_name = 'w2'")
        assert w2_last > stuck_id
        # A reader sees the linear position held back just below the stuck ID ...
        reader = StreamRuntime(instance_name="reader", writers=stream_writers(WRITERS))
        assert reader.generator("receipts").get_current_token() == stuck_id - 1
        assert reader.generator("receipts").get_current_token_for_writer("w2") >= w2_last
        reader.close()
        reader = None
        # ... and the stuck ID is visible, with its writer.
        status = {s.name: s for s in stream_status(stuck_after=0)}["receipts"]
        assert [(p.instance_name, p.stream_ids, p.stuck) for p in status.pending] == [("w1", [stuck_id], True)]
        assert status.linear < stuck_id
        # Workers follow each writer's position, not the linear one: they get all of w2's
        # facts, beyond the stuck ID, while w1 is down.
        for name in workers:
            wait_for(lambda: ("receipts", "w2", w2_last) in set(cluster.facts(name)),
                     f"{name} to receive w2's last fact while w1 is down")
            assert not any(w == "w1" and t >= stuck_id for _, w, t in cluster.facts(name))

        # w1 restarts: its position comes back from the database, its stuck reservation is
        # cleared, and it writes on after everything else.
        restarted = cluster.write("w1", "receipts", 500, 5, 1000)
        assert restarted.wait(timeout=240) == 0
        assert all(not s.pending for s in stream_status(stuck_after=0))
        (w1_first_new,), = fetch("SELECT min(stream_id) FROM receipts_linearized "
                                 "WHERE instance_name = 'w1' AND stream_id > %s", [w1_before])
        assert w1_first_new > max(stuck_id, w2_last)
        (w1_recorded,), = fetch("SELECT stream_id FROM stream_positions "
                                "WHERE stream_name = 'receipts' AND instance_name = 'w1'")
        (w1_last,), = fetch("SELECT max(stream_id) FROM receipts_linearized WHERE instance_name = 'w1'")
        assert w1_recorded >= w1_last
        expected = database_facts()
        assert len(expected) == 3000 + 400 + 500
        reader = StreamRuntime(instance_name="reader", writers=stream_writers(WRITERS))
        assert reader.generator("receipts").get_current_token() == max(t for _, _, t in expected)
        reader.close()
        reader = None

        for name in workers:
            wait_for(lambda: len(cluster.facts(name)) >= len(expected), f"{name} to receive every fact")
        for name in workers:
            got = cluster.facts(name)
            assert len(got) == len(set(got)), f"{name} received a fact twice"
            assert set(got) == expected, (tmp_path / f"{name}.log").read_text()[-2000:]
            for writer in ("w1", "w2"):
                tokens = [t for _, w, t in got if w == writer]
                assert tokens == sorted(tokens), f"{name}: {writer} out of order"
    finally:
        if reader is not None:
            reader.close()
        cluster.stop()

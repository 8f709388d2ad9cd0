"""``bench_storage --event-writers N``: the rooms sharded over N event writer processes.

The router is pure (each room to one writer, its events in the generator's order, batches of
one kind); end to end, a build by two writer processes stores what one writer stores, room
by room (only the stream positions, drawn by two processes at once, differ), and both
writers wrote.
"""
from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import pytest

from benchmarks._event_writers import EventWriterPool, WriterFailed, route, shard_of, stream_writers
from rooms.storage.generator import Batch, RoomGenerator
from tests.rooms.storage.helpers import rows as db_rows
from tests.rooms.storage.test_bench_storage_resume import DATASET, ROOT, kept_dirs  # noqa: F401 (a fixture)

#: per room in stream order: everything but the positions two writers draw at once
EVENTS = ("SELECT room_id, event_id, type, state_key, sender, membership, redacts, rejected, outlier, redacted, "
          "topological_ordering, depth, json FROM events ORDER BY room_id, stream_ordering")
STATE = "SELECT room_id, type, state_key, event_id, membership FROM current_state_events ORDER BY 1, 2, 3"
MEMBERS = ("SELECT event_id, user_id, sender, room_id, membership FROM room_memberships "
           "ORDER BY event_id")
WRITERS = "SELECT instance_name, count(*) FROM events WHERE room_id NOT LIKE '!baseline%%' GROUP BY 1 ORDER BY 1"


def test_route_gives_each_room_to_one_writer_in_order_in_batches_of_one_kind():
    gen = RoomGenerator(rooms=40, users=60, events=3000, seed=5, batch=100)
    made = list(gen.batches())
    assert any(b.backfill for b in made) and any(not b.backfill for b in made)
    flat = [(room, item, b.backfill) for b in made for room, item in zip(b.rooms, b.items)]

    routed = list(route(iter(made), 3, 70))
    writer_of: dict[str, int] = {}
    per_writer: dict[int, list] = defaultdict(list)
    for w, b in routed:
        assert 0 < len(b.items) <= 70 and len(b.rooms) == len(b.items)
        for room, item in zip(b.rooms, b.items):
            assert writer_of.setdefault(room, w) == w == shard_of(room, 3)
            per_writer[w].append((room, item, b.backfill))
    assert len(per_writer) == 3
    # every item once, and each writer's in the generator's order (so each room's)
    assert sorted(map(repr, (x for xs in per_writer.values() for x in xs))) == sorted(map(repr, flat))
    for w, got in per_writer.items():
        assert got == [x for x in flat if writer_of[x[0]] == w]


def test_route_never_puts_live_and_backfill_in_one_batch_and_refuses_unnamed_items():
    made = [Batch(["a1", "b1"], rooms=["!a", "!b"]), Batch(["a2"], backfill=True, rooms=["!a"]),
            Batch(["a3"], rooms=["!a"])]
    routed = list(route(iter(made), 1, 10))
    assert [(b.items, b.backfill) for _, b in routed] == [(["a1", "b1"], False), (["a2"], True), (["a3"], False)]
    with pytest.raises(ValueError, match="names 1 rooms"):
        list(route(iter([Batch(["x", "y"], rooms=["!a"])]), 2, 10))


def test_stream_writers_names_this_process_and_the_writers():
    assert stream_writers(2) == "events=master,w1,w2"


def bench(data_dir, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_storage.py"), *DATASET,
                           "--data-dir", str(data_dir), *extra], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def rows(data_dir) -> dict[str, list]:
    import psycopg

    from testing.services import PostgresServer

    pg = PostgresServer(directory=str(data_dir), keep=True).start()
    try:
        with psycopg.connect(pg.url("bench_storage")) as conn:
            return {sql: conn.execute(sql).fetchall() for sql in (EVENTS, STATE, MEMBERS, WRITERS)}
    finally:
        pg.stop()


@pytest.mark.slow
def test_two_writer_processes_store_what_one_writer_stores(kept_dirs):  # noqa: F811
    one, two, stopped = kept_dirs / "one", kept_dirs / "two", kept_dirs / "stopped"
    single = bench(one)
    assert single.returncode == 0, single.stderr
    pair = bench(two, "--event-writers", "2")
    assert pair.returncode == 0, pair.stderr
    assert "event writer w1:" in pair.stdout and "event writer w2:" in pair.stdout
    assert "of wall time, 2 event writers at once" in pair.stdout  # not a time inside one writer
    assert "inside persist_events ->" in single.stdout
    assert "state at event, cold" in pair.stdout
    a, b = rows(one), rows(two)
    assert len(a[EVENTS]) > 600 and a[STATE]
    for sql in (EVENTS, STATE, MEMBERS):
        assert a[sql] == b[sql], sql
    assert [w for w, _ in a[WRITERS]] == ["master"]
    assert [w for w, _ in b[WRITERS]] == ["master", "w1", "w2"]  # master: the live traffic after the build
    assert all(n > 100 for _, n in b[WRITERS][1:])

    # a build by several writers, stopped, is not continued (each writer's place is not recorded)
    first = bench(stopped, "--event-writers", "2", "--stop-after", "200")
    assert first.returncode == 0, first.stderr
    assert "is not continued" in first.stdout
    again = bench(stopped, "--event-writers", "2")
    assert again.returncode == 2 and "not continued" in again.stderr
    alone = bench(stopped)
    assert alone.returncode == 2 and "not continued" in alone.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_writer_that_refuses_its_batch_fails_the_pool_with_its_reason(pg_url, monkeypatch):
    """Bad input to one writer process: the pool raises with the writer's own error, stops
    both processes, and what they committed before stays."""
    monkeypatch.setenv("DATABASE_URL", pg_url)  # the spawned writers take this environment
    monkeypatch.setenv("STREAM_WRITERS", stream_writers(2))
    monkeypatch.delenv("REDIS_URL", raising=False)
    pool = EventWriterPool(2, dict(freeze_every=0, bulk_gc=None, gc_young=None, cache_scale=1.0, room_cache=None))
    try:
        made = list(RoomGenerator(rooms=6, users=20, events=200, seed=2, batch=50).batches())
        for w, b in route(iter(made), 2, 50):
            pool.submit(w, b)
        pool.drain()
        pool.submit(0, Batch([b"{not an event"], rooms=["!x"]))
        with pytest.raises(WriterFailed, match="event writer w1 failed") as failed:
            pool.drain()
        assert "BadEvent" in str(failed.value)
    finally:
        pool.close()
    assert pool.failed and not any(p.is_alive() for p in pool._procs)
    by_writer = {i: sum(c.events for c in pool.committed if c.writer == i) for i in (0, 1)}
    assert sum(by_writer.values()) == sum(len(b.items) for b in made) and all(by_writer.values())
    stored = dict(db_rows("SELECT instance_name, count(*) FROM events GROUP BY 1"))
    assert stored == {"w1": by_writer[0], "w2": by_writer[1]}


def test_event_writers_out_of_range_or_on_sqlite_are_refused_before_anything_starts():
    for extra, message in ((["--event-writers", "0"], "--event-writers must be 1 or more, not 0"),
                           (["--event-writers", "2", "--sqlite"], "SQLite has one writer")):
        run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_storage.py"), *DATASET, *extra],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert run.returncode == 2 and message in run.stderr, run.stderr

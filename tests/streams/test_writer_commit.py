"""``StreamWriter.append`` completing its IDs in its own commit (PostgreSQL).

The reservation is committed (on the writer's own connection) before the rows are written, and
deleted by the very transaction that writes them (with the writer's position recorded): a
reader sees the pending ID or the rows, never neither; a transaction that fails to commit
completes as a rollback; a writer killed before its commit leaves its ID reported stuck
until it restarts, as before (docs/streams.md).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connections

from streams.conf import stream_writers
from streams.id_store import PostgresIdStore
from streams.models import Receipt, StreamPosition, StreamReservation
from streams.runtime import StreamRuntime
from streams.stream_status import stream_status

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runtimes():
    made: list[StreamRuntime] = []

    def make(instance="master", writers=""):
        rt = StreamRuntime(instance_name=instance, writers=stream_writers(writers))
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()


def facts(n, seed=1):
    rng = random.Random(seed)
    return [[(Receipt, Receipt.synthetic(rng, i))] for i in range(n)]


def reservations(pg_url, instance):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT stream_ids FROM stream_reservations WHERE stream_name = 'receipts' AND instance_name = %s",
            (instance,),
        ).fetchall()
    return [list(r[0]) for r in rows]


def rows_at(pg_url, ids):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM receipts_linearized WHERE stream_id = ANY(%s)",
                            (list(ids),)).fetchone()[0]


def wait_for(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def locked_table(pg_url):
    """A transaction holding ``receipts_linearized`` in EXCLUSIVE mode: reads go on, inserts
    wait. Commit (or close) it to let them in."""
    conn = psycopg.connect(pg_url)
    conn.execute("LOCK TABLE receipts_linearized IN EXCLUSIVE MODE")
    return conn


def blocked_on_lock(pg_url, application_prefix=None):
    """Backend pids waiting for a lock on the fact table."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchall()]


def test_append_completes_in_its_commit_without_a_round_trip_of_its_own(runtimes, monkeypatch):
    """Nothing on the dedicated connection: at one fact per transaction reservation, rows
    and completion go in the writer's one pipeline; for a batch the reservation goes in one
    pipeline with the BEGIN of the writing transaction, and the completion and the position
    travel with the COMMIT."""
    rt = runtimes()
    w = rt.writer("receipts")
    w.append(facts(1, seed=9))  # looks up the reservations' ID sequence once
    calls = []
    real_run = PostgresIdStore._run

    def run(self, sql, params):
        calls.append(sql)
        return real_run(self, sql, params)

    monkeypatch.setattr(PostgresIdStore, "_run", run)
    for n, dedicated in ((1, 0), (3, 0), (1, 0), (100, 0)):
        calls.clear()
        ids = w.append(facts(n))
        assert len(calls) == dedicated and all("nextval" in sql for sql in calls)
        assert list(Receipt.objects.filter(stream_id__in=ids).values_list("stream_id", flat=True).order_by("stream_id")) == ids
        assert StreamPosition.objects.get(stream_name="receipts", instance_name="master").stream_id == ids[-1]
        assert not StreamReservation.objects.filter(stream_name="receipts").exists()
        assert w.generator.pending() == []
        assert w.generator.get_current_token() == ids[-1]


def test_one_fact_bad_row_reserves_nothing_and_a_failed_insert_completes(runtimes):
    rt = runtimes()
    w = rt.writer("receipts")
    before = w.generator.get_current_token()
    bad = dict(Receipt.synthetic(random.Random(1), 0))
    del bad["room_id"]
    with pytest.raises(ValueError, match="room_id is required"):
        w.append([[(Receipt, bad)]])
    assert w.generator.pending() == [] and w.generator.get_current_token() == before
    too_long = dict(Receipt.synthetic(random.Random(1), 0), room_id="!" * 300)  # varchar(255)
    from django.db import DataError

    with pytest.raises(DataError):
        w.append([[(Receipt, too_long)]])
    # The reservation committed, the row's statement failed: completed as a rollback.
    assert not StreamReservation.objects.filter(stream_name="receipts").exists()
    assert w.generator.pending() == []
    assert Receipt.objects.count() == 0
    assert w.append(facts(1)) == [w.generator.get_current_token()]
    assert w.generator.get_current_token() > before + 1


@pytest.mark.parametrize("n", [1, 3])
def test_pending_id_is_visible_until_the_commit_that_writes_its_row(runtimes, pg_url, n):
    """Both ways of reserving on the writer's own connection (one fact: one pipeline; a
    batch: the reservation with the BEGIN, then COPY) commit the reservation before the
    rows are written."""
    rt = runtimes()
    w = rt.writer("receipts")
    before = w.generator.get_current_token()
    ids = list(range(before + 1, before + n + 1))
    lock = locked_table(pg_url)
    done: list = []
    t = threading.Thread(target=lambda: done.append(w.append(facts(n))))
    try:
        t.start()
        wait_for(lambda: blocked_on_lock(pg_url), "the writer's INSERT to wait for the lock")
        # Another process sees the reservation, and no row yet ...
        assert reservations(pg_url, "master") == [ids]
        assert rows_at(pg_url, ids) == 0
        status = {s.name: s for s in stream_status(stuck_after=0)}["receipts"]
        assert [(p.instance_name, p.stream_ids) for p in status.pending] == [("master", ids)]
        assert w.generator.get_current_token() == before
    finally:
        lock.commit()
        lock.close()
        t.join(timeout=60)
    # ... and after the commit the rows and no reservation, the position recorded with them.
    assert done == [ids]
    assert rows_at(pg_url, ids) == n
    assert reservations(pg_url, "master") == []
    assert StreamPosition.objects.get(stream_name="receipts", instance_name="master").stream_id == ids[-1]
    assert w.generator.get_current_token() == ids[-1]


@pytest.mark.parametrize("n", [1, 3])
def test_a_transaction_that_fails_to_commit_completes_as_a_rollback(runtimes, pg_url, n):
    """The writer's backend is killed while its transaction waits: the rows never appear,
    the reservation is deleted on the dedicated connection, the IDs are not left pending."""
    rt = runtimes()
    w = rt.writer("receipts")
    before = w.generator.get_current_token()
    lock = locked_table(pg_url)
    errors: list[BaseException] = []

    def write():
        try:
            w.append(facts(n))
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=write)
    try:
        t.start()
        pids = wait_for(lambda: blocked_on_lock(pg_url), "the writer's insert to wait for the lock")
        assert reservations(pg_url, "master") == [list(range(before + 1, before + n + 1))]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
        t.join(timeout=60)
    finally:
        lock.rollback()
        lock.close()
    assert errors, "the append should have failed"
    ids = range(before + 1, before + n + 1)
    assert rows_at(pg_url, ids) == 0
    assert reservations(pg_url, "master") == []
    assert w.generator.pending() == []
    assert w.generator.get_current_token() == before + n  # completed (zero rows), not stuck
    # The writer goes on (a new connection) and the stream moves past the lost IDs.
    connections["default"].close()
    later = w.append(facts(1, seed=2))
    assert later == [before + n + 1]
    assert StreamPosition.objects.get(stream_name="receipts", instance_name="master").stream_id == later[0]


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 3])
def test_writer_killed_before_its_commit_completes(runtimes, pg_url, n):
    """A writer process SIGKILLed while its transaction waits for a lock. With 3 facts it
    is killed before sending the completion and COMMIT (COPY waits): no rows, the reservation
    stays and is reported stuck, the linear position holds below it until the writer
    restarts. With 1 fact BEGIN, INSERT, completion and COMMIT were already sent in one
    pipeline, so the server may still run them: either way the rows and the reservation
    never show together or both missing."""
    writers = "receipts=w1,w2"
    env = dict(os.environ, DATABASE_URL=pg_url, INSTANCE_NAME="w1", STREAM_WRITERS=writers, PYTHONUNBUFFERED="1")
    env.pop("REDIS_URL", None)
    first = runtimes("w1", writers)
    first.writer("receipts").append(facts(5))
    first.close()
    lock = locked_table(pg_url)
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.streams.hold_reservation", "receipts", "append", str(n)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        if holder.stdout.readline().strip() != "appending":
            pytest.fail(f"holder did not start: {holder.stderr.read()}")
        stuck = wait_for(lambda: reservations(pg_url, "w1"), "w1's reservation")[0]
        assert len(stuck) == n
        wait_for(lambda: blocked_on_lock(pg_url), "w1's insert to wait for the lock")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
        lock.commit()
        lock.close()
    # The killed client's backend goes once it finds the client gone.
    wait_for(lambda: not blocked_on_lock(pg_url), "the killed writer's backend to finish")
    time.sleep(0.2)
    rows, left = rows_at(pg_url, stuck), reservations(pg_url, "w1")
    print(f"{n} fact(s): {'not committed, reservation left' if left else 'committed by the server'}")
    w2 = runtimes("w2", writers).writer("receipts").append(facts(5, seed=3))
    assert w2[0] > stuck[-1]
    if n > 1:
        assert (rows, left) == (0, [stuck])
    assert (rows, left) in ((0, [stuck]), (n, [])), (rows, left)
    if left:
        reader = runtimes("reader", writers)
        assert reader.generator("receipts").get_current_token() == stuck[0] - 1
        status = {s.name: s for s in stream_status(stuck_after=0)}["receipts"]
        assert [(p.instance_name, p.stream_ids, p.stuck) for p in status.pending] == [("w1", stuck, True)]
    else:
        assert StreamPosition.objects.get(stream_name="receipts", instance_name="w1").stream_id == stuck[-1]
    # w1 restarts and recovers: nothing pending, the linear position at the end of the stream.
    runtimes("w1", writers).generator("receipts")
    assert all(not s.pending for s in stream_status(stuck_after=0))
    assert runtimes("reader2", writers).generator("receipts").get_current_token() >= stuck[-1]


def test_one_fact_append_runs_prepared_statements_and_leaves_djangos_unprepared(runtimes):
    """The reservation and the row-and-completion statement are prepared on Django's
    connection (planning them on every append cost more server CPU than the raw insert's
    whole transaction); Django's own queries on it stay unprepared, as Django wants."""
    rt = runtimes()
    w = rt.writer("receipts")
    for i in range(3):
        w.append(facts(1, seed=i))
    assert Receipt.objects.filter(room_id="!nowhere:x").count() == 0
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [r[0] for r in cursor.fetchall()]
    assert any("INSERT INTO stream_reservations" in s for s in prepared), prepared
    assert any("receipts_linearized" in s and "stream_positions" in s for s in prepared), prepared
    assert not any("!nowhere:x" in s or "COUNT(" in s.upper() for s in prepared), prepared
    assert connections["default"].connection.prepare_threshold > 10**9

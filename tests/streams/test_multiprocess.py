"""Several writer processes on one stream, and a writer killed mid-transaction.

Real OS processes (``manage.py write_facts``) against the throwaway PostgreSQL.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings

from streams.conf import stream_writers
from streams.runtime import StreamRuntime
from streams.stream_status import stream_status

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def env_for(pg_url: str, instance: str, writers: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DATABASE_URL=pg_url, INSTANCE_NAME=instance, STREAM_WRITERS=writers, PYTHONUNBUFFERED="1")
    env.pop("REDIS_URL", None)
    return env


def write_facts(pg_url, instance, writers, stream, count, per_txn=1) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "write_facts", stream, "--count", str(count),
         "--per-txn", str(per_txn), "--no-progress"],
        cwd=ROOT, env=env_for(pg_url, instance, writers), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"writer failed ({proc.returncode}):\n{out}\n{err}"
    return out


def fetch(sql, params=()):
    with connections["default"].cursor() as c:
        c.execute(sql, params)
        return c.fetchall()


def sequence_position(name: str) -> int:
    """The last ID a sequence handed out; 1 (the first ID is 2) if it does not exist yet."""
    if not fetch("SELECT 1 FROM pg_class WHERE relkind = 'S' AND relname = %s", [name]):
        return 1
    (last, called), = fetch(f"SELECT last_value, is_called FROM {name}")
    return last if called else last - 1


def restarted(instance: str, writers: str) -> StreamRuntime:
    from streams.conf import stream_writers

    return StreamRuntime(instance_name=instance, writers=stream_writers(writers))


PER_WRITER = 2_000


def test_four_writer_processes(pg_url):
    writers = "receipts=w1,w2,w3,w4"
    batches = {"w1": 1, "w2": 7, "w3": 25, "w4": 100}
    before = sequence_position("receipts_sequence")
    # 2,000 facts each: w1's 2,000 single-fact transactions outlast the others' start-up, so
    # all four reserve IDs from the sequence at once.
    procs = [write_facts(pg_url, w, writers, "receipts", PER_WRITER, per_txn=b) for w, b in batches.items()]
    for p in procs:
        finish(p)

    (total, distinct, lo, hi), = fetch(
        "SELECT count(*), count(DISTINCT stream_id), min(stream_id), max(stream_id) FROM receipts_linearized")
    assert total == distinct == 4 * PER_WRITER
    per_writer = dict(fetch("SELECT instance_name, count(*) FROM receipts_linearized GROUP BY instance_name"))
    assert per_writer == {w: PER_WRITER for w in batches}
    # Every reserved ID was written: nothing rolled back, so the IDs are gapless.
    assert (lo, hi) == (before + 1, before + 4 * PER_WRITER)
    assert fetch("SELECT count(*) FROM stream_reservations") == [(0,)]

    # Each writer's recorded position covers all of its own rows.
    recorded = dict(fetch("SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = 'receipts'"))
    own_max = dict(fetch("SELECT instance_name, max(stream_id) FROM receipts_linearized GROUP BY instance_name"))
    for w in batches:
        assert recorded[w] >= own_max[w]

    # Restart every writer and a reader: after one round of position announcements they
    # all agree, and the linear position is the last ID.
    runtimes = [restarted(w, writers) for w in [*batches, "reader"]]
    try:
        gens = [rt.generator("receipts") for rt in runtimes]
        for g in gens:
            for other in gens:
                if other is not g and other.is_writer:
                    g.advance(other.instance_name, other.get_current_token_for_writer(other.instance_name))
        views = [
            ({w: g.get_current_token_for_writer(w) for w in batches}, g.get_current_token()) for g in gens
        ]
        assert all(v == views[0] for v in views), views
        assert views[0] == ({w: hi for w in batches}, hi)
    finally:
        for rt in runtimes:
            rt.close()


def test_killed_writer_holds_linear_position_and_is_reported(pg_url):
    writers = "receipts=w1,w2"
    finish(write_facts(pg_url, "w1", writers, "receipts", 50))
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.streams.hold_reservation", "receipts"],
        cwd=ROOT, env=env_for(pg_url, "w1", writers), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        stuck_id = int(holder.stdout.readline())
    except ValueError:
        holder.kill()
        pytest.fail(f"holder did not start: {holder.stderr.read()}")
    finish(write_facts(pg_url, "w2", writers, "receipts", 200, per_txn=10))
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)

    # Its ID never appears as a row.
    assert fetch("SELECT count(*) FROM receipts_linearized WHERE stream_id = %s", [stuck_id]) == [(0,)]
    # The other writer's own position kept advancing past it.
    (w2_pos,), = fetch("SELECT stream_id FROM stream_positions WHERE stream_name='receipts' AND instance_name='w2'")
    assert w2_pos > stuck_id + 150

    # A reader sees the linear position held back just below the stuck ID ...
    reader = restarted("reader", writers)
    g = reader.generator("receipts")
    assert g.get_current_token() == stuck_id - 1
    assert g.get_current_token_for_writer("w2") == w2_pos
    reader.close()
    # ... and the stuck ID is reported, with its writer and age.
    status = {s.name: s for s in stream_status(stuck_after=0)}["receipts"]
    assert [(p.instance_name, p.stream_ids, p.stuck) for p in status.pending] == [("w1", [stuck_id], True)]
    assert status.linear == min(w2_pos, stuck_id - 1)
    assert status.laggard == "w1"  # named as the writer holding it back
    configured = {**settings.SYNAPSE_REPL, "STREAM_WRITERS": writers}
    with override_settings(SYNAPSE_REPL=configured):
        rows = {w.name: w.ahead for w in {s.name: s for s in stream_status()}["receipts"].writer_rows}
    assert rows == {"w1": 0, "w2": w2_pos - status.linear}

    # The writer restarts and recovers: nothing pending, the linear position moves on.
    w1 = restarted("w1", writers)
    w1.generator("receipts")
    w1.close()
    assert all(not s.pending for s in stream_status(stuck_after=0))
    reader = restarted("reader", writers)
    (max_id,), = fetch("SELECT max(stream_id) FROM receipts_linearized")
    assert reader.generator("receipts").get_current_token() == max_id
    reader.close()


def test_an_idle_writer_leaves_the_linear_position_to_the_busy_one(pg_url, settings):
    """w1 wrote 10 facts and exited, w2 wrote 1,000: the linear position is w2's, every ID
    up to it complete, nothing pending; no writer is "ahead" (the SynapseReplWriterFarAhead
    alert's figure is 0) and none is named as holding it back."""
    writers = "receipts=w1,w2"
    finish(write_facts(pg_url, "w1", writers, "receipts", 10))
    finish(write_facts(pg_url, "w2", writers, "receipts", 1000, per_txn=50))
    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "STREAM_WRITERS": writers}
    status = {s.name: s for s in stream_status()}["receipts"]
    (max_id,), = fetch("SELECT max(stream_id) FROM receipts_linearized")
    assert status.positions["w2"] == max_id and status.positions["w1"] < max_id - 999
    assert status.pending == []
    assert status.linear == max_id
    assert status.laggard is None
    assert {w.name: w.ahead for w in status.writer_rows} == {"w1": 0, "w2": 0}

"""A check compares the stored tables and its recomputation over one consistent
cut, so real writers persisting events while it runs cause no differences: every check,
repeated while ``write_facts events --rate 50`` writes on the embedded default's SQLite,
reports exactly the damage planted before the writers started, every time. On PostgreSQL with
two event writers (``STREAM_WRITERS=events=w1,w2``) the same holds of the checks as full mode
schedules them: ``test_hourly_checks.py``."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection, connections

from jobs.models import JobRun
from jobs.runner import run_job
from rooms.storage.caches import storage_caches
from rooms.storage.synthetic import LiveRooms
from streams.conf import stream_writers
from streams.runtime import StreamRuntime
from testing.processes import stop_process
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, rows

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ("check_topological_ordering", "check_visibility", "check_chain_cover")


def database_url(vendor: str) -> str:
    d = connections["default"].settings_dict
    if vendor == "sqlite":
        return f"sqlite:///{d['NAME']}"
    return f"postgres://{d['USER']}@{d['HOST']}:{d['PORT']}/{d['NAME']}"


def writer(vendor: str, redis_url: str, instance: str | None, tmp_path: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("STREAM_WRITERS", "INSTANCE_NAME")}
    env.update(DATABASE_URL=database_url(vendor), REDIS_URL=redis_url, STATE_DIR=str(tmp_path),
               DJANGO_SETTINGS_MODULE="synapse_repl.settings")
    if instance:
        env.update(INSTANCE_NAME=instance, STREAM_WRITERS="events=w1,w2")
    return subprocess.Popen([sys.executable, "manage.py", "write_facts", "events", "--count", "100000",
                             "--rate", "50", "--no-progress"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def seed_rooms(instance: str | None, vendor: str) -> LiveRooms:
    """Three rooms the writers never write (theirs are ``!live-<instance>-*``), persisted as
    ``instance`` of the events stream (``None``: its only writer)."""
    storage_caches().forget()
    rt = StreamRuntime(instance_name=instance or "master", using="default",
                       writers=stream_writers("events=w1,w2" if instance else "", vendor=vendor))
    try:
        seeded = LiveRooms("seed-", rooms=3, users=6, rng=random.Random(7))
        seeded.write(90, runtime=rt)
    finally:
        rt.close()
        storage_caches().forget()
    return seeded


def damage(seed_rooms: list[str]) -> dict[str, tuple[str, str]]:
    """One wrong row per check, each in a room of its own that the writers never write: an
    ordering raised (the room's last event: it stays last, so visibility sees the same
    order), a member's open visibility range closed, a chain position moved. The (room, event or
    user) each check must name."""
    topo_room, range_room, chain_room = seed_rooms
    [(topo,)] = rows("SELECT event_id FROM events WHERE room_id = %s ORDER BY stream_ordering DESC LIMIT 1",
                     topo_room)
    [(moved,)] = rows("SELECT event_id FROM event_auth_chains WHERE room_id = %s AND sequence_number > 1 "
                      "ORDER BY event_id LIMIT 1", chain_room)
    [(range_id, user)] = rows("SELECT id, user_id FROM room_visibility_ranges WHERE room_id = %s "
                              "AND user_id NOT LIKE %s AND end_stream IS NULL ORDER BY id LIMIT 1", range_room, "*%")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE events SET topological_ordering = topological_ordering + 1000 WHERE event_id = %s",
                       [topo])
        cursor.execute("UPDATE event_auth_chains SET sequence_number = sequence_number + 100 WHERE event_id = %s",
                       [moved])
        cursor.execute("UPDATE room_visibility_ranges SET end_topological = start_topological, "
                       "end_stream = start_stream WHERE id = %s", [range_id])
    return {"check_topological_ordering": (topo_room, topo), "check_chain_cover": (chain_room, moved),
            "check_visibility": (range_room, user)}


def named(job: str, sample: list[dict], room: str) -> set[str]:
    """What the differences of ``job`` in ``room`` name (the event; the user for visibility)."""
    key = "user_id" if job == "check_visibility" else "event_id"
    return {d[key] for d in sample if d["room_id"] == room}


def events_written() -> int:
    return rows("SELECT count(*) FROM events")[0][0]


@ON_BOTH_DATABASES
@pytest.mark.parametrize("default_database", ["sqlite"], indirect=True)
@pytest.mark.slow
def test_checks_find_only_the_planted_damage_while_writers_write(default_database, redis_server, spark, tmp_path,
                                                                settings):
    # The jobs' locks (a flock in STATE_DIR on SQLite) of its own: the other test process runs
    # the same checks meanwhile, and one of its runs would be refused as "already running".
    settings.STATE_DIR = tmp_path / "state"
    vendor = default_database
    instances = ["w1", "w2"] if vendor == "postgresql" else [None]
    seeded = seed_rooms(instances[0], vendor)
    planted = damage(seeded.room_ids)
    # the damage as each check finds it on a quiet database: exactly one difference, named
    quiet = {}
    for job in CHECKS:
        run = run_job(job)
        assert run.status == JobRun.Status.SUCCEEDED, run.error
        quiet[job] = run.differences
        room, name = planted[job]
        assert named(job, run.difference_sample, room) == {name}, (job, run.difference_sample)
        assert {d["room_id"] for d in run.difference_sample} <= set(seeded.room_ids), run.difference_sample
    assert quiet["check_topological_ordering"] == quiet["check_chain_cover"] == 1
    assert quiet["check_visibility"] >= 1

    procs = [writer(vendor, redis_server.url, name, tmp_path) for name in instances]
    try:
        before = events_written()
        deadline = time.monotonic() + 120
        while events_written() < before + 20:  # the writers are under way
            assert time.monotonic() < deadline, [p.stderr.read() if p.poll() is not None else "" for p in procs]
            assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs if p.poll() is not None]
            time.sleep(0.2)
        for job in CHECKS:  # once each (each run takes seconds of Spark)
            during = events_written()
            run = run_job(job)
            assert run.status == JobRun.Status.SUCCEEDED, run.error
            assert run.differences == quiet[job], (job, run.difference_sample)
            assert named(job, run.difference_sample, planted[job][0]) == {planted[job][1]}
            assert events_written() > during, "the writers wrote while the check ran"
        assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs if p.poll() is not None]
    finally:
        for p in procs:
            stop_process(p, timeout=30)


def test_a_partition_joins_only_a_snapshot_id_it_was_given():
    """The exported ID goes into SQL text (a JDBC option): anything but its letters, digits
    and dashes is refused, not quoted into the statement."""
    from jobs.job_dialect import snapshot_init_statement

    assert snapshot_init_statement("00000003-0000001B-1") == (
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT '00000003-0000001B-1'")
    for bad in ("x'; DROP TABLE events; --", "", "a b"):
        with pytest.raises(ValueError):
            snapshot_init_statement(bad)


@pytest.mark.django_db(transaction=True)
def test_rows_in_are_counted_in_the_cut():
    """A check's ``rows_in`` counts the events of the cut it compared over, not those persisted
    while it ran (on PostgreSQL Django's connection sees every commit; the cut's does not)."""
    from jobs import io
    from jobs.definitions import count_events

    storage_caches().forget()
    rt = StreamRuntime(instance_name="master", using="default", writers=stream_writers("", vendor="postgresql"))
    try:
        rooms = LiveRooms("cut-", rooms=2, users=4, rng=random.Random(3))
        rooms.write(20, runtime=rt)
        state_events = rows("SELECT count(*) FROM events WHERE state_key IS NOT NULL")[0][0]
        in_first_room = rows("SELECT count(*) FROM events WHERE room_id = %s", rooms.room_ids[0])[0][0]
        with io.consistent_cut():
            rooms.write(15, runtime=rt)
            assert count_events(None) == 20
            assert count_events(None, state_only=True) == state_events
            assert count_events(rooms.room_ids[:1]) == in_first_room
        assert count_events(None) == events_written() == 35
    finally:
        rt.close()
        storage_caches().forget()

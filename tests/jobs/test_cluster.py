"""The jobs on a real standalone Spark cluster (a master and a worker from pyspark's
distribution, executors in JVMs of their own), launched through a real Celery worker
process on the suite's Redis, give what ``local[*]`` gives on the same data; Celery beat
fires a job on its schedule.
"""
from __future__ import annotations

import json
import os
import time

import pytest
from django.core.management import call_command
from django.db import connection

from jobs.models import JobRun
from testing.celery_client import client_of, wait_idle
from testing.processes import ProcessGroup, database_url

#: four JVMs per job on the cluster (the master, the worker, the executor, the job's driver)
#: beside the suite's other process: on a loaded 2-core machine this file's first test,
#: fixture start-up included, has taken over the default 300 s
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(900)]

#: the checks first (they see the damage), then the recomputations that repair it
JOBS = ("check_topological_ordering", "check_visibility", "topological_ordering", "visibility")


@pytest.fixture(scope="module")
def cluster_celery(tmp_path_factory, django_db_setup, django_db_blocker, redis_server, spark_cluster):
    """A Celery worker process (solo pool, one task at a time) whose jobs' driver runs on the
    standalone cluster; the ProcessGroup, so a test can start beat beside it."""
    pg_url = database_url()
    tmp_path = tmp_path_factory.mktemp("celery_cluster")
    group = ProcessGroup(tmp_path)
    group.env = {**os.environ, "DATABASE_URL": pg_url, "REDIS_URL": redis_server.url,
                 "STATE_DIR": str(tmp_path / "state"), "SPARK_MASTER": spark_cluster.url,
                 "SPARK_AUTH_SECRET": spark_cluster.secret,  # the cluster authenticates its drivers
                 "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DRIVER_MEMORY": "1g", "SPARK_SHUFFLE_PARTITIONS": "2",
                 "SPARK_EXECUTOR_MEMORY": "1g",
                 "JOBS_RECOMPUTE_CRON": "", "JOBS_CHECK_CRON": "", "JOBS_CHAIN_COVER_CHECK_CRON": ""}
    group.start("celery", "-m", "celery", "-A", "synapse_repl", "worker", "--pool", "solo",
                "--prefetch-multiplier", "1", "--loglevel", "INFO", "-Q", "celery", "--without-heartbeat",
                "--without-mingle", "--without-gossip")
    try:
        with client_of(redis_server.url):
            yield group
    finally:
        group.stop()


@pytest.fixture(autouse=True)
def worker_idle_at_the_end(transactional_db, cluster_celery):
    """Each test ends with the worker idle, before its database is flushed (a job still running
    would hold the flush back, and the flush its reads)."""
    yield
    from jobs.celery_app import app

    if not wait_idle(app):
        cluster_celery.stop()  # its connections go, so the flush can proceed
        pytest.fail("the Celery worker still ran a job 300 s after the test", pytrace=False)


def wait_holding_nothing(app, timeout: float = 300.0) -> bool:
    """Until the worker neither runs nor has reserved a task (True), or ``timeout`` (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inspect = app.control.inspect(timeout=2)
        active, reserved = inspect.active(), inspect.reserved()
        if active is not None and reserved is not None and not any(active.values()) and not any(reserved.values()):
            return True
        time.sleep(0.2)
    return False


def through_celery(job: str) -> JobRun:
    from jobs.tasks import run_job_task

    answer = run_job_task.apply_async(args=(job,), kwargs={"trigger": "test"}).get(timeout=600)
    return JobRun.objects.get(pk=answer["run"])


def outcome(run: JobRun) -> tuple:
    """What a run found and did, by value (its sample in a stable order)."""
    sample = sorted(json.dumps(d, sort_keys=True, default=str) for d in run.difference_sample)
    return run.status, run.error, run.rows_in, run.rows_out, run.differences, sample


def stored() -> dict[str, list[tuple]]:
    """Every value the jobs read or write, in a stable order."""
    queries = {
        "events": "SELECT event_id, topological_ordering, depth FROM events ORDER BY event_id",
        "memberships": "SELECT event_id, topological_ordering FROM room_memberships ORDER BY event_id",
        "ranges": "SELECT room_id, user_id, start_topological, start_stream, end_topological, end_stream "
                  "FROM room_visibility_ranges ORDER BY 1, 2, 3, 4",
    }
    with connection.cursor() as cursor:
        out = {}
        for name, sql in queries.items():
            cursor.execute(sql)
            out[name] = cursor.fetchall()
        return out


def restore(state: dict[str, list[tuple]]) -> None:
    with connection.cursor() as cursor:
        cursor.executemany("UPDATE events SET topological_ordering = %s, depth = %s WHERE event_id = %s",
                           [(t, d, e) for e, t, d in state["events"]])
        cursor.executemany("UPDATE room_memberships SET topological_ordering = %s WHERE event_id = %s",
                           [(t, e) for e, t in state["memberships"]])
        cursor.execute("DELETE FROM room_visibility_ranges")
        cursor.executemany("INSERT INTO room_visibility_ranges (room_id, user_id, start_topological, start_stream, "
                           "end_topological, end_stream) VALUES (%s, %s, %s, %s, %s, %s)", state["ranges"])


def damage() -> str:
    """Orderings changed behind the persist path's back, a user's range lost, an intruder's
    gained; returns the user who lost one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT event_id FROM events ORDER BY stream_ordering")
        events = [e for (e,) in cursor.fetchall()]
        cursor.execute("UPDATE events SET topological_ordering = topological_ordering + 1000, depth = depth + 1000 "
                       "WHERE event_id = ANY(%s)", [[events[3], events[len(events) // 2], events[-2]]])
        cursor.execute("SELECT room_id, user_id, start_topological, start_stream FROM room_visibility_ranges "
                       "ORDER BY 1, 2, 3, 4")
        ranges = cursor.fetchall()
        # a range that starts at the user's latest join (the *shared eras stop before it:
        # losing a range inside them would change nothing a read shows)
        cursor.execute("SELECT DISTINCT ON (room_id, user_id) room_id, user_id, topological_ordering, "
                       "event_stream_ordering FROM room_memberships WHERE membership = 'join' "
                       "ORDER BY room_id, user_id, topological_ordering DESC, event_stream_ordering DESC")
        joins = set(cursor.fetchall())
        at_join = [r for r in ranges if r in joins]
        victim = at_join[len(at_join) // 3]
        cursor.execute("DELETE FROM room_visibility_ranges WHERE room_id = %s AND user_id = %s "
                       "AND start_topological = %s AND start_stream = %s", victim)
        cursor.execute("INSERT INTO room_visibility_ranges (room_id, user_id, start_topological, start_stream, "
                       "end_topological, end_stream) VALUES (%s, '@intruder:hs', 0, -9999999, NULL, NULL)",
                       [ranges[0][0]])
    return victim[1]


def test_jobs_and_checks_on_the_cluster_match_local(cluster_celery, spark_cluster, spark):
    from jobs.runner import run_job

    call_command("generate_rooms", rooms=6, users=16, events=400, seed=21, batch=200, no_progress=True)
    victim = damage()
    damaged = stored()

    on_cluster = {job: outcome(through_celery(job)) for job in JOBS}
    after_cluster = stored()
    assert any(name.startswith("synapse_repl jobs") for name in spark_cluster.applications()), \
        spark_cluster.master_state()

    restore(damaged)
    assert stored() == damaged
    local = {job: outcome(run_job(job, trigger="test")) for job in JOBS}  # the suite's local[2]
    after_local = stored()

    for job in JOBS:
        assert on_cluster[job] == local[job], job
    assert after_cluster == after_local
    # ... and both did the work: they saw the damage and repaired it
    assert all(o[0] == JobRun.Status.SUCCEEDED for o in local.values())
    assert local["check_topological_ordering"][4] == 3
    users = {json.loads(d)["user_id"] for d in local["check_visibility"][5]}
    assert {"@intruder:hs", victim} <= users
    assert local["topological_ordering"][3] == 3
    assert after_local["events"] != damaged["events"] and after_local["ranges"] != damaged["ranges"]


def test_beat_fires_a_job_on_its_schedule(cluster_celery):
    call_command("generate_rooms", rooms=2, users=5, events=60, seed=22, batch=60, no_progress=True)
    beat = cluster_celery.start(
        "beat", "-m", "celery", "-A", "synapse_repl", "beat", "--loglevel", "INFO",
        "-s", str(cluster_celery.tmp / "beat-schedule"),
        env={"JOBS_CHECK_CRON": "@every 2s", "JOBS_RECOMPUTE_CRON": ""})
    try:
        deadline = time.monotonic() + 180
        while not JobRun.objects.filter(trigger="beat", status=JobRun.Status.SUCCEEDED).exists():
            assert beat.poll() is None, (cluster_celery.tmp / "beat.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (cluster_celery.tmp / "beat.log").read_text()[-3000:]
            time.sleep(0.2)
    finally:
        beat.terminate()
        beat.wait(timeout=20)
    from jobs.celery_app import app

    app.control.purge()  # what beat queued since; then the worker ends what it holds
    assert wait_holding_nothing(app), "the Celery worker still held beat's tasks 300 s after beat stopped"
    run = JobRun.objects.filter(trigger="beat", status=JobRun.Status.SUCCEEDED).earliest("started_at")
    assert run.job in ("check_topological_ordering", "check_visibility")
    assert run.rows_in == 60 and run.differences == 0
    assert "Scheduler: Sending due task hourly" in (cluster_celery.tmp / "beat.log").read_text()


def test_chain_cover_jobs_on_the_cluster_match_local(cluster_celery, spark_cluster, spark):
    """check_chain_cover and rebuild_chain_cover, through Celery on the cluster and on local[2],
    on the same damaged index: the same outcomes and the same repaired index."""
    from jobs.runner import run_job
    from rooms.matrix.chain_index import canonical
    from tests.jobs.test_chain_cover_job import damage
    from tests.rooms.storage.chain_helpers import generated_room, store_room, stored_rows

    for room in (generated_room("10", seed=31, n=30), generated_room("12", seed=32, n=30)):
        store_room(room)
    healthy = canonical(*stored_rows())
    damage()
    with connection.cursor() as cursor:
        cursor.execute("SELECT room_id, event_id, chain_id, sequence_number FROM event_auth_chains")
        damaged_positions = cursor.fetchall()
        cursor.execute("SELECT room_id, origin_chain_id, origin_sequence_number, target_chain_id, "
                       "target_sequence_number FROM event_auth_chain_links")
        damaged_links = cursor.fetchall()

    jobs = ("check_chain_cover", "rebuild_chain_cover")
    on_cluster = {job: outcome(through_celery(job)) for job in jobs}
    after_cluster = canonical(*stored_rows())
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM event_auth_chains")
        cursor.execute("DELETE FROM event_auth_chain_links")
        cursor.executemany("INSERT INTO event_auth_chains (room_id, event_id, chain_id, sequence_number) "
                           "VALUES (%s, %s, %s, %s)", damaged_positions)
        cursor.executemany("INSERT INTO event_auth_chain_links (room_id, origin_chain_id, origin_sequence_number, "
                           "target_chain_id, target_sequence_number) VALUES (%s, %s, %s, %s, %s)", damaged_links)
    local = {job: outcome(run_job(job, trigger="test")) for job in jobs}
    assert on_cluster == local
    assert local["check_chain_cover"][4] == 3 and local["rebuild_chain_cover"][0] == JobRun.Status.SUCCEEDED
    assert after_cluster == canonical(*stored_rows()) == healthy

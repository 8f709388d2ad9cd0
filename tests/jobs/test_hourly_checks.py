"""The hourly checks, as full mode runs them, against a cluster that is writing.

The Celery worker with its embedded beat that ``runservice`` starts in full mode (the same
command line, :func:`job_worker_args`) on the suite's PostgreSQL and a Redis of the test's own,
with every check of the job registry on an ``@every`` schedule in place of the hourly one;
two event writers (``write_facts events`` as ``w1`` and ``w2`` of ``STREAM_WRITERS=events=w1,w2``)
write for the whole test. Every check runs at least twice through beat while they write and
finds nothing; damage made then is found by the next scheduled run of each check, exactly.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest
from django.utils import timezone

from jobs.job_registry import built_in_jobs
from jobs.models import JobRun
from rooms.storage.caches import storage_caches
from rooms.storage.synthetic import LiveRooms
from streams.conf import stream_writers
from streams.runtime import StreamRuntime
from synapse_repl.management.commands.runservice import job_worker_args
from testing.process_tree import descendants, kill_all, wait_all_gone
from testing.processes import ProcessGroup, tail
from tests.jobs.test_checks_under_writes import damage, events_written, named, seed_rooms
from tests.rooms.storage.helpers import rows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: every check the registry has (a new check is scheduled hourly too: settings.JOB_SCHEDULES)
CHECKS = sorted(name for name in built_in_jobs() if name.startswith("check_"))
#: the hourly schedule, made seconds (one worker runs one job at a time: the runs queue up
#: when a round of checks takes longer)
EVERY = "@every 3s"
#: events a second per writer: two runs of one check are seconds apart (the other checks run
#: between them, each a Spark job), so dozens of events, state events among them (the ones
#: check_chain_cover counts), come between; each event costs its writer and PostgreSQL about
#: 30 ms of CPU
RATE = 3
#: how long a condition may take on a loaded machine (two cores shared with other suites)
DEADLINE = 400


def beat_runs(job: str) -> list[JobRun]:
    return list(JobRun.objects.filter(job=job, trigger="beat").order_by("started_at", "pk"))


def finished(runs: list[JobRun]) -> list[JobRun]:
    return [r for r in runs if r.status not in (JobRun.Status.QUEUED, JobRun.Status.RUNNING)]


@pytest.mark.timeout(1200)  # about 60 s on a quiet machine; nine Spark runs on a loaded one
def test_hourly_checks_on_a_writing_cluster_find_nothing_then_exactly_the_damage(pg_url, private_redis, tmp_path):
    assert {"check_topological_ordering", "check_visibility", "check_chain_cover"} <= set(CHECKS)
    # Rooms of their own that the writers never write (their rooms are !live-w1-*, !live-w2-*):
    # the damage goes there, so what each check must name is known.
    seeded = seed_rooms("w1", "postgresql")

    group = ProcessGroup(tmp_path)
    group.env = {k: v for k, v in os.environ.items() if k not in ("INSTANCE_NAME", "JOB_MODULES")}
    group.env.update(DATABASE_URL=pg_url, REDIS_URL=private_redis.url, STATE_DIR=str(tmp_path / "state"),
                     STREAM_WRITERS="events=w1,w2", DJANGO_SETTINGS_MODULE="synapse_repl.settings",
                     SPARK_MASTER="local[2]", SPARK_SHUFFLE_PARTITIONS="2", SPARK_DRIVER_MEMORY="1g",
                     # the checks only: a recomputation would repair the damage it is to find
                     JOBS_CHECK_CRON=EVERY, JOBS_CHAIN_COVER_CHECK_CRON=EVERY, JOBS_RECOMPUTE_CRON="")
    writers = [group.start(name, "manage.py", "write_facts", "events", "--count", "1000000", "--rate", str(RATE),
                           "--no-progress", env={"INSTANCE_NAME": name}) for name in ("w1", "w2")]
    worker = group.start("celery", *job_worker_args(tmp_path / "celerybeat-schedule"))

    def logs() -> str:
        return "\n".join(f"--- {name}\n{tail(tmp_path / f'{name}.log', 40)}" for name in ("celery", "w1", "w2"))

    def wait_until(condition, what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not condition():
            assert all(p.poll() is None for p in [worker, *writers]), f"a process ended:\n{logs()}"
            assert time.monotonic() < deadline, f"{what}: not within {DEADLINE} s\n{logs()}"
            time.sleep(0.2)

    try:
        # Both writers under way, then each check run twice by beat while they write.
        before = events_written()
        wait_until(lambda: all(rows("SELECT count(*) FROM events WHERE room_id LIKE %s", f"!live-{w}-%")[0][0]
                               for w in ("w1", "w2")), "both writers writing")
        wait_until(lambda: all(len(finished(beat_runs(job))) >= 2 for job in CHECKS), "two runs of each check")
        assert events_written() > before
        for job in CHECKS:
            runs = finished(beat_runs(job))
            for run in runs:
                assert (run.status, run.error, run.differences) == (JobRun.Status.SUCCEEDED, "", 0), \
                    (job, run.pk, run.error, run.difference_sample[:5])
            # the writers wrote between the runs: each later run examined more events
            assert [r.rows_in for r in runs] == sorted({r.rows_in for r in runs}), (job, [r.rows_in for r in runs])
        assert all(p.poll() is None for p in writers), logs()

        # Damage, while the writers write: the next scheduled run of each check finds it.
        planted = damage(seeded.room_ids)
        damaged_at = timezone.now()
        wait_until(lambda: all(finished([r for r in beat_runs(job) if r.started_at > damaged_at])
                               for job in CHECKS), "a run of each check after the damage")
        for job in CHECKS:
            runs = finished(beat_runs(job))
            clean = [r for r in runs if r.ended_at < damaged_at]
            assert all(r.differences == 0 for r in clean), job
            after = [r for r in runs if r.started_at > damaged_at]
            room, name = planted[job]
            for run in after:
                assert run.status == JobRun.Status.SUCCEEDED, (job, run.error)
                # all it found is the damage: one room, the damaged event (or user) named
                assert {d["room_id"] for d in run.difference_sample} == {room}, (job, run.difference_sample)
                assert named(job, run.difference_sample, room) == {name}, (job, run.difference_sample)
                assert run.differences == len(run.difference_sample), job
            if job != "check_visibility":  # one row each; a closed range hides every event after it
                assert [r.differences for r in after] == [1] * len(after), job
            assert len({r.differences for r in after}) == 1, (job, [r.differences for r in after])
        assert all(p.poll() is None for p in writers), logs()
    finally:
        tree = descendants(worker.pid)  # its pool process, beat, the job's Spark JVM
        # a cold shutdown: the run in progress is abandoned, not waited for (warm: SIGTERM)
        worker.send_signal(signal.SIGQUIT)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        group.stop()
        left = wait_all_gone(tree, 30)
        kill_all(left)
    assert not left, f"left running after the worker stopped: {left}"


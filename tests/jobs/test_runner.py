"""The runner: every run recorded (success, failure, refusal), one run per job at a time."""
from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.job_registry import JOBS
from jobs.lock import JobLock
from jobs.models import JobRun
from jobs.outcome import Outcome
from jobs.runner import UnknownJob, run_job
from rooms.models import Room

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def test_jobs(spark):
    """Two jobs of this test's own: one that counts rows with Spark, one that fails."""
    def count_job(spark_, rooms):
        df = spark_.createDataFrame([(r,) for r in (rooms or ["!a", "!b", "!c"])], "room_id string")
        return Outcome(rows_in=df.count(), rows_out=0, differences=1, sample=[{"room_id": "!a"}])

    def failing_job(spark_, rooms):
        raise RuntimeError("the database went away")

    JOBS["test_count"], JOBS["test_fail"] = count_job, failing_job
    yield
    JOBS.pop("test_count"), JOBS.pop("test_fail")


def test_success_is_recorded(test_jobs):
    Room.objects.bulk_create([Room(room_id="!x"), Room(room_id="!y")])
    run = run_job("test_count", ["!x", "!y"], trigger="test")
    stored = JobRun.objects.get(pk=run.pk)
    assert stored.status == JobRun.Status.SUCCEEDED
    assert stored.parameters == {"rooms": ["!x", "!y"]}
    assert (stored.rows_in, stored.rows_out, stored.differences) == (2, 0, 1)
    assert stored.difference_sample == [{"room_id": "!a"}]
    assert stored.trigger == "test" and stored.ended_at >= stored.started_at


def test_failure_is_recorded_with_its_error(test_jobs):
    with pytest.raises(RuntimeError):
        run_job("test_fail")
    run = JobRun.objects.get(job="test_fail")
    assert run.status == JobRun.Status.FAILED
    assert "the database went away" in run.error and run.ended_at is not None


def test_two_runs_never_overlap(test_jobs):
    with JobLock("test_count") as held:  # another process's run, as far as the runner can tell
        assert held
        refused = run_job("test_count")
        assert refused.status == JobRun.Status.REFUSED and "holds the lock" in refused.error
        assert refused.rows_in is None
    assert run_job("test_count").status == JobRun.Status.SUCCEEDED  # free again


@pytest.mark.parametrize("using", ["default", "sqlite"])
def test_lock_is_exclusive_and_released(using, settings, tmp_path):
    settings.STATE_DIR = tmp_path
    first, second = JobLock("j", using), JobLock("j", using)
    assert first.acquire()
    assert not second.acquire()
    assert JobLock("other job", using).acquire()
    first.release()
    assert second.acquire()
    second.release()


def test_run_left_running_by_a_dead_process_is_marked_failed(test_jobs):
    dead = JobRun.objects.create(job="test_count", started_at=timezone.now())  # its process died
    run_job("test_count")
    dead.refresh_from_db()
    assert dead.status == JobRun.Status.FAILED and "ended before it finished" in dead.error


def _tables() -> set[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


def test_a_dead_runs_staging_tables_are_dropped_by_the_next_run(test_jobs):
    """A run killed between making its staging table and dropping it leaves the table; the
    next run of the same job holds the lock, so the table is a dead run's: it goes. Another
    job's stays (its run may be alive), and so does a table made outside any run."""
    from django.db import connection

    from jobs import io

    made = []

    def staging_job(spark_, rooms):
        stage = io.Staging.create("x", [("room_id", "text")])
        made.append(stage.name)  # and "killed" here: never dropped
        return Outcome(rows_in=0, rows_out=0, differences=None)

    JOBS["test_stage"] = staging_job
    try:
        unowned = io.Staging.create("x", [("room_id", "text")])  # outside a run
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE job_staging_test_count__x_0123456789 (room_id text)")
        assert run_job("test_stage").status == JobRun.Status.SUCCEEDED
        assert made[0].startswith("job_staging_test_stage__x_") and made[0] in _tables()
        assert run_job("test_stage").status == JobRun.Status.SUCCEEDED
        assert made[0] not in _tables() and made[1] in _tables()
        assert {"job_staging_test_count__x_0123456789", unowned.name} <= _tables()
        run_job("test_count")
        assert "job_staging_test_count__x_0123456789" not in _tables() and unowned.name in _tables()
    finally:
        JOBS.pop("test_stage")
        for table in {t for t in _tables() if t.startswith("job_staging_")}:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TABLE {table}")


def test_unknown_job():
    with pytest.raises(UnknownJob, match="topological_ordering"):
        run_job("no_such_job")


def test_run_job_command(spark):
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command("run_job", "check_visibility", stdout=out)
    assert "check_visibility run #" in out.getvalue() and "succeeded" in out.getvalue()
    with pytest.raises(CommandError, match="unknown job"):
        call_command("run_job", "nope")


def test_a_room_that_does_not_exist_fails_and_says_so(test_jobs):
    """Reading nothing from a room nobody has is not a success: the run fails, naming it."""
    Room.objects.create(room_id="!x")
    run = run_job("test_count", ["!x", "!nowhere:hs"])
    stored = JobRun.objects.get(pk=run.pk)
    assert stored.status == JobRun.Status.FAILED
    assert stored.error.startswith("room !nowhere:hs does not exist")
    assert stored.rows_in is None and stored.ended_at is not None
    assert run_job("test_count", ["!x"]).status == JobRun.Status.SUCCEEDED


def test_run_job_command_on_a_room_that_does_not_exist(spark):
    from io import StringIO

    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="room !nowhere:hs does not exist"):
        call_command("run_job", "check_visibility", "--rooms", "!nowhere:hs", stdout=StringIO())
    run = JobRun.objects.get(job="check_visibility")
    assert run.status == JobRun.Status.FAILED and run.parameters == {"rooms": ["!nowhere:hs"]}


def test_a_record_made_by_the_launcher_is_filled_in(test_jobs):
    """jobs.child makes the record first; the runner fills that one in, even if another run
    took it for a dead process's meanwhile, and refuses a record of another job."""
    Room.objects.create(room_id="!x")
    made = JobRun.objects.create(job="test_count", parameters={"rooms": ["!x"]}, trigger="dashboard (t)",
                                 started_at=timezone.now(), status=JobRun.Status.FAILED, error="ended before...")
    run = run_job("test_count", ["!x"], run=made)
    assert run.pk == made.pk and JobRun.objects.count() == 1
    stored = JobRun.objects.get(pk=made.pk)
    assert (stored.status, stored.error, stored.trigger, stored.rows_in) == (
        JobRun.Status.SUCCEEDED, "", "dashboard (t)", 1)
    with pytest.raises(ValueError, match="not test_fail"):
        run_job("test_fail", ["!x"], run=made)

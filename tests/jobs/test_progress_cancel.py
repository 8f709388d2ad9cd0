"""Jobs you can watch: Spark's stages and tasks reach the JobRun while it runs, and a cancel
asked for on the record stops the run's Spark jobs and ends it "cancelled"."""
from __future__ import annotations

import threading
import time

import pytest

from jobs.job_registry import JOBS
from jobs.models import JobRun
from jobs.monitor import summary
from jobs.outcome import Outcome
from jobs.runner import run_job

pytestmark = pytest.mark.django_db(transaction=True)


def _slow_tasks(spark_, seconds_per_task: float, tasks: int = 8) -> int:
    """A real Spark job on local[2]: ``tasks`` tasks that each take a while."""
    def slow(rows):
        time.sleep(seconds_per_task)
        return [sum(1 for _ in rows)]
    return sum(spark_.sparkContext.parallelize(range(tasks * 10), tasks).mapPartitions(slow).collect())


@pytest.fixture
def watched_jobs(spark):
    def slow_job(spark_, rooms):
        return Outcome(rows_in=_slow_tasks(spark_, 0.3))

    def endless_job(spark_, rooms):
        return Outcome(rows_in=_slow_tasks(spark_, 60))

    def slower_job(spark_, rooms):  # about 4 s on 2 cores: several of run_job's 1 s polls
        return Outcome(rows_in=_slow_tasks(spark_, 1.0))

    def reusing_job(spark_, rooms):  # its second action reuses the first's shuffle: a skipped stage
        counts = spark_.sparkContext.parallelize(range(40), 4).map(lambda n: (n % 3, 1)).reduceByKey(
            lambda a, b: a + b, 2)
        counts.count()
        return Outcome(rows_in=len(counts.collect()))

    JOBS["test_slow"], JOBS["test_endless"], JOBS["test_slower"] = slow_job, endless_job, slower_job
    JOBS["test_reusing"] = reusing_job
    yield
    JOBS.pop("test_slow"), JOBS.pop("test_endless"), JOBS.pop("test_slower"), JOBS.pop("test_reusing")


def test_progress_shows_stages_and_tasks_while_running(watched_jobs):
    seen: list[dict] = []
    run = run_job("test_slow", trigger="test", progress_interval=0.2, on_progress=seen.append)
    assert run.status == JobRun.Status.SUCCEEDED and run.rows_in == 80
    # while it ran: a stage of 8 tasks with some but not all done
    partial = [p for p in seen if p["stages"] and 0 < p["done"] < p["tasks"]]
    assert partial, seen
    assert partial[0]["tasks"] == 8
    # written to the record, ending with every task done
    stored = JobRun.objects.get(pk=run.pk)
    assert stored.progress["stages"][0]["tasks"] == 8
    assert stored.progress["done"] == stored.progress["tasks"] == 8
    assert summary(stored.progress) == "stages 1/1, tasks 8/8"
    assert stored.spark_ui_url == ""  # the link is only shown while the run is alive


def test_cancel_ends_a_running_job_cancelled(watched_jobs):
    from django.db import connection

    def run_endless():
        try:
            run_job("test_endless", trigger="test", progress_interval=0.2)
        finally:
            connection.close()  # this thread's connection, so the test database can be dropped

    worker = threading.Thread(target=run_endless)
    worker.start()
    deadline = time.monotonic() + 60  # a safety net for a broken run, not a performance claim
    while time.monotonic() < deadline:
        running = JobRun.objects.filter(job="test_endless", status=JobRun.Status.RUNNING).first()
        if running and running.progress.get("tasks"):
            break
        time.sleep(0.1)
    assert running is not None and running.spark_ui_url.startswith("http")
    from django.core.management import call_command

    call_command("cancel_job", str(running.pk))
    worker.join(timeout=60)
    assert not worker.is_alive(), "the job did not notice the cancel"
    stored = JobRun.objects.get(pk=running.pk)
    assert stored.status == JobRun.Status.CANCELLED and stored.cancel_requested
    assert stored.ended_at is not None and stored.progress["done"] < 8


def test_cancel_job_refuses_a_run_that_is_not_running(db):
    from django.core.management import CommandError, call_command
    from django.utils import timezone

    done = JobRun.objects.create(job="x", status=JobRun.Status.SUCCEEDED, started_at=timezone.now())
    with pytest.raises(CommandError, match="not running"):
        call_command("cancel_job", str(done.pk))
    with pytest.raises(CommandError, match="no job run"):
        call_command("cancel_job", "999999")


def test_run_job_prints_progress_while_running(watched_jobs):
    import io

    from django.core.management import call_command

    out, err = io.StringIO(), io.StringIO()
    call_command("run_job", "test_slower", stdout=out, stderr=err)
    lines = [line for line in err.getvalue().splitlines() if line.startswith("progress: ")]
    assert "progress: stages 1/1, tasks 8/8" in lines
    assert any("tasks 0/8" not in line and "tasks 8/8" not in line for line in lines), lines  # a midway count
    assert "succeeded" in out.getvalue()


def test_a_finished_run_shows_its_final_progress_skipped_stages_included(watched_jobs):
    """A stage Spark skips (its output reused from an earlier job) never runs a task: a
    succeeded run counts it finished, never "stages 3/4" as if a stage were left."""
    run = run_job("test_reusing", trigger="test", progress_interval=0.2)
    assert run.status == JobRun.Status.SUCCEEDED and run.rows_in == 3
    stored = JobRun.objects.get(pk=run.pk)
    assert len(stored.progress["stages"]) == 4
    assert [s["skipped"] for s in stored.progress["stages"]].count(True) == 1
    assert summary(stored.progress) == "stages 4/4, tasks 8/8"

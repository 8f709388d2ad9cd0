"""Runs whose process is gone end failed ("interrupted"): the decision by value, and a real
``run_job`` process killed with ``kill -9`` swept within a bounded poll."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from jobs.liveness import gone_reason, sweep
from jobs.models import JobRun
from testing.processes import ROOT

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
HERE = "this-host"


def a_run(**fields) -> JobRun:
    values = dict(job="j", status=JobRun.Status.RUNNING, started_at=NOW - timedelta(seconds=30),
                  host=HERE, pid=4242, heartbeat_at=NOW - timedelta(seconds=1))
    values.update(fields)
    return JobRun(**values)


def test_a_run_here_whose_pid_is_gone_is_interrupted_at_once():
    reason = gone_reason(a_run(), NOW, here=HERE, pid_alive=False, stale_after=120)
    assert reason == "interrupted: its process (pid 4242 on this-host) ended before recording an outcome"


def test_a_run_here_whose_pid_lives_is_alive_however_quiet():
    quiet = a_run(heartbeat_at=NOW - timedelta(hours=3))  # a JVM still starting, a long pause
    assert gone_reason(quiet, NOW, here=HERE, pid_alive=True, stale_after=120) is None


def test_a_run_elsewhere_is_judged_by_its_heartbeat():
    fresh = a_run(host="other", heartbeat_at=NOW - timedelta(seconds=119))
    stale = a_run(host="other", heartbeat_at=NOW - timedelta(seconds=121))
    assert gone_reason(fresh, NOW, here=HERE, pid_alive=None, stale_after=120) is None
    assert gone_reason(stale, NOW, here=HERE, pid_alive=None, stale_after=120) == (
        "interrupted: no sign of life from pid 4242 on other for 121 s (JOBS_HEARTBEAT_STALE_SECONDS)")


def test_a_run_with_no_process_yet_is_judged_by_its_start():
    launched = a_run(host="", pid=None, heartbeat_at=None)  # made by a launcher, child not started yet
    assert gone_reason(launched, NOW, here=HERE, pid_alive=None, stale_after=120) is None
    old = a_run(host="", pid=None, heartbeat_at=None, started_at=NOW - timedelta(seconds=500))
    assert gone_reason(old, NOW, here=HERE, pid_alive=None, stale_after=120).startswith("interrupted: no sign")


def test_a_finished_run_is_never_gone():
    for status in (JobRun.Status.SUCCEEDED, JobRun.Status.FAILED, JobRun.Status.CANCELLED):
        done = a_run(status=status, host="other", heartbeat_at=NOW - timedelta(days=1))
        assert gone_reason(done, NOW, here=HERE, pid_alive=False, stale_after=120) is None


def run_job_process(job: str, *args: str) -> subprocess.Popen:
    """``manage.py run_job`` on the test database, in a process group of its own (its JVM in it)."""
    from jobs.child import child_environment

    env = child_environment()
    env.update(JOB_MODULES="tests.dashboard.browser_jobs", PYTHONUNBUFFERED="1", SPARK_MASTER="local[1]")
    return subprocess.Popen([sys.executable, "manage.py", "run_job", job, *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout  # a safety net for a broken run, not a speed claim
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.django_db(transaction=True)
def test_a_killed_run_job_process_is_swept_failed_interrupted():
    process = run_job_process("test_endless")
    try:
        run = wait_for(lambda: JobRun.objects.filter(job="test_endless", pid=process.pid).first(), 120,
                       "run_job never recorded its run")
        assert sweep() == []  # alive: left alone
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        swept = wait_for(sweep, 30, "the sweep never took the dead run")
        assert swept == [run.pk]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.stdout.close(), process.stderr.close()
    stored = JobRun.objects.get(pk=run.pk)
    assert stored.status == JobRun.Status.FAILED and stored.ended_at is not None
    assert stored.error.startswith("interrupted: its process (pid ")


@pytest.mark.django_db(transaction=True)
def test_ctrl_c_of_run_job_prints_one_line_and_records_the_run_interrupted():
    """Ctrl-C in the terminal: SIGINT to the foreground process group (run_job, and its JVM)."""
    process = run_job_process("test_endless")
    try:
        run = wait_for(lambda: JobRun.objects.filter(job="test_endless", pid=process.pid,
                                                     progress__tasks__gt=0).first(), 180,
                       "run_job never got its Spark job going")
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    err_text = err.decode(errors="replace")
    print(err_text)
    after = err_text.split("progress: ")[-1].splitlines()[1:]  # what it printed once interrupted
    assert "Traceback" not in err_text and "py4j" not in err_text.lower(), err_text[-5000:]
    assert after == [f"run_job: interrupted; test_endless run #{run.pk} recorded failed (interrupted)"], after
    assert process.returncode == 130
    stored = JobRun.objects.get(pk=run.pk)
    assert stored.status == JobRun.Status.FAILED and stored.ended_at is not None
    assert stored.error.startswith("interrupted")


@pytest.mark.django_db(transaction=True)
def test_the_services_sweeper_marks_dead_runs_at_start_and_while_it_runs(settings):
    """runservice's sweeper: a run left by a dead process before the service started, and one
    whose process dies while it runs, both end failed ("interrupted") within a bounded poll."""
    from django.utils import timezone as django_timezone

    from jobs.liveness import this_host
    from synapse_repl.management.commands.runservice import start_run_sweeper

    def dead_pid() -> int:
        gone = subprocess.Popen(["true"])
        gone.wait()
        return gone.pid

    def dead_run() -> JobRun:
        return JobRun.objects.create(job="j", started_at=django_timezone.now(), host=this_host(), pid=dead_pid(),
                                     heartbeat_at=django_timezone.now())

    def interrupted(run: JobRun) -> bool:
        run.refresh_from_db()
        return run.status == JobRun.Status.FAILED and run.error.startswith("interrupted")

    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "JOBS_SWEEP_SECONDS": 0.2}
    before = dead_run()
    alive = JobRun.objects.create(job="k", started_at=django_timezone.now(), host=this_host(), pid=os.getpid())
    stop = start_run_sweeper()
    try:
        wait_for(lambda: interrupted(before), 30, "the sweep at start missed a dead run")
        later = dead_run()
        wait_for(lambda: interrupted(later), 30, "the periodic sweep missed a dead run")
    finally:
        stop.set()
        import threading

        for thread in threading.enumerate():
            if thread.name == "job-run-sweeper":
                thread.join(timeout=30)  # its database connection closed before the test's is dropped
    alive.refresh_from_db()
    assert alive.status == JobRun.Status.RUNNING  # its process (this one) lives

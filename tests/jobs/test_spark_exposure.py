"""What a running job listens on: a real ``manage.py run_job`` process on ``local[1]`` and on the
standalone cluster, its sockets read from /proc while its Spark tasks run. Nothing of the job's
process tree (nor the cluster's executor) listens beyond loopback; the UI the dashboard links
to answers there, without kill, thread-dump or heap-histogram pages; the cluster refuses a
driver without its secret, which no command line shows.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from jobs.models import JobRun
from testing.processes import ROOT, tail
from testing.sockets import descendants, listening_sockets

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: the operator's settings this test leaves at their defaults
OPERATOR_SETTINGS = ("SPARK_LOCAL_IP", "SPARK_UI_HOST", "SPARK_UI_PORT", "SPARK_AUTH_SECRET", "SPARK_MASTER")

DEADLINE = 300  # a safety net on a loaded 2-core machine (a JVM start took 40 s there), not a claim


def start_endless_job(tmp_path: Path, pg_url: str, **env: str) -> subprocess.Popen:
    """``manage.py run_job test_endless`` (tests/dashboard/browser_jobs.py: tasks that take a
    minute each) as the dashboard's child runs it, with the operator's defaults."""
    base = {k: v for k, v in os.environ.items() if k not in OPERATOR_SETTINGS}
    base.update(DATABASE_URL=pg_url, STATE_DIR=str(tmp_path / "state"), JOB_MODULES="tests.dashboard.browser_jobs",
                SPARK_DRIVER_MEMORY="1g", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "manage.py", "run_job", "test_endless"], cwd=ROOT, env={**base, **env},
                            stdout=open(tmp_path / "job.log", "wb"), stderr=subprocess.STDOUT)


def running_tasks(job: subprocess.Popen, log: Path) -> JobRun:
    """The job's record once its Spark tasks run (its driver and executors are all up)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        run = JobRun.objects.filter(job="test_endless").first()
        if run is not None and run.status == JobRun.Status.RUNNING and run.progress.get("tasks"):
            return run
        assert job.poll() is None, tail(log)
        assert time.monotonic() < deadline, tail(log)
        time.sleep(0.2)


def cancel(job: subprocess.Popen) -> None:
    """Cancel the run as an operator does and wait for its process to end (killed if it has
    recorded no run to cancel)."""
    if JobRun.objects.filter(job="test_endless").update(cancel_requested=True):
        try:
            job.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            pass
    if job.poll() is None:
        job.kill()
        job.wait()


def assert_loopback_only(pid: int, least: int) -> list:
    """``pid`` and every process below it listen on loopback only; ``least``: Java sockets
    the tree must have (so that the test sees what it looks for)."""
    tree = {pid: Path(f"/proc/{pid}/comm").read_text().strip(), **descendants(pid)}
    listeners = listening_sockets(tree)
    java = [s for s in listeners if s.command == "java"]
    assert len(java) >= least, [str(s) for s in listeners]  # found what it looks for
    exposed = [str(s) for s in listeners if not s.loopback]
    assert not exposed, f"listening beyond loopback: {exposed} (all: {[str(s) for s in listeners]})"
    return listeners


def assert_ui_on_loopback_without_controls(run: JobRun, listeners: list) -> None:
    url = run.spark_ui_url
    assert url.startswith("http://127.0.0.1:"), url
    port = int(url.rsplit(":", 1)[1])
    assert port in {s.port for s in listeners if s.command == "java"}  # the job's own UI
    assert requests.get(f"{url}/jobs/", timeout=30).status_code == 200  # the dashboard's link works
    # no thread dump, no heap histogram (either page would name these; /executors/* is the
    # executors' table when they are off)
    dump = requests.get(f"{url}/executors/threadDump/?executorId=driver", timeout=30).text
    histogram = requests.get(f"{url}/executors/heapHistogram/?executorId=driver", timeout=30).text
    assert "Reference Handler" not in dump and "java.lang.String" not in histogram
    # the kill links do nothing: the run's Spark job and stage still run after them
    [stage] = run.progress["stages"]
    for page in (f"/stages/stage/kill/?id={stage['id']}", f"/jobs/job/kill/?id={stage['job']}"):
        requests.post(url + page, timeout=30, allow_redirects=False)
    [app] = requests.get(f"{url}/api/v1/applications", timeout=30).json()
    jobs = requests.get(f"{url}/api/v1/applications/{app['id']}/jobs", timeout=30).json()
    assert [j["status"] for j in jobs if j["jobId"] == stage["job"]] == ["RUNNING"], jobs


def test_a_local_job_listens_on_loopback_only(pg_url, tmp_path):
    job = start_endless_job(tmp_path, pg_url, SPARK_MASTER="local[1]")
    try:
        run = running_tasks(job, tmp_path / "job.log")
        # the driver's RPC, its block manager and its UI, all in the job's JVM
        listeners = assert_loopback_only(job.pid, least=3)
        assert_ui_on_loopback_without_controls(run, listeners)
    finally:
        cancel(job)
    assert JobRun.objects.get(job="test_endless").status == JobRun.Status.CANCELLED


def test_a_cluster_job_listens_on_loopback_only_and_keeps_its_secret_off_command_lines(
        pg_url, tmp_path, spark_cluster):
    job = start_endless_job(tmp_path, pg_url, SPARK_MASTER=spark_cluster.url, SPARK_AUTH_SECRET=spark_cluster.secret,
                            SPARK_EXECUTOR_MEMORY="512m")
    try:
        run = running_tasks(job, tmp_path / "job.log")
        listeners = assert_loopback_only(job.pid, least=3)
        assert_ui_on_loopback_without_controls(run, listeners)
        # the worker (2) and the executor it launched for the job (1, and its Python workers)
        executor = assert_loopback_only(spark_cluster.worker.pid, least=3)
        jvms = {s.pid for s in listeners + executor if s.command == "java"}
        for pid in jvms | set(descendants(job.pid)) | {job.pid}:
            try:
                command_line = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            assert spark_cluster.secret not in command_line, pid
        driver_jvm = next(s.pid for s in listeners if s.command == "java")
        assert "spark.authenticate=true" in Path(f"/proc/{driver_jvm}/cmdline").read_bytes().decode()
    finally:
        cancel(job)
    assert JobRun.objects.get(job="test_endless").status == JobRun.Status.CANCELLED


def test_the_cluster_refuses_a_driver_without_its_secret(spark_cluster, tmp_path):
    """An intruder's plain pyspark driver (no ``spark.authenticate``): the master does not let
    it register, so it gets no executor to run code on. (Its JVM starts as the suite's drivers
    do, from their JVM options: what it sends the master is the same either way.)"""
    from jobs.session import DEFAULT_JAVA_OPTIONS

    java_options = os.environ.get("SPARK_JAVA_OPTIONS", DEFAULT_JAVA_OPTIONS)
    code = ("from pyspark.sql import SparkSession\n"
            f"spark = SparkSession.builder.master({spark_cluster.url!r}).appName('intruder')"
            f".config('spark.driver.extraJavaOptions', {java_options!r})"
            ".config('spark.ui.enabled', 'false').config('spark.driver.host', '127.0.0.1')"
            ".config('spark.driver.bindAddress', '127.0.0.1').getOrCreate()\n"
            "print('REGISTERED', spark.sparkContext.parallelize(range(4), 2).count(), flush=True)\n")
    log = tmp_path / "intruder.log"
    env = {k: v for k, v in os.environ.items() if k not in OPERATOR_SETTINGS}
    intruder = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=open(log, "wb"),
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + DEADLINE
        while "Failed to connect to master" not in log.read_text(errors="replace"):
            assert "REGISTERED" not in log.read_text(errors="replace"), tail(log)
            assert intruder.poll() is None and time.monotonic() < deadline, tail(log)
            time.sleep(0.2)
        assert "intruder" not in spark_cluster.applications(), spark_cluster.master_state()
        assert "REGISTERED" not in log.read_text(errors="replace")
    finally:
        intruder.kill()
        intruder.wait()

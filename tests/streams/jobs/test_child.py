"""Jobs in a child process: a job started from the dashboard on the embedded default leaves
no JVM in the web process, and a child that dies without recording is recorded anyway."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from testing.accounting import rss_kib
from testing.processes import ROOT, wait_port
from testing.services import free_port

PASSWORD = "child-job-test-password"


def descendants(pid: int) -> dict[int, str]:
    """pid -> command name of every live process below ``pid``."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        parents[int(entry)] = int(rest.split()[1])
        names[int(entry)] = head.split("(", 1)[1]
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = names[child]
                frontier.append(child)
    return found


@pytest.fixture
def embedded_web(tmp_path):
    """The web process as ``make run`` serves it on the embedded default (SQLite, eager Celery,
    ``local[*]``): daphne, with a superuser to sign in as."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SPARK_MASTER")}
    env.update(STATE_DIR=str(tmp_path), DEMO="0", PYTHONUNBUFFERED="1", ADMIN_PASSWORD=PASSWORD,
               SPARK_MASTER="local[1]", DJANGO_SETTINGS_MODULE="synapse_repl.settings")
    for command in (["migrate", "--noinput", "-v", "0"], ["ensure_admin"]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True, timeout=300,
                       capture_output=True)
    port = free_port()
    log = tmp_path / "daphne.log"
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "synapse_repl.asgi:application"], cwd=ROOT, env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc, log, timeout=60)
        yield f"http://127.0.0.1:{port}", proc, tmp_path / "db.sqlite3"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.slow
def test_dashboard_job_leaves_no_jvm_in_the_web_process(embedded_web):
    base, web, db = embedded_web
    session = requests.Session()
    session.get(f"{base}/admin/login/", timeout=30)
    signed_in = session.post(f"{base}/admin/login/?next=/", timeout=30, data={
        "username": "admin", "password": PASSWORD, "next": "/",
        "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    assert signed_in.ok and "Job runs" in signed_in.text
    rss_before = rss_kib(web.pid)

    started = session.post(f"{base}/jobs/start", timeout=30, data={"job": "check_topological_ordering"},
                           headers={"X-CSRFToken": session.cookies["csrftoken"]}, allow_redirects=False)
    assert started.status_code == 302, started.text[-2000:]
    jvm_below_a_child = False
    deadline = time.monotonic() + 240
    while True:
        below = descendants(web.pid)
        # while it runs, the JVM is the job's child process's, never the web process's own child
        assert "java" not in {name for pid, name in below.items() if _ppid(pid) == web.pid}, below
        jvm_below_a_child |= "java" in below.values()
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT status, trigger, rows_in, error FROM job_runs").fetchone()
        if row is not None and row[0] != "running" and not below:
            break
        assert time.monotonic() < deadline, (row, below)
        time.sleep(0.2)
    status, trigger, rows_in, error = row
    assert (status, trigger, rows_in) == ("succeeded", "dashboard (admin)", 0), error
    assert jvm_below_a_child  # the job did start a JVM: in its own process, which has ended
    assert descendants(web.pid) == {}
    # no py4j gateway in the web process: its own child would be the JVM (checked above), and
    # its memory did not take in a driver (informative; the JVM's absence is the assertion)
    print(f"web process RSS {rss_before / 1024:.0f} MiB before the job, {rss_kib(web.pid) / 1024:.0f} MiB after")


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


@pytest.mark.django_db(transaction=True)
def test_a_child_that_dies_before_recording_is_recorded_failed():
    from streams.jobs.child import create_run, run_in_child
    from streams.models import JobRun, Room

    Room.objects.create(room_id="!r:hs")  # a room that exists: only the kill can fail this run
    run = create_run("check_visibility", ["!r:hs"], "test")
    ended = run_in_child(run, timeout=0.3)  # killed while it still starts up
    stored = JobRun.objects.get(pk=run.pk)
    assert ended.status == stored.status == JobRun.Status.FAILED
    assert "was killed after 0 s before recording an outcome" in stored.error and stored.ended_at


@pytest.mark.django_db(transaction=True)
def test_a_child_runs_log_is_kept_and_viewable(admin_client, settings, tmp_path):
    from streams.jobs.child import create_run, log_path, run_in_child

    settings.STATE_DIR = tmp_path
    run = create_run("no_such_job", None, "test")
    assert admin_client.get(f"/jobs/{run.pk}/log").status_code == 404  # nothing kept yet
    run_in_child(run, timeout=120)
    assert "unknown job 'no_such_job'" in log_path(run.pk).read_text()
    page = admin_client.get(f"/jobs/{run.pk}/log")
    assert page.status_code == 200 and "unknown job 'no_such_job'" in page.content.decode()
    from dashboard.jobs import recent_job_runs

    assert recent_job_runs()[0]["has_log"]


@pytest.mark.slow
def test_a_killed_web_process_takes_its_running_job_and_jvm_with_it(embedded_web):
    """``kill -9`` of the web process while a dashboard job runs in its child: the child and
    the child's JVM end too (the child is on the web process's lifeline, synapse_repl/lifeline.py)."""
    from testing.process_tree import descendants as tree_below
    from testing.process_tree import kill_all, wait_all_gone

    base, web, _db = embedded_web
    session = requests.Session()
    session.get(f"{base}/admin/login/", timeout=30)
    session.post(f"{base}/admin/login/?next=/", timeout=30, data={
        "username": "admin", "password": PASSWORD, "next": "/", "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    started = session.post(f"{base}/jobs/start", timeout=30, data={"job": "check_topological_ordering"},
                           headers={"X-CSRFToken": session.cookies["csrftoken"]}, allow_redirects=False)
    assert started.status_code == 302, started.text[-2000:]
    seen: dict = {}
    try:
        deadline = time.monotonic() + 240
        while True:
            tree = tree_below(web.pid)
            if any(cmd.split(" ", 1)[0].endswith("/java") for cmd in tree.values()):
                break
            assert time.monotonic() < deadline, tree
            time.sleep(0.1)
        seen.update(tree)
        assert any("run_job" in cmd for cmd in tree.values()), tree
        os.kill(web.pid, signal.SIGKILL)
        assert wait_all_gone(tree, timeout=60) == {}
    finally:
        kill_all(seen)

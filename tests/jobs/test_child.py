"""Jobs in a child process: a job started from the dashboard on the embedded default leaves
no JVM in the web process, and a child that dies without recording is recorded anyway."""
from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import requests

from testing.accounting import rss_kib
from testing.processes import ROOT, wait_port
from testing.services import free_port
from testing.sockets import descendants

PASSWORD = "child-job-test-password"


def embedded_environment(state_dir: Path, **extra_env: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SPARK_MASTER")}
    env.update(STATE_DIR=str(state_dir), DEMO="0", PYTHONUNBUFFERED="1", ADMIN_PASSWORD=PASSWORD,
               SPARK_MASTER="local[1]", DJANGO_SETTINGS_MODULE="synapse_repl.settings", **extra_env)
    return env


@pytest.fixture(scope="module")
def migrated_state(tmp_path_factory) -> Path:
    """A ``STATE_DIR`` as ``make run`` leaves it before it serves (migrated, a superuser made),
    made once per module: each test serves a copy of its own (the two commands cost 9 CPU-s
    a start)."""
    state = tmp_path_factory.mktemp("embedded_state")
    env = embedded_environment(state)
    for command in (["migrate", "--noinput", "-v", "0"], ["ensure_admin"]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True, timeout=300,
                       capture_output=True)
    return state


@contextmanager
def embedded_web_process(tmp_path: Path, migrated: Path, **extra_env: str) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """The web process as ``make run`` serves it on the embedded default (SQLite, eager Celery,
    ``local[*]``): daphne, on a copy of ``migrated`` (:func:`migrated_state`), with a superuser
    to sign in as."""
    shutil.copytree(migrated, tmp_path, dirs_exist_ok=True)
    env = embedded_environment(tmp_path, **extra_env)
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


@pytest.fixture
def embedded_web(tmp_path, migrated_state):
    with embedded_web_process(tmp_path, migrated_state) as web:
        yield web


def signed_in(base: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{base}/admin/login/", timeout=30)
    answer = session.post(f"{base}/admin/login/?next=/", timeout=30, data={
        "username": "admin", "password": PASSWORD, "next": "/",
        "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    assert answer.ok and "Job runs" in answer.text
    return session


@pytest.mark.slow
def test_dashboard_job_leaves_no_jvm_in_the_web_process(embedded_web):
    base, web, db = embedded_web
    session = signed_in(base)
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
    from jobs.child import create_run, run_in_child
    from jobs.models import JobRun
    from rooms.models import Room

    Room.objects.create(room_id="!r:hs")  # a room that exists: only the kill can fail this run
    run = create_run("check_visibility", ["!r:hs"], "test")
    ended = run_in_child(run, timeout=0.3)  # killed while it still starts up
    stored = JobRun.objects.get(pk=run.pk)
    assert ended.status == stored.status == JobRun.Status.FAILED
    assert "was killed after 0 s before recording an outcome" in stored.error and stored.ended_at


@pytest.mark.django_db(transaction=True)
def test_a_child_runs_log_is_kept_and_viewable(admin_client, settings, tmp_path):
    from jobs.child import create_run, log_path, run_in_child

    settings.STATE_DIR = tmp_path
    run = create_run("no_such_job", None, "test")
    assert admin_client.get(f"/jobs/{run.pk}/log").status_code == 404  # nothing kept yet
    run_in_child(run, timeout=120)
    assert "unknown job 'no_such_job'" in log_path(run.pk).read_text()
    page = admin_client.get(f"/jobs/{run.pk}/log")
    assert page.status_code == 200 and "unknown job 'no_such_job'" in page.content.decode()
    from dashboard.job_panel import recent_job_runs

    assert recent_job_runs()[0]["has_log"]


@pytest.mark.slow
def test_a_killed_web_process_takes_its_running_job_and_jvm_with_it(embedded_web):
    """``kill -9`` of the web process while a dashboard job runs in its child: the child and
    the child's JVM end too (the child is on the web process's lifeline, common/lifeline.py)."""
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


def run_job_children(web_pid: int) -> set[int]:
    """The ``manage.py run_job`` processes below the web process now."""
    found = set()
    for pid in descendants(web_pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"run_job" in command:
            found.add(pid)
    return found


@pytest.mark.slow
def test_a_flood_of_starts_spawns_at_most_the_cap_and_refuses_the_rest_first(tmp_path, migrated_state):
    """20 concurrent POST /jobs/start, each for another job, to a real daphne: at most
    JOBS_MAX_CHILDREN (default 2) ``run_job`` children ever exist; every other start is
    answered 409 with the reason, and neither spawns a process nor records a run. A second
    start of a running job is refused too; once the children end, a start is taken again."""
    from tests.jobs.endless_jobs import NAMES

    with embedded_web_process(tmp_path, migrated_state, JOB_MODULES="tests.jobs.endless_jobs") as (base, web, db):
        session = signed_in(base)
        seen: set[int] = set()
        sampling = True

        def sample() -> None:  # every run_job child that ever exists, however briefly
            while sampling:
                seen.update(run_job_children(web.pid))
                time.sleep(0.01)

        def start(job: str, rooms: str = "") -> requests.Response:
            client = requests.Session()
            client.cookies.update(session.cookies)
            return client.post(f"{base}/jobs/start", timeout=60, data={"job": job, "rooms": rooms},
                               headers={"X-CSRFToken": session.cookies["csrftoken"]}, allow_redirects=False)

        def runs() -> list[tuple]:
            with sqlite3.connect(db) as conn:
                return conn.execute("SELECT id, job, status FROM job_runs ORDER BY id").fetchall()

        with ThreadPoolExecutor(21) as pool:
            sampler = pool.submit(sample)
            try:
                answers = list(pool.map(start, NAMES))
                accepted = [job for job, a in zip(NAMES, answers) if a.status_code == 302]
                refused = [a for a in answers if a.status_code != 302]
                assert len(accepted) == 2, [(a.status_code, a.text[:200]) for a in answers]
                assert all(a.status_code == 409 and "JOBS_MAX_CHILDREN=2" in a.json()["error"] for a in refused), \
                    [a.text for a in refused]
                assert sorted(job for _, job, _ in runs()) == sorted(accepted)
                # a second start of a job whose child is alive
                again = start(accepted[0])
                assert again.status_code == 409 and "is already running" in again.json()["error"], again.text
                deadline = time.monotonic() + 60  # a safety net for a launcher that never spawns
                while len(seen) < 2:
                    assert time.monotonic() < deadline, (runs(), seen)
                    time.sleep(0.1)
            finally:  # ended as a kill would end them (their JVMs end with them)
                for pid in run_job_children(web.pid):
                    os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 120
                while run_job_children(web.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                sampling = False
                sampler.result()
        assert len(seen) == 2, seen  # the two accepted, and never another
        assert not run_job_children(web.pid)
        deadline = time.monotonic() + 60  # their launchers record the ends
        while any(status == "running" for _, _, status in runs()):
            assert time.monotonic() < deadline, runs()
            time.sleep(0.1)
        # their slots went with them: a start is taken again (a check of a room that does not
        # exist: its child ends without starting Spark)
        assert start("check_topological_ordering", "!nowhere:hs").status_code == 302
        deadline = time.monotonic() + 120
        while runs()[-1][2] == "running":
            assert time.monotonic() < deadline, runs()
            time.sleep(0.2)
        assert runs()[-1][1:] == ("check_topological_ordering", "failed")


@pytest.mark.django_db(transaction=True)
def test_claims_refuse_a_running_job_a_locked_job_and_beyond_the_cap(settings, tmp_path):
    from jobs.child import ChildRefused, claim_child
    from jobs.lock import JobLock

    settings.STATE_DIR = tmp_path
    a, b = claim_child("job_a", limit=2), claim_child("job_b", limit=2)
    with pytest.raises(ChildRefused, match="job_a is already running"):
        claim_child("job_a", limit=2)
    with pytest.raises(ChildRefused, match=r"2 jobs are already running on this host \(JOBS_MAX_CHILDREN=2\)"):
        claim_child("job_c", limit=2)
    a.release()
    c = claim_child("job_c", limit=2)  # a's slot
    b.release(), c.release()
    with JobLock("job_d") as held:  # a run elsewhere (a Celery worker, manage.py run_job)
        assert held
        with pytest.raises(ChildRefused, match="another run of job_d holds its lock"):
            claim_child("job_d", limit=2)
    claim_child("job_d", limit=2).release()  # refused claims left nothing held

"""Running a job in a child process (``manage.py run_job --run N``), for a process that must
not host Spark itself: the web process on the embedded default, where Celery is eager and a
job started from the dashboard would otherwise leave the driver's JVM (some 670 MB) resident
in it for good. The child exits with its JVM when the job ends, and dies (with the JVM and
whatever else it started) when the launching process dies first: it runs on a lifeline
(common/lifeline.py).

The launcher makes the :class:`JobRun` first and hands its id to the child, so that whatever
happens to the child (killed, out of memory, a broken environment) the run is recorded.

Each child costs a Python and a JVM (some 200 MB before its job even takes the lock), so a
launcher refuses before spawning (:func:`claim_child`): a second child of a job whose child
is alive, a job whose lock another run holds, and any child beyond ``JOBS_MAX_CHILDREN``
alive at once on this host, whatever their jobs.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Sequence

from django.conf import settings
from django.db import connections
from django.utils import timezone

from common.lifeline import Lifeline, kill_group
from jobs.job_dialect import for_database, try_flock
from jobs.lock import JobLock
from jobs.models import JobRun

PROJECT_ROOT = Path(__file__).resolve().parents[1]

#: how much of a dead child's output the run's error keeps
ERROR_TAIL = 20000


def child_environment(using: str = "default") -> dict[str, str]:
    """This process's environment, with the database, state directory and Spark master this
    process actually uses (a test's database, a settings override) rather than the ones its
    environment named at start-up."""
    env = os.environ.copy()
    env["DATABASE_URL"] = for_database(using).database_url(connections[using].settings_dict)
    env["STATE_DIR"] = str(settings.STATE_DIR)
    env["SPARK_MASTER"] = settings.SYNAPSE_REPL["SPARK_MASTER"]
    return env


def log_path(run_pk: int) -> Path:
    """Where a child-run job's output (its progress lines, Spark's warnings, the result) is kept."""
    return Path(settings.STATE_DIR) / "jobs" / "logs" / f"run-{run_pk}.log"


def read_log(run_pk: int, limit: int = 200_000) -> str | None:
    """The end of the run's kept log, or None if it has none (not run in a child)."""
    path = log_path(run_pk)
    if not path.exists():
        return None
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - limit))
        return f.read().decode(errors="replace")


def create_run(job: str, rooms: Sequence[str] | None, trigger: str,
               status: str = JobRun.Status.RUNNING) -> JobRun:
    """The record the child (or a Celery worker, for a ``queued`` one) will fill in."""
    return JobRun.objects.create(job=job, parameters={"rooms": list(rooms)} if rooms else {},
                                 trigger=trigger, started_at=timezone.now(), status=status)


class ChildRefused(Exception):
    """A job child that was not started; the message says why, for the operator who asked."""


class ChildClaim:
    """What a launcher holds while its child runs: its job's launch file and one of the
    host's child slots, each an exclusive ``flock`` in ``STATE_DIR/jobs/children/`` (the
    kernel drops them if the launcher dies). :meth:`release` when the child has ended."""

    def __init__(self, files: list[IO[str]]) -> None:
        self._files = files

    def release(self) -> None:
        for file in self._files:
            file.close()
        self._files = []




def claim_child(job: str, limit: int | None = None) -> ChildClaim:
    """Claim the right to start a child for ``job``, or raise :class:`ChildRefused` before
    anything is spawned: while a child of ``job`` started here is alive, while another run of
    ``job`` holds its lock (a Celery worker's, ``manage.py run_job``'s), and while ``limit``
    (``JOBS_MAX_CHILDREN``) children are alive on this host."""
    limit = settings.SYNAPSE_REPL["JOBS_MAX_CHILDREN"] if limit is None else limit
    directory = Path(settings.STATE_DIR) / "jobs" / "children"
    directory.mkdir(parents=True, exist_ok=True)
    own = try_flock(directory / f"job-{job}.lock")
    if own is None:
        raise ChildRefused(f"{job} is already running{_running_run(job)}: not started again")
    held = [own]
    try:
        if JobLock.taken(job):
            raise ChildRefused(f"another run of {job} holds its lock{_running_run(job)}: not started")
        slot = next((f for f in (try_flock(directory / f"slot-{i}.lock") for i in range(limit)) if f), None)
        if slot is None:
            raise ChildRefused(f"{limit} job{'s are' if limit != 1 else ' is'} already running on this host "
                               f"(JOBS_MAX_CHILDREN={limit}): {job} not started; start it when one has ended")
        held.append(slot)
    except BaseException:
        ChildClaim(held).release()
        raise
    return ChildClaim(held)


def _running_run(job: str) -> str:
    run = JobRun.objects.filter(job=job, status=JobRun.Status.RUNNING).order_by("-started_at").first()
    return f" (run #{run.pk})" if run else ""


def run_in_child(run: JobRun, timeout: float | None = None) -> JobRun:
    """Run ``run``'s job in a ``manage.py run_job`` child, wait for it, return the record as the
    child left it; a child that ended without recording an outcome leaves it ``failed`` with
    its exit status and the end of its output."""
    rooms = run.parameters.get("rooms") or []
    command = [sys.executable, str(PROJECT_ROOT / "manage.py"), "run_job", run.job, "--run", str(run.pk)]
    if rooms:
        command += ["--rooms", *rooms]
    log = log_path(run.pk)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out, Lifeline() as lifeline:  # the log is kept after the run: the dashboard shows it
        child = subprocess.Popen(command, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, **lifeline.popen_options(child_environment()))
        try:
            ending = f"exited with status {child.wait(timeout)}"
        except subprocess.TimeoutExpired:
            kill_group(child.pid)  # it and its JVM
            child.wait()
            ending = f"was killed after {timeout:.0f} s"
    output = read_log(run.pk, ERROR_TAIL) or ""
    run.refresh_from_db()
    if run.status == JobRun.Status.RUNNING:
        run.status = JobRun.Status.FAILED
        run.ended_at = timezone.now()
        run.error = f"the job's process {ending} before recording an outcome:\n{output}"[-ERROR_TAIL:]
        run.save(update_fields=["status", "ended_at", "error"])
    return run

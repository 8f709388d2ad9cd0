"""Runs whose process is gone: a run left ``running`` by a process that was killed (``kill -9``,
a Ctrl-C of ``make run`` that took the job child with it, a crashed worker) is marked failed
("interrupted") within seconds instead of staying ``running``, with a Cancel button that can do
nothing, until the next run of its job.

The running process records where it is (``host``, ``pid``) and rewrites ``heartbeat_at``
every second or so (jobs/monitor.py). :func:`gone_reason` decides, by value, whether a
run is dead; :func:`sweep` is the adapter that reads the records and the process table and
writes the verdicts. runservice sweeps at start and every ``JOBS_SWEEP_SECONDS``.
"""
from __future__ import annotations

import logging
import socket
import threading
from datetime import datetime

from django.utils import timezone

from jobs.models import JobRun
from streams.id_store import pid_alive as process_exists

logger = logging.getLogger(__name__)

#: the start of the error of a run whose process is gone (the dashboard and tests match on it)
INTERRUPTED = "interrupted"


def this_host() -> str:
    return socket.gethostname()


def gone_reason(run: JobRun, now: datetime, *, here: str, pid_alive: bool | None,
                stale_after: float) -> str | None:
    """Why ``run`` (status ``running``) is dead, or None while it may be alive.

    ``here``: this host's name; ``pid_alive``: whether ``run.pid`` is a live process on this
    host (None when the run is not on this host or has no pid yet). A run on this host is dead
    as soon as its pid is, and alive while its pid is; any other run whose last sign of life
    (heartbeat, else its start) is older than ``stale_after`` seconds is dead too: a process on
    another host, or one that never got as far as recording its pid.
    """
    if run.status != JobRun.Status.RUNNING:
        return None
    if run.host == here and run.pid is not None:
        if pid_alive is True:  # alive here, however quiet (a JVM still starting, a long pause)
            return None
        if pid_alive is False:
            return f"{INTERRUPTED}: its process (pid {run.pid} on {run.host}) ended before recording an outcome"
    last = run.heartbeat_at or run.started_at
    age = (now - last).total_seconds()
    if age > stale_after:
        where = f"pid {run.pid} on {run.host}" if run.pid is not None else "its process"
        return f"{INTERRUPTED}: no sign of life from {where} for {age:.0f} s (JOBS_HEARTBEAT_STALE_SECONDS)"
    return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process here (:func:`streams.id_store.pid_alive`), a zombie
    (killed but not yet reaped) counting as gone."""
    if not process_exists(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: the signal test stands


def sweep(now: datetime | None = None, stale_after: float | None = None) -> list[int]:
    """Mark every running run whose process is gone failed ("interrupted"); return their ids."""
    from django.conf import settings

    now = now or timezone.now()
    if stale_after is None:
        stale_after = float(settings.SYNAPSE_REPL["JOBS_HEARTBEAT_STALE_SECONDS"])
    here = this_host()
    swept = []
    for run in JobRun.objects.filter(status=JobRun.Status.RUNNING):
        alive = pid_alive(run.pid) if run.host == here and run.pid is not None else None
        reason = gone_reason(run, now, here=here, pid_alive=alive, stale_after=stale_after)
        # only if it is still running as read: a run that ended meanwhile keeps its own outcome
        if reason and JobRun.objects.filter(pk=run.pk, status=JobRun.Status.RUNNING, pid=run.pid).update(
                status=JobRun.Status.FAILED, error=reason, ended_at=now, spark_ui_url=""):
            swept.append(run.pk)
    return swept


def sweep_every(seconds: float, stop: threading.Event) -> None:
    """:func:`sweep` now and then every ``seconds`` until ``stop`` is set (a thread of
    runservice). A failed sweep (the database away for a moment) is logged and tried again."""
    from django.db import connection

    try:
        while True:
            try:
                for pk in sweep():
                    logger.warning("job run #%s: its process is gone; marked failed (interrupted)", pk)
            except Exception:
                logger.warning("could not sweep the job runs whose process is gone", exc_info=True)
            if stop.wait(seconds):
                return
    finally:
        connection.close()

"""Runs a job by name: takes its lock, records a :class:`JobRun`, and never lets a failure
escape unrecorded. Celery tasks and ``manage.py run_job`` both come through here."""
from __future__ import annotations

import logging
import os
import traceback
import uuid
from typing import Any, Callable, Sequence

from django.utils import timezone

from jobs import io
from jobs.job_registry import JOBS, load_jobs
from jobs.liveness import this_host
from jobs.lock import JobLock
from jobs.models import JobRun
from jobs.monitor import JobMonitor
from jobs.outcome import SAMPLE_LIMIT
from jobs.session import spark_session, ui_url
from rooms.models import Room

logger = logging.getLogger(__name__)


#: the error of a run stopped by an interrupt (Ctrl-C of ``run_job``)
INTERRUPTED_ERROR = "interrupted: stopped by an interrupt (Ctrl-C) before it finished; nothing was swapped in"


class UnknownJob(ValueError):
    pass


def missing_rooms(rooms: Sequence[str] | None) -> list[str]:
    """The asked-for rooms the room store has never seen: a job on them would read nothing
    and "succeed", which reads as if the room were fine."""
    if not rooms:
        return []

    known = set(Room.objects.filter(room_id__in=list(rooms)).values_list("room_id", flat=True))
    return [r for r in dict.fromkeys(rooms) if r not in known]


def run_job(name: str, rooms: Sequence[str] | None = None, *, trigger: str = "manual",
            run: JobRun | None = None, progress_interval: float = 1.0,
            on_progress: Callable[[dict[str, Any]], None] | None = None) -> JobRun:
    """Run job ``name`` (on ``rooms`` only, if given) and return its finished record.

    ``run``: a record made beforehand by whoever launched this process (``jobs.child``), so
    that the launcher can still record the outcome if this process dies; its job and rooms
    must be ``name`` and ``rooms``. Every ``progress_interval`` seconds the Spark status of the
    run is written to ``run.progress`` (and given to ``on_progress``); a run whose
    ``cancel_requested`` is set has its Spark jobs cancelled and ends ``cancelled``.
    """

    load_jobs()
    if name not in JOBS:
        raise UnknownJob(f"unknown job {name!r}; known: {', '.join(sorted(JOBS))}")
    params = {"rooms": list(rooms)} if rooms else {}
    if run is None:
        run = JobRun.objects.create(job=name, parameters=params, trigger=trigger, started_at=timezone.now())
    elif (run.job, run.parameters) != (name, params):
        raise ValueError(f"run #{run.pk} is {run.job} {run.parameters}, not {name} {params}")
    else:
        # A run that took the lock before this process did may have marked this record failed,
        # taking it for a dead process's run; it is alive again from here (and no longer
        # queued, if a Celery worker has just taken it).
        run.status, run.error, run.ended_at = JobRun.Status.RUNNING, "", None
    # where the liveness sweep (jobs/liveness.py) looks for this run's process
    run.host, run.pid, run.heartbeat_at = this_host(), os.getpid(), timezone.now()
    JobRun.objects.filter(pk=run.pk).update(status=run.status, host=run.host, pid=run.pid,
                                            heartbeat_at=run.heartbeat_at)
    lock = JobLock(name)
    try:
        if not lock.acquire():
            holder = JobRun.objects.filter(job=name, status=JobRun.Status.RUNNING).exclude(pk=run.pk).first()
            run.status = JobRun.Status.REFUSED
            run.error = f"another run of {name} holds the lock" + (f" (run #{holder.pk})" if holder else "")
            return run
        # Holding the lock proves no other run is alive: a run still marked running died
        # with its process (the lock went with it). Say so instead of leaving it "running".
        JobRun.objects.filter(job=name, status=JobRun.Status.RUNNING).exclude(pk=run.pk).update(
            status=JobRun.Status.FAILED, ended_at=timezone.now(),
            error="the process running this job ended before it finished (found by a later run)")
        # ... and the staging tables such a run made are its leftovers
        stale = io.drop_stale_staging(name)
        if stale:
            logger.warning("job %s: dropped %d staging table(s) a dead run left: %s", name, len(stale),
                           ", ".join(stale))
        # an audit of Synapse's database names Synapse's rooms, not the room store's
        missing = [] if getattr(JOBS[name], "reads_synapse", False) else missing_rooms(rooms)
        if missing:
            run.status = JobRun.Status.FAILED
            run.error = (f"room{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                         f"{'do' if len(missing) > 1 else 'does'} not exist: nothing was checked or written")
            return run

        spark = spark_session()
        # Unique in this Spark context, not only in this database: the status tracker keeps
        # finished jobs by group, and a database whose IDs start again (a test database
        # flushed, another database on the same Spark) would hand this run an old run's
        # stages and cancel the wrong jobs.
        group = f"job-run-{run.pk}-{uuid.uuid4().hex[:12]}"
        spark.sparkContext.setJobGroup(group, f"{name} (run #{run.pk})", interruptOnCancel=True)
        run.spark_ui_url = ui_url(spark.sparkContext.uiWebUrl, os.environ)
        JobRun.objects.filter(pk=run.pk).update(spark_ui_url=run.spark_ui_url, status=run.status,
                                                error="", ended_at=None)
        monitor = JobMonitor(spark, run, group, progress_interval, on_progress)
        try:
            owner = io.staging_owner.set(name)
            try:
                with monitor:
                    outcome = JOBS[name](spark, list(rooms) if rooms else None)
            finally:
                io.staging_owner.reset(owner)
        except Exception:
            if monitor.interrupted:
                run.status, run.error = JobRun.Status.FAILED, INTERRUPTED_ERROR
                return run
            if monitor.cancelled:
                run.status = JobRun.Status.CANCELLED
                run.error = "cancelled on request; nothing was swapped in after the cancel"
                return run
            raise
        finally:
            run.progress = JobRun.objects.get(pk=run.pk).progress
            run.cancel_requested = JobRun.objects.get(pk=run.pk).cancel_requested
        run.rows_in, run.rows_out = outcome.rows_in, outcome.rows_out
        run.differences = outcome.differences
        run.difference_sample = outcome.sample[:SAMPLE_LIMIT]
        run.status = JobRun.Status.SUCCEEDED
    except KeyboardInterrupt:  # before Spark's work began (its work stops by interrupt_runs)
        run.status, run.error = JobRun.Status.FAILED, INTERRUPTED_ERROR
        raise
    except Exception as e:  # recorded, then re-raised for the caller (Celery marks it failed)
        logger.exception("job %s failed", name)
        run.status = JobRun.Status.FAILED
        run.error = "".join(traceback.format_exception(e))[-20000:]
        raise
    finally:
        lock.release()
        run.ended_at = timezone.now()
        run.spark_ui_url = ""  # the UI goes with the run's Spark jobs (or the process)
        run.save()
    return run

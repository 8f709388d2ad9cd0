"""Watches a running job from beside it: copies Spark's status tracker into the JobRun every
few seconds (so the dashboard and ``run_job`` can show stages and tasks) and cancels the
run's Spark job group when someone has set ``cancel_requested`` on the record."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from django.db import connection
from django.utils import timezone

from jobs.models import JobRun

logger = logging.getLogger(__name__)


def snapshot(tracker: Any, group: str) -> dict[str, Any]:
    """The stages of ``group``'s Spark jobs as plain data (pure apart from the tracker reads).

    A stage of a succeeded job that did not run all its tasks was skipped (its output reused
    from an earlier job's shuffle): it is marked ``skipped`` and its tasks are not counted, so
    a finished run reads finished rather than "stages 3/4"."""
    stages = []
    for job_id in sorted(tracker.getJobIdsForGroup(group)):
        job = tracker.getJobInfo(job_id)
        if job is None:
            continue
        succeeded = str(job.status) == "SUCCEEDED"
        for stage_id in sorted(job.stageIds):
            info = tracker.getStageInfo(stage_id)
            if info is None:
                continue
            stages.append({"job": job_id, "id": stage_id, "name": info.name, "tasks": info.numTasks,
                           "done": info.numCompletedTasks, "active": info.numActiveTasks,
                           "failed": info.numFailedTasks,
                           "skipped": succeeded and info.numCompletedTasks < info.numTasks})
    counted = [s for s in stages if not s["skipped"]]
    return {"stages": stages, "tasks": sum(s["tasks"] for s in counted),
            "done": sum(s["done"] for s in counted)}


def summary(progress: dict[str, Any]) -> str:
    """One line for a terminal: ``stage 3/5, tasks 14/40`` (a skipped stage counts as finished)."""
    stages = progress.get("stages") or []
    finished = sum(1 for s in stages if s.get("skipped") or (s["tasks"] and s["done"] >= s["tasks"]))
    return f"stages {finished}/{len(stages)}, tasks {progress.get('done', 0)}/{progress.get('tasks', 0)}"


#: the monitors of the runs in progress in this process (what an interrupt stops)
_active: set["JobMonitor"] = set()
_active_lock = threading.Lock()


def interrupt_runs() -> bool:
    """Stop this process's runs in progress, quietly (a Ctrl-C of ``run_job``): each one's
    monitor turns Spark's log off and cancels its job group from its own thread, and the run
    ends failed ("interrupted"). Safe in a signal handler: it only sets flags. False if no run
    is in progress."""
    with _active_lock:
        monitors = list(_active)
    for monitor in monitors:
        monitor.interrupt()
    return bool(monitors)


class JobMonitor:
    """A daemon thread beside the job: progress out to the record, cancel requests in."""

    def __init__(self, spark: Any, run: JobRun, group: str, interval: float = 1.0,
                 on_progress: Callable[[dict[str, Any]], None] | None = None):
        self.spark, self.run_pk, self.group, self.interval = spark, run.pk, group, interval
        self.on_progress = on_progress
        self.cancelled = False
        #: set by :func:`interrupt_runs`: the run is stopped and ends failed, not cancelled
        self.interrupted = False
        self._silenced = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"job-monitor-{run.pk}", daemon=True)

    def __enter__(self) -> "JobMonitor":
        self._thread.start()
        with _active_lock:
            _active.add(self)
        return self

    def __exit__(self, *exc) -> None:
        with _active_lock:
            _active.discard(self)
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._safe_poll()  # the final counts, written once more

    def interrupt(self) -> None:
        self.interrupted = True
        self._wake.set()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.wait(self.interval)
                self._wake.clear()
                if self._stop.is_set():
                    break
                self._safe_poll()
        finally:
            connection.close()  # this thread's own connection, not left open behind it

    def _safe_poll(self) -> None:
        """A poll whose failure (SQLite busy during the swap, Spark stopping) is logged, never
        fatal: watching a job must not fail it, and the next poll tries again."""
        try:
            self.poll()
        except Exception:
            logger.warning("could not update the progress of job run #%s", self.run_pk, exc_info=True)

    def poll(self) -> None:
        if self.interrupted and not self._silenced:
            # first, so that the cancel's task kills and stage failures print nothing
            self.spark.sparkContext.setLogLevel("OFF")
            self._silenced = True
        progress = snapshot(self.spark.sparkContext.statusTracker(), self.group)
        now = timezone.now()
        progress["updated_at"] = now.isoformat()
        JobRun.objects.filter(pk=self.run_pk).update(progress=progress, heartbeat_at=now)
        if self.on_progress:
            self.on_progress(progress)
        # Cancelled again at every poll: a job that starts its next Spark action after the first
        # cancel is stopped as well.
        if self.interrupted:
            self.spark.sparkContext.cancelJobGroup(self.group)
        elif JobRun.objects.filter(pk=self.run_pk, cancel_requested=True).exists():
            self.cancelled = True
            self.spark.sparkContext.cancelJobGroup(self.group)

"""Celery tasks: each only launches a batch job through the runner (which records it)."""
from __future__ import annotations

import logging
import os
from typing import Sequence

from jobs.celery_app import app
from jobs.child import log_path
from jobs.models import JobRun
from jobs.monitor import summary
from jobs.runner import run_job

logger = logging.getLogger(__name__)


@app.task(name="streams.run_job")
def run_job_task(job: str, rooms: Sequence[str] | None = None, trigger: str = "celery",
                 run_id: int | None = None) -> dict:
    """Run ``job`` (on ``rooms`` if given); returns the JobRun's id and status.

    ``run_id``: the ``queued`` record the dashboard made when it was clicked; filled in here,
    unless it is no longer queued (cancelled while it waited)."""

    if run_id is None:
        run = run_job(job, rooms, trigger=trigger)
    else:
        record = JobRun.objects.get(pk=run_id)
        if record.status != JobRun.Status.QUEUED:
            return {"run": record.pk, "job": record.job, "status": record.status, "differences": None}
        with kept_log(run_id) as progress:
            logger.info("run #%s (%s): taken by a Celery worker (pid %s)", run_id, job, os.getpid())
            try:
                run = run_job(job, rooms, trigger=trigger, run=record, on_progress=progress)
            except Exception:
                logger.error("run #%s (%s): failed", run_id, job)
                raise
            logger.info("run #%s (%s): %s%s", run_id, job, run.status, f": {run.error}" if run.error else "")
    return {"run": run.pk, "job": run.job, "status": run.status, "differences": run.differences}


class kept_log:
    """The run's log (what the dashboard's "log" link shows), as a child run keeps one: the
    job's log records and a line per change of its progress, in ``jobs.child.log_path``."""

    def __init__(self, run_id: int) -> None:
        self.path = log_path(run_id)
        self._last = ""

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handler = logging.FileHandler(self.path, encoding="utf-8")
        self.handler.setLevel(logging.INFO)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(self.handler)
        self._level = logger.level
        logger.setLevel(logging.INFO)  # this module's own lines, whatever the root's level
        return self.progress

    def progress(self, progress: dict) -> None:
        line = summary(progress)
        if line != self._last:
            self._last = line
            self.handler.stream.write(f"progress: {line}\n")
            self.handler.flush()

    def __exit__(self, *exc) -> None:
        logger.setLevel(self._level)
        logging.getLogger().removeHandler(self.handler)
        self.handler.close()

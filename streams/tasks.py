"""Celery tasks: each only launches a batch job through the runner (which records it)."""
from __future__ import annotations

from typing import Sequence

from celery import shared_task


@shared_task(name="streams.run_job")
def run_job_task(job: str, rooms: Sequence[str] | None = None, trigger: str = "celery") -> dict:
    """Run ``job`` (on ``rooms`` if given); returns the JobRun's id and status."""
    from .jobs.runner import run_job

    run = run_job(job, rooms, trigger=trigger)
    return {"run": run.pk, "job": run.job, "status": run.status, "differences": run.differences}

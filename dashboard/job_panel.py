"""The dashboard's job-runs panel: recent runs for the live feed, and starting a run."""
from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from jobs.child import ChildRefused, claim_child, create_run, log_path, read_log, run_in_child
from jobs.job_registry import JOBS, load_jobs
from jobs.lock import JobLock
from jobs.models import JobRun
from jobs.monitor import summary
from jobs.schedules import next_runs

RECENT_RUNS = 15


def recent_job_runs(limit: int = RECENT_RUNS) -> list[dict[str, Any]]:
    """The newest runs, newest first, as the live feed sends them."""

    return [{
        "id": run.pk, "job": run.job, "status": run.status, "trigger": run.trigger,
        "verdict": run.verdict, "verdict_text": run.verdict_text,
        "difference_columns": run.shown_differences()[0], "difference_rows": run.shown_differences()[1],
        "rooms": len(run.parameters.get("rooms") or []),
        "started_at": run.started_at.timestamp(),
        "duration_seconds": None if run.duration_seconds is None else round(run.duration_seconds, 1),
        "rows_in": run.rows_in, "rows_out": run.rows_out, "differences": run.differences,
        "error": run.error.strip().splitlines()[-1][:300] if run.error.strip() else "",
        "progress": summary(run.progress) if run.progress.get("stages") else "",
        "spark_ui_url": run.spark_ui_url if run.status == JobRun.Status.RUNNING else "",
        "cancel_requested": run.cancel_requested,
        "has_log": has_log(run.pk),
    } for run in JobRun.objects.order_by("-started_at", "-id")[:limit]]


def has_log(run_pk: int) -> bool:
    return log_path(run_pk).exists()


DURATION_HISTORY = 10


def job_schedule(now=None) -> list[dict[str, Any]]:
    """The beat schedule for the panel: each entry's next run, and its job's last durations."""
    from django.utils import timezone

    now = now or timezone.now()
    beat = getattr(settings, "CELERY_BEAT_SCHEDULE", {}) or {}
    jobs = {entry["args"][0] for entry in beat.values()}
    last_beat = {job: JobRun.objects.filter(job=job, trigger="beat").values_list("started_at", flat=True).first()
                 for job in jobs}
    rows = next_runs(beat, now, last_beat)
    for row in rows:
        row["durations"] = durations(row["job"])
    return rows


def durations(job: str, limit: int = DURATION_HISTORY) -> list[float]:
    """The job's last finished successful runs' durations in seconds, newest first."""

    runs = JobRun.objects.filter(job=job, status=JobRun.Status.SUCCEEDED, ended_at__isnull=False)
    return [round(r.duration_seconds, 1) for r in runs.order_by("-started_at")[:limit]]


@require_POST
@staff_member_required
def cancel_job(request: HttpRequest, run_id: int) -> HttpResponse:
    """Ask a running job to stop; the job process notices within a second or two."""
    from django.utils import timezone

    updated = JobRun.objects.filter(pk=run_id, status=JobRun.Status.RUNNING).update(cancel_requested=True)
    # a queued run is cancelled here and then: no worker has it yet (the task skips it)
    updated += JobRun.objects.filter(pk=run_id, status=JobRun.Status.QUEUED).update(
        cancel_requested=True, status=JobRun.Status.CANCELLED, ended_at=timezone.now(),
        error="cancelled on request before a worker took it")
    if not updated:
        return JsonResponse({"error": f"run #{run_id} does not exist or is not running"}, status=400)
    messages.info(request, f"cancel requested for run #{run_id}.")
    return redirect("dashboard:streams")


@staff_member_required
def job_log(request: HttpRequest, run_id: int) -> HttpResponse:
    """The kept output of a run started from the dashboard (plain text, its last 200 kB)."""

    text = read_log(run_id)
    if text is None:
        return HttpResponse(f"run #{run_id} has no kept log (only runs started from the dashboard keep one)\n",
                            status=404, content_type="text/plain; charset=utf-8")
    return HttpResponse(text, content_type="text/plain; charset=utf-8")


def job_names() -> list[str]:
    load_jobs()
    return sorted(JOBS)


@require_POST
@staff_member_required
def start_job(request: HttpRequest) -> HttpResponse:
    """Start a job from the dashboard (POST ``job``, optional ``rooms`` one per line).

    A start that would only be refused once running is refused here, 409 with the reason,
    before anything is queued or spawned: a job whose lock another run holds and, on the
    embedded default, a job whose child is alive or a host at ``JOBS_MAX_CHILDREN``."""
    job = request.POST.get("job", "")
    rooms = [r.strip() for r in request.POST.get("rooms", "").split() if r.strip()] or None
    if job not in job_names():
        return JsonResponse({"error": f"unknown job {job!r}; known: {', '.join(job_names())}"}, status=400)
    trigger = f"dashboard ({request.user.get_username()})"

    if settings.CELERY_TASK_ALWAYS_EAGER:
        # Embedded default: no Celery worker. The job runs in a child process (its JVM ends
        # with it, not resident in this one), waited for by a thread beside the request.
        try:
            claim = claim_child(job)
        except ChildRefused as e:
            return JsonResponse({"error": str(e)}, status=409)
        try:
            run = create_run(job, rooms, trigger)
            threading.Thread(target=_run_in_child, args=(run, claim), name=f"job {job} #{run.pk}",
                             daemon=True).start()
        except BaseException:
            claim.release()
            raise
    else:
        if JobLock.taken(job):
            return JsonResponse({"error": f"another run of {job} holds its lock: not started"}, status=409)
        # queued (and so shown) until a worker takes it; sent once the record is committed
        from django.db import transaction

        # deferred: Celery (0.15 CPU-s of imports) loads in a web process that queues a job,
        # not in every process that loads the URLs (the system checks of migrate and the rest)
        from jobs.tasks import run_job_task

        run = create_run(job, rooms, trigger, status=JobRun.Status.QUEUED)
        transaction.on_commit(lambda: run_job_task.delay(job, rooms, trigger=trigger, run_id=run.pk))
    messages.info(request, f"{job} started; its run appears below.")
    return redirect("dashboard:streams")


def _run_in_child(run, claim) -> None:
    from django.db import connection

    try:
        run_in_child(run)
    finally:
        claim.release()
        connection.close()

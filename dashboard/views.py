from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard.access import staff_json
from dashboard.attached_sources import SOURCES
from dashboard.endpoint_status import endpoint_statuses
from dashboard.facts_history import RETENTION, facts_per_minute
from dashboard.feed import writer_json
from dashboard.job_panel import job_names, job_schedule, recent_job_runs
from dashboard.stream_table import streams_as_served
from dashboard.worker_status import worker_statuses
from jobs.models import JobRun
from jobs.outcome import SAMPLE_LIMIT
from replication.endpoint.user_activity import syncing_by_user
from streams.conf import instance_name, repl_setting


def _context(**extra):
    return {
        "instance_name": instance_name(),
        "server_name": repl_setting("SERVER_NAME"),
        "stuck_after": repl_setting("STUCK_AFTER_SECONDS"),
        **extra,
    }


def attached_sections() -> list[dict]:
    """Each attached source's sections of the streams page: its template and context."""
    return [{"template": s.template, "sections": s.page_sections()} for s in SOURCES.values()]


@staff_member_required
def streams_page(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/streams.html", _context(
        streams=streams_as_served(), attached=attached_sections(), page="streams", jobs=recent_job_runs(), job_names=job_names(),
        # no beat runs without Redis (the embedded default): nothing is scheduled there
        beat=bool(settings.REDIS_URL), schedule=job_schedule() if settings.REDIS_URL else []))


@staff_member_required
def connections_page(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/connections.html", _context(
        endpoints=endpoint_statuses(), workers=worker_statuses(), page="connections"))


@staff_member_required
def syncing_users_page(request: HttpRequest) -> HttpResponse:
    """Per user, which workers' syncing processes report it as syncing (USER_SYNC), from the
    endpoints' latest snapshots; ``?user=`` narrows to one user ID (or a prefix of it)."""

    query = request.GET.get("user", "").strip()[:255]
    users = syncing_by_user(endpoint_statuses())
    if query:
        users = {user: reports for user, reports in users.items() if user.startswith(query)}
    return render(request, "dashboard/syncing_users.html", _context(
        users=sorted(users.items())[:1000], user_count=len(users), query=query, page="connections"))


#: findings per page of a run's findings
FINDINGS_PER_PAGE = 100


@staff_member_required
def job_findings_page(request: HttpRequest, run_id: int) -> HttpResponse:
    """Every difference a run kept (the first SAMPLE_LIMIT it found), a page at a time;
    ``?room=`` narrows them to one room. The streams page shows only the first 10."""
    run = JobRun.objects.filter(pk=run_id).first()
    if run is None:
        return HttpResponse(f"run #{run_id} does not exist\n", status=404, content_type="text/plain; charset=utf-8")
    room = request.GET.get("room", "").strip()[:255]
    columns, rows = run.difference_table(room=room or None)
    shown = Paginator(rows, FINDINGS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "dashboard/findings.html", _context(
        run=run, columns=columns, rows=shown, room=room, matching=len(rows), kept=len(run.difference_sample or []),
        sample_limit=SAMPLE_LIMIT, page="streams"))


@staff_json
def streams_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"streams": [
        {
            "name": s.name,
            "writers": s.writers,
            "positions": s.positions,
            "linear": s.linear,
            "laggard": s.laggard,
            "writers_warning": s.writers_warning,
            # per writer: position, last write (Unix time), pid, host, alive (null: another host)
            "writer_status": {w.name: writer_json(w) for w in s.writer_rows},
            "pending": [
                {"writer": p.instance_name, "stream_ids": p.stream_ids, "age_seconds": round(p.age_seconds, 3),
                 "stuck": p.stuck}
                for p in s.pending
            ],
        }
        for s in streams_as_served()
    ], "endpoints": endpoint_statuses(), **{key: source.status_json() for key, source in SOURCES.items()}})


@staff_json
def facts_per_minute_json(request: HttpRequest) -> JsonResponse:
    """The facts/s history kept in the database: ``?hours=`` back (default 24, at most 25)."""
    from datetime import datetime, timedelta, timezone

    try:
        hours = float(request.GET.get("hours", "24"))
    except ValueError:
        return JsonResponse({"error": "hours must be a number, e.g. ?hours=24"}, status=400)
    if not 0 < hours <= RETENTION.total_seconds() / 3600:
        return JsonResponse({"error": f"hours must be above 0 and at most {RETENTION.total_seconds() / 3600:g}"},
                            status=400)
    since = datetime.now(timezone.utc) - timedelta(hours=hours)
    return JsonResponse({"minutes": facts_per_minute(since)})

"""The jobs panel: the beat schedule's next runs and durations, progress in the feed, cancel."""
from __future__ import annotations

import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.utils import timezone

from dashboard.job_panel import job_schedule, recent_job_runs
from jobs.models import JobRun
from jobs.schedules import beat_schedule, next_runs

pytestmark = pytest.mark.django_db


def test_next_run_of_crontabs_and_intervals():
    beat = beat_schedule({"hourly": ("17 * * * *", "check_a"), "nightly": ("0 3 * * *", "topo"),
                          "often": ("@every 30s", "vis"), "off": ("", "never")})
    now = datetime(2026, 11, 24, 8, 20, 5, tzinfo=dt_timezone.utc)
    rows = next_runs(beat, now, {"vis": now - timedelta(seconds=70)})
    assert [(r["name"], r["next_run"]) for r in rows] == [
        ("often", datetime(2026, 11, 24, 8, 20, 25, tzinfo=dt_timezone.utc)),  # 70 s ago + 3 x 30 s
        ("hourly", datetime(2026, 11, 24, 9, 17, tzinfo=dt_timezone.utc)),
        ("nightly", datetime(2026, 11, 25, 3, 0, tzinfo=dt_timezone.utc)),
    ]


def test_panel_shows_next_run_and_durations(admin_client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # full mode: a beat runs (the page lists its schedule)
    settings.CELERY_BEAT_SCHEDULE = beat_schedule({"nightly recompute": ("0 3 * * *", "topological_ordering")})
    start = timezone.now() - timedelta(hours=1)
    for seconds in (12, 30):
        JobRun.objects.create(job="topological_ordering", status=JobRun.Status.SUCCEEDED,
                              started_at=start, ended_at=start + timedelta(seconds=seconds))
        start += timedelta(minutes=1)
    [row] = job_schedule()
    assert row["durations"] == [30.0, 12.0] and row["next_run"].hour == 3
    page = admin_client.get("/").content.decode()
    assert "nightly recompute" in page
    text = re.sub(r"<[^>]+>", "", page)  # (the date and the time are spans of their own)
    assert f"{row['next_run']:%Y-%m-%d} 03:00:00 UTC" in text and "30.0, 12.0" in page


def test_feed_carries_progress_and_the_cancel_button_asks_for_a_cancel(admin_client):
    run = JobRun.objects.create(job="visibility", started_at=timezone.now(), spark_ui_url="http://h:4040",
                                progress={"stages": [{"job": 0, "id": 0, "name": "x", "tasks": 8, "done": 3,
                                                      "active": 2, "failed": 0}], "tasks": 8, "done": 3})
    [fed] = recent_job_runs()
    assert fed["progress"] == "stages 0/1, tasks 3/8" and fed["spark_ui_url"] == "http://h:4040"
    assert admin_client.post(f"/jobs/{run.pk}/cancel").status_code == 302
    assert JobRun.objects.get(pk=run.pk).cancel_requested
    run.status = JobRun.Status.SUCCEEDED
    run.save()
    assert admin_client.post(f"/jobs/{run.pk}/cancel").status_code == 400  # not running any more
    assert recent_job_runs()[0]["spark_ui_url"] == ""


@pytest.mark.parametrize("eager", [True, False])
def test_a_start_is_refused_before_anything_starts_while_another_run_holds_the_lock(admin_client, settings, eager):
    """On the embedded default (a child per run) and in full mode (a Celery task): 409 with the
    reason, no run recorded, no launcher thread."""
    import threading

    from jobs.lock import JobLock

    settings.CELERY_TASK_ALWAYS_EAGER = eager
    with JobLock("check_visibility") as held:
        assert held
        answer = admin_client.post("/jobs/start", {"job": "check_visibility"})
    assert answer.status_code == 409
    assert "another run of check_visibility holds its lock" in answer.json()["error"]
    assert not JobRun.objects.exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("job check_visibility")]


def test_the_embedded_default_lists_no_beat_schedule(admin_client, settings):
    """No Celery beat runs without Redis: the page says so instead of listing next runs."""
    from jobs.schedules import beat_schedule

    settings.CELERY_BEAT_SCHEDULE = beat_schedule({"nightly recompute": ("0 3 * * *", "topological_ordering")})
    settings.REDIS_URL = ""
    page = admin_client.get("/").content.decode()
    schedule = page.split('class="job-schedule"')[1].split("</table>")[0]
    assert "no Celery beat runs on the embedded default" in schedule and "nightly recompute" not in schedule
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # full mode: the beat's next runs
    schedule = admin_client.get("/").content.decode().split('class="job-schedule"')[1].split("</table>")[0]
    assert "nightly recompute" in schedule and "no Celery beat" not in schedule


def test_a_runs_page_agrees_with_its_list(admin_client):
    """A check that found differences reads "failed" on its own page too: its title and
    breadcrumb included, never "(succeeded)" beside "failed: 4 differences"."""
    run = JobRun.objects.create(job="check_visibility", status=JobRun.Status.SUCCEEDED, differences=4,
                                started_at=timezone.now() - timedelta(seconds=5), ended_at=timezone.now())
    listing = admin_client.get("/admin/jobs/jobrun/").content.decode()
    page = admin_client.get(f"/admin/jobs/jobrun/{run.pk}/change/").content.decode()
    assert "failed: 4 differences" in listing and "failed: 4 differences" in page
    assert "succeeded" not in re.sub(r"<[^>]+>", " ", page), page
    assert str(run) == f"check_visibility #{run.pk} (failed: 4 differences)"


def test_a_run_clicked_in_full_mode_is_queued_until_a_worker_takes_it_and_keeps_its_log(
        admin_client, settings, tmp_path, django_capture_on_commit_callbacks):
    """Full mode: the click makes a ``queued`` run at once (the panel shows it, with Cancel) and
    sends its task; the worker that takes the message fills in that same record and keeps its
    log, as a child run does."""
    from jobs.celery_app import app
    from jobs.tasks import run_job_task

    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.STATE_DIR = tmp_path
    with django_capture_on_commit_callbacks(execute=True):
        answer = admin_client.post("/jobs/start", {"job": "check_visibility", "rooms": "!nowhere:hs"})
    assert answer.status_code == 302
    [run] = JobRun.objects.all()
    assert run.status == JobRun.Status.QUEUED and run.trigger == "dashboard (admin)"
    [fed] = recent_job_runs()
    assert (fed["id"], fed["verdict_text"]) == (run.pk, "queued")
    with app.connection_for_read() as connection:  # the worker's side: the message the click sent
        message = connection.SimpleQueue("celery").get(timeout=5)
        args, kwargs, _embed = message.decode()
        message.ack()
    assert kwargs["run_id"] == run.pk
    run_job_task.apply(args=args, kwargs=kwargs)
    assert list(JobRun.objects.values_list("pk", "status")) == [(run.pk, JobRun.Status.FAILED)]
    assert recent_job_runs()[0]["has_log"]
    log = admin_client.get(f"/jobs/{run.pk}/log").content.decode()
    assert f"run #{run.pk} (check_visibility): taken by a Celery worker" in log
    assert "!nowhere:hs does not exist" in log


def test_a_queued_run_is_cancelled_at_once(admin_client):
    run = JobRun.objects.create(job="check_visibility", status=JobRun.Status.QUEUED, started_at=timezone.now())
    assert admin_client.post(f"/jobs/{run.pk}/cancel").status_code == 302
    run.refresh_from_db()
    assert run.status == JobRun.Status.CANCELLED and run.ended_at is not None


def _run_with_findings(n: int, rooms: tuple[str, ...] = ("!a:hs", "!b:hs")) -> JobRun:
    now = timezone.now()
    sample = [{"room_id": rooms[i % len(rooms)], "event_id": f"$e{i}", "expected": i, "found": i + 1000}
              for i in range(n)]
    return JobRun.objects.create(job="check_topological_ordering", status=JobRun.Status.SUCCEEDED, started_at=now,
                                 ended_at=now, rows_in=5000, rows_out=0, differences=n + 50, difference_sample=sample)


def _cells(html: str) -> list[list[str]]:
    body = html.split('<table class="differences">', 1)[1].split("</table>", 1)[0].split("<tbody>", 1)[1]
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)]


def test_the_findings_page_lists_every_kept_finding_a_page_at_a_time(admin_client):
    run = _run_with_findings(250)
    first = admin_client.get(f"/jobs/{run.pk}/findings").content.decode()
    assert "250 of 300 differences kept" in first and "page 1 of 3" in first
    rows = _cells(first)
    assert len(rows) == 100 and rows[0][:2] == ["!a:<wbr>hs", "$e0"] and rows[0][2:4] == ["0", "1000"]
    last = _cells(admin_client.get(f"/jobs/{run.pk}/findings?page=3").content.decode())
    assert [r[1] for r in last] == [f"$e{i}" for i in range(200, 250)]
    # a page past the end or not a number: the last or the first page, never an error
    assert _cells(admin_client.get(f"/jobs/{run.pk}/findings?page=99").content.decode()) == last
    assert _cells(admin_client.get(f"/jobs/{run.pk}/findings?page=x").content.decode()) == rows


def test_the_findings_page_narrows_to_one_room_and_keeps_it_across_pages(admin_client):
    run = _run_with_findings(250)
    html = admin_client.get(f"/jobs/{run.pk}/findings", {"room": "!b:hs"}).content.decode()
    assert "125 in <code>!b:hs</code>" in html and "page 1 of 2" in html
    assert {r[0] for r in _cells(html)} == {"!b:<wbr>hs"}
    assert 'href="?room=%21b%3Ahs&amp;page=2"' in html
    assert "no findings in this room" in admin_client.get(f"/jobs/{run.pk}/findings", {"room": "!c:hs"}).content.decode()


def test_the_findings_page_of_a_missing_run_is_a_404_and_needs_staff(admin_client, client):
    missing = admin_client.get("/jobs/999999/findings")
    assert missing.status_code == 404 and b"run #999999 does not exist" in missing.content
    run = _run_with_findings(3)
    assert client.get(f"/jobs/{run.pk}/findings").status_code == 302  # to the sign-in page


def test_the_streams_page_and_the_admin_link_a_runs_findings(admin_client):
    run = _run_with_findings(12)
    link = f'href="jobs/{run.pk}/findings"'
    assert link in admin_client.get("/").content.decode()
    assert f'href="/jobs/{run.pk}/findings"' in admin_client.get(f"/admin/jobs/jobrun/{run.pk}/change/").content.decode()

"""End to end on real PostgreSQL, Redis and a real Celery worker process: generated rooms,
orderings corrupted on purpose, the check reports exactly those, the recompute fixes them."""
from __future__ import annotations

import os

import pytest
from django.core.management import call_command
from django.db import connection

from jobs.models import JobRun
from rooms.models import Event
from testing.celery_client import client_of
from testing.processes import ProcessGroup, database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def celery_worker(tmp_path_factory, django_db_setup, django_db_blocker, redis_server):
    """A Celery worker (solo pool) in its own process, on a Redis broker, shared by the
    module's tests (each test's rows are its own: transactional tests flush afterwards)."""
    pg_url = database_url()
    tmp_path = tmp_path_factory.mktemp("celery")
    group = ProcessGroup(tmp_path)
    group.env = {**os.environ, "DATABASE_URL": pg_url, "REDIS_URL": redis_server.url,
                 "STATE_DIR": str(tmp_path / "state"), "SPARK_MASTER": "local[2]"}
    group.start("celery", "-m", "celery", "-A", "synapse_repl", "worker", "--pool", "solo",
                "--loglevel", "INFO", "-Q", "celery", "--without-heartbeat", "--without-mingle",
                "--without-gossip")
    try:
        with client_of(redis_server.url):
            yield group
    finally:
        group.stop()


def through_celery(job: str, rooms=None) -> JobRun:
    from jobs.tasks import run_job_task

    result = run_job_task.apply_async(args=(job, rooms), kwargs={"trigger": "test"})
    answer = result.get(timeout=600)
    return JobRun.objects.get(pk=answer["run"])


def corrupt(event_ids: list[str]) -> None:
    """What a bug or a bad import would do: orderings changed behind the persist path's back."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE events SET topological_ordering = topological_ordering + 1000, "
                       "depth = depth + 1000 WHERE event_id = ANY(%s)", [event_ids])


def test_check_reports_exactly_the_corrupted_orderings_and_recompute_fixes_them(celery_worker):
    call_command("generate_rooms", rooms=12, users=25, events=1500, seed=3, batch=250, no_progress=True)
    events = list(Event.objects.order_by("stream_ordering").values_list("event_id", "room_id", "topological_ordering"))
    original = {e: t for e, _, t in events}
    victims = [events[i][0] for i in (5, 100, 700, len(events) - 3)]
    corrupt(victims)

    check = through_celery("check_topological_ordering")
    assert check.status == JobRun.Status.SUCCEEDED and check.trigger == "test"
    assert check.rows_in == len(events)
    assert check.differences == len(victims)
    assert {(d["event_id"], int(d["expected"]), int(d["found"])) for d in check.difference_sample} == {
        (v, original[v], original[v] + 1000) for v in victims}

    fix = through_celery("topological_ordering")
    assert fix.status == JobRun.Status.SUCCEEDED and fix.rows_out == len(victims)
    stored = dict(Event.objects.values_list("event_id", "topological_ordering"))
    assert stored == original
    again = through_celery("check_topological_ordering")
    assert again.differences == 0


def test_job_on_given_rooms_touches_only_those(celery_worker):
    call_command("generate_rooms", rooms=6, users=15, events=400, seed=4, batch=200, no_progress=True)
    rows = list(Event.objects.values_list("event_id", "room_id"))
    rooms = sorted({r for _, r in rows})
    target, other = rooms[0], rooms[1]
    in_target = [e for e, r in rows if r == target][:2]
    in_other = [e for e, r in rows if r == other][:2]
    corrupt(in_target + in_other)

    run = through_celery("topological_ordering", [target])
    assert run.parameters == {"rooms": [target]}
    assert run.rows_in == sum(1 for _, r in rows if r == target)
    assert run.rows_out == 2
    check = through_celery("check_topological_ordering")
    assert {d["event_id"] for d in check.difference_sample} == set(in_other)


def test_failed_run_leaves_tables_intact_and_is_recorded(settings, tmp_path):
    """A job that fails after its staging table is written changes nothing live."""
    from jobs import definitions, io

    call_command("generate_rooms", rooms=3, users=8, events=150, seed=5, batch=150, no_progress=True)
    before = dict(Event.objects.values_list("event_id", "topological_ordering"))
    corrupt(list(before)[:3])
    corrupted = dict(Event.objects.values_list("event_id", "topological_ordering"))

    real_swap = io.swap_in

    def failing_swap(statements, using="default"):
        # the first statement applies, then the database fails: the transaction must undo it
        return real_swap([*statements[:1], ("SELECT 1/0", ())], using)

    definitions.io.swap_in = failing_swap
    try:
        from jobs.runner import run_job

        with pytest.raises(Exception, match="division by zero"):
            run_job("topological_ordering")
    finally:
        definitions.io.swap_in = real_swap
    assert dict(Event.objects.values_list("event_id", "topological_ordering")) == corrupted
    run = JobRun.objects.get(job="topological_ordering")
    assert run.status == JobRun.Status.FAILED and "division by zero" in run.error
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'job_staging_%%'")
        assert cursor.fetchone()[0] == 0  # no staging table left behind

"""The visibility job against what the persist path stored, on generated rooms (PostgreSQL)."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from jobs.models import JobRun
from jobs.runner import run_job

pytestmark = pytest.mark.django_db(transaction=True)


def ranges() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT room_id, user_id, start_topological, start_stream, end_topological, end_stream "
                       "FROM room_visibility_ranges ORDER BY 1, 2, 3, 4")
        return cursor.fetchall()


def test_job_agrees_with_the_persist_path_and_repairs_damage(spark):
    call_command("generate_rooms", rooms=15, users=30, events=2500, seed=11, batch=300, no_progress=True)
    check = run_job("check_visibility")
    assert check.status == JobRun.Status.SUCCEEDED
    assert check.differences == 0, check.difference_sample[:20]
    stored = ranges()
    assert stored

    # damage: a user loses a range, another gains everything in a room. The victim's range
    # holds their latest join, which no *shared era before it can stand in for (a range
    # inside the eras before that join would change nothing a read shows, nor the check).
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT ON (room_id, user_id) room_id, user_id, topological_ordering, "
                       "event_stream_ordering FROM room_memberships WHERE membership = 'join' "
                       "ORDER BY room_id, user_id, topological_ordering DESC, event_stream_ordering DESC")
        latest = {(r, u): (t, s) for r, u, t, s in cursor.fetchall()}
    holding = [r for r in stored if (r[0], r[1]) in latest and (r[2], r[3]) <= latest[(r[0], r[1])]
               and (r[4] is None or latest[(r[0], r[1])] <= (r[4], r[5]))]
    victim = holding[len(holding) // 2]
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM room_visibility_ranges WHERE room_id = %s AND user_id = %s "
                       "AND start_topological = %s AND start_stream = %s", victim[:4])
        cursor.execute("INSERT INTO room_visibility_ranges (room_id, user_id, start_topological, start_stream, "
                       "end_topological, end_stream) VALUES (%s, '@intruder:hs', 0, -9999999, NULL, NULL)",
                       [stored[0][0]])
    damaged = run_job("check_visibility")
    users = {(d["room_id"], d["user_id"]) for d in damaged.difference_sample}
    assert (victim[0], victim[1]) in users and (stored[0][0], "@intruder:hs") in users
    assert users <= {(victim[0], victim[1]), (stored[0][0], "@intruder:hs")}
    intruder = [(d["expected"], d["found"]) for d in damaged.difference_sample if d["user_id"] == "@intruder:hs"]
    assert ("closed", "open") in intruder  # and every new event would be shown too
    assert set(intruder) == {("hidden", "visible"), ("closed", "open")}

    fix = run_job("visibility")
    assert fix.status == JobRun.Status.SUCCEEDED and fix.rows_out > 0
    assert run_job("check_visibility").differences == 0

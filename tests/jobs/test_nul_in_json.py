"""Events whose JSON holds ``\\u0000`` (valid JSON, stored losslessly) do not stop the topology
and visibility jobs on PostgreSQL, whose ``jsonb`` refuses that escape."""
from __future__ import annotations

import pytest

from jobs.models import JobRun
from jobs.runner import run_job
from rooms.storage.synthetic import RoomBuilder
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, rows, store  # noqa: F401

A, J = "@resident:hs", "@joiner:hs"


@ON_BOTH_DATABASES
@pytest.mark.parametrize("default_database", ["postgresql"], indirect=True)  # SQLite's JSON functions accept it
def test_jobs_read_events_with_a_nul_escape(store, spark):
    b = RoomBuilder("!nul:hs", server="hs")
    events = [
        b.create(A), b.member(A, "join"),
        # the history_visibility event itself carries the escape (read by the visibility job)
        b.event("m.room.history_visibility", A, {"history_visibility": "joined", "note": "a\u0000b"}, state_key=""),
        b.message(A, "before\u0000"),  # every event's depth is read by the ordering job
        b.member(J, "join"),
        b.message(A, "after"),
    ]
    store.persist(*(raw for _, raw in events))
    assert b"\\u0000" in rows("SELECT json FROM events WHERE event_id = %s", events[3][0])[0][0]

    for job in ("check_topological_ordering", "check_visibility"):
        run = run_job(job)
        assert run.status == JobRun.Status.SUCCEEDED, (job, run.error)
        assert run.differences == 0, (job, run.difference_sample)
        assert run.rows_in == len(events), job
    # the visibility job read the value ("joined": the joiner does not see the message before)
    fix = run_job("visibility")
    assert fix.status == JobRun.Status.SUCCEEDED, fix.error
    assert rows("SELECT start_stream FROM room_visibility_ranges WHERE user_id = %s", J)
    assert run_job("check_visibility").differences == 0

"""generate_rooms: a realistic dataset through the real persist path."""
from __future__ import annotations

import json
from io import StringIO

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def one(sql):
    with connection.cursor() as c:
        c.execute(sql)
        return c.fetchone()[0]


@pytest.fixture
def fresh_runtime():
    """The command uses the process runtime: a new one per database (it holds the caches,
    which name state groups of one database)."""
    apps.get_app_config("streams").runtime = None
    yield
    apps.get_app_config("streams").runtime = None


def test_generate_rooms_builds_every_feature(default_database, fresh_runtime):
    out = StringIO()
    call_command("generate_rooms", rooms=40, users=60, events=3000, seed=7, batch=200, no_progress=True, stdout=out)
    assert "persisted" in out.getvalue()
    assert one("SELECT count(*) FROM events") >= 3000
    assert one("SELECT count(DISTINCT room_id) FROM rooms") == 40
    assert one("SELECT count(*) FROM events WHERE stream_ordering < 0") > 0  # backfilled history
    assert one("SELECT count(*) FROM events WHERE outlier") > 0
    assert one("SELECT count(*) FROM events WHERE redacted") > 0
    assert one("SELECT count(*) FROM room_memberships WHERE membership = 'invite'") > 0
    assert one("SELECT count(*) FROM room_memberships WHERE membership = 'leave'") > 0
    with connection.cursor() as c:
        c.execute("SELECT json FROM events WHERE type = 'm.room.history_visibility'")
        values = {json.loads(bytes(raw))["content"]["history_visibility"] for (raw,) in c.fetchall()}
    assert values == {"world_readable", "shared", "invited", "joined"}
    assert one("SELECT count(*) FROM room_visibility_ranges WHERE user_id = '*'") > 0
    # real PDUs of every room version, all authorized: no rejections; forks merged; bans
    assert one("SELECT count(*) FROM rejections") == 0
    assert one("SELECT count(DISTINCT room_version) FROM rooms WHERE authorized") == 12
    assert one("SELECT count(*) FROM rooms WHERE NOT authorized") == 0
    assert one("SELECT count(*) FROM event_auth") > 3000
    assert one("SELECT count(*) FROM room_memberships WHERE membership = 'ban'") > 0
    assert one("SELECT count(*) FROM (SELECT event_id FROM event_edges GROUP BY event_id "
               "HAVING count(*) > 1) AS merges") > 0
    # backfill closed every gap down to the state we hold only as outliers
    assert one("SELECT count(*) FROM event_backward_extremities b LEFT JOIN events e USING (event_id) "
               "WHERE e.outlier IS NOT TRUE") == 0
    # each batch replaced only the ranges after the first one it changed: the rows are still
    # the persister's ranges, kept in memory from batch to batch, for every (room, user)
    from rooms.storage.persist import persister_for

    contexts = persister_for(apps.get_app_config("streams").runtime).rooms._d
    with connection.cursor() as c:
        c.execute("SELECT room_id, user_id, start_topological, start_stream, end_topological, end_stream "
                  "FROM room_visibility_ranges")
        stored = sorted(c.fetchall(), key=repr)
    held = sorted(((r, u, s[0], s[1], None if e is None else e[0], None if e is None else e[1])
                   for r, ctx in contexts.items() for u, rs in ctx.ranges.items() for s, e in rs.ranges),
                  key=repr)
    assert len(contexts) == 40 and len(stored) > 100 and stored == held
    with pytest.raises(CommandError, match="already generated"):
        call_command("generate_rooms", rooms=40, users=60, events=10, seed=7, no_progress=True)


@pytest.mark.parametrize("rooms, users, events", [(1, 2, 5), (3, 2, 40), (25, 3, 300)])
def test_tiny_sizes_persist_without_unknown_prev_events(default_database, fresh_runtime, rooms, users, events):
    call_command("generate_rooms", rooms=rooms, users=users, events=events, seed=2, batch=50, no_progress=True,
                 stdout=StringIO())
    assert one("SELECT count(*) FROM events") >= events
    assert one("SELECT count(*) FROM rejections") == 0

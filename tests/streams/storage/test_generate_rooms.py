"""generate_rooms: a realistic dataset through the real persist path."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from streams.storage.reads import forget_caches

pytestmark = pytest.mark.django_db(transaction=True)


def one(sql):
    with connection.cursor() as c:
        c.execute(sql)
        return c.fetchone()[0]


def test_generate_rooms_builds_every_feature():
    forget_caches()
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
    assert one("SELECT count(DISTINCT convert_from(json, 'UTF8')::jsonb->'content'->>'history_visibility') "
               "FROM events WHERE type = 'm.room.history_visibility'") == 4
    assert one("SELECT count(*) FROM room_visibility_ranges WHERE user_id = '*'") > 0
    # backfill closed every gap down to the state we hold only as outliers
    assert one("SELECT count(*) FROM event_backward_extremities b LEFT JOIN events e USING (event_id) "
               "WHERE e.outlier IS NOT TRUE") == 0
    with pytest.raises(CommandError, match="already generated"):
        call_command("generate_rooms", rooms=40, users=60, events=10, seed=7, no_progress=True)

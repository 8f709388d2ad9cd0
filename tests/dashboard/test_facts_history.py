"""The facts/s history in the database: one sample per stream and minute, kept a day."""
from datetime import datetime, timedelta, timezone

import pytest
from django.test import Client

from dashboard.facts_history import RETENTION, facts_per_minute, record_minute
from dashboard.models import FactsPerMinute
from tests.dashboard.test_views import receipts_written, staff_client  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 11, 24, 12, 0, 30, tzinfo=timezone.utc)


def test_a_day_of_minutes_is_kept_and_older_samples_pruned():
    old = NOW - timedelta(hours=26)
    record_minute(now=old, totals={"events": 1})
    day_ago = NOW - timedelta(hours=24)
    record_minute(now=day_ago - timedelta(minutes=1), totals={"events": 100, "receipts": 5})
    record_minute(now=day_ago, totals={"events": 160, "receipts": 5})
    record_minute(now=NOW - timedelta(minutes=2), totals={"events": 400, "receipts": 5})
    record_minute(now=NOW, totals={"events": 520, "receipts": 11})

    minutes = {m.replace(tzinfo=timezone.utc) if m.tzinfo is None else m
               for m in FactsPerMinute.objects.values_list("minute", flat=True)}
    assert old.replace(second=0) not in minutes  # older than RETENTION: gone
    assert (day_ago - timedelta(minutes=1)).replace(second=0) in minutes  # a day back: kept
    assert RETENTION >= timedelta(hours=24)

    points = facts_per_minute(since=NOW - timedelta(hours=24))
    assert [p["t"] for p in points] == [day_ago.replace(second=0).timestamp(),
                                       (NOW - timedelta(minutes=2)).replace(second=0).timestamp(),
                                       NOW.replace(second=0).timestamp()]
    assert points[0]["rates"] == {"events": 1.0, "receipts": 0.0}
    # the gap of 24 h minus 3 minutes is averaged over its length, not shown as a spike
    assert points[1]["rates"]["events"] == round(240 / (points[1]["t"] - points[0]["t"]), 2)
    assert points[2]["rates"] == {"events": 1.0, "receipts": 0.05}


def test_the_first_sample_of_a_minute_wins():
    record_minute(now=NOW, totals={"events": 10})
    record_minute(now=NOW + timedelta(seconds=20), totals={"events": 99})  # another process, same minute
    assert list(FactsPerMinute.objects.values_list("facts_total", flat=True)) == [10]


def test_recorded_from_the_streams_positions(receipts_written):
    rt, w, ids = receipts_written
    record_minute(now=NOW)
    assert FactsPerMinute.objects.get(stream="receipts").facts_total == ids[-1]


def test_history_view(staff_client):  # noqa: F811
    record_minute(now=datetime.now(timezone.utc) - timedelta(minutes=3), totals={"events": 0})
    record_minute(now=datetime.now(timezone.utc), totals={"events": 360})
    body = staff_client.get("/facts-per-minute.json").json()
    assert body["minutes"][-1]["rates"]["events"] == 2.0
    assert staff_client.get("/facts-per-minute.json?hours=abc").status_code == 400
    assert staff_client.get("/facts-per-minute.json?hours=100").status_code == 400
    assert Client().get("/facts-per-minute.json").status_code == 403  # anonymous

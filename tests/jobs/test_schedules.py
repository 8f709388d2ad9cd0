"""Beat schedules from settings strings: crontabs, intervals, and clear refusals."""
from __future__ import annotations

from datetime import timedelta

import pytest
from celery.schedules import crontab, schedule
from django.core.exceptions import ImproperlyConfigured

from jobs.schedules import beat_schedule, half_an_hour_later, parse_schedule


def test_crontab_and_interval():
    cron = parse_schedule("x", "17 * * * *")
    assert isinstance(cron, crontab) and cron.minute == {17} and len(cron.hour) == 24
    every = parse_schedule("x", "@every 5s")
    assert isinstance(every, schedule) and every.run_every == timedelta(seconds=5)
    assert parse_schedule("x", " @every 2m ").run_every == timedelta(minutes=2)
    assert parse_schedule("x", "@every 1h").run_every == timedelta(hours=1)


@pytest.mark.parametrize("text", ["17 * * *", "@every", "@every 5", "@every 0s", "@every 5d", "61 * * * *"])
def test_bad_schedules_name_the_entry(text):
    with pytest.raises(ImproperlyConfigured, match="schedule 'hourly check'"):
        parse_schedule("hourly check", text)


def test_beat_entries_and_empty_schedules_off():
    entries = beat_schedule({"a": ("@every 3s", "check_visibility"), "b": ("", "visibility"),
                             "c": ("0 3 * * *", "topological_ordering")})
    assert set(entries) == {"a", "c"}
    assert entries["a"]["task"] == "streams.run_job" and entries["a"]["args"] == ("check_visibility",)
    assert entries["a"]["kwargs"] == {"trigger": "beat"}


def test_half_an_hour_later():
    assert half_an_hour_later("0 3 * * *") == "30 3 * * *"
    assert half_an_hour_later("@every 10s") == "@every 10s"
    assert half_an_hour_later("") == ""

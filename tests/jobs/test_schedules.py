"""Beat schedules from settings strings: crontabs, intervals, and clear refusals."""
from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from celery.schedules import crontab, schedule
from django.core.exceptions import ImproperlyConfigured

from jobs.schedules import BeatSchedule, beat_schedule, half_an_hour_later, parse_schedule

ROOT = Path(__file__).resolve().parents[2]


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


def test_settings_keep_the_strings_and_make_the_entries_when_first_read():
    lazy = BeatSchedule({"a": ("@every 3s", "check_visibility"), "bad": ("61 * * * *", "visibility")})
    with pytest.raises(ImproperlyConfigured, match="schedule 'bad'"):
        dict(lazy)
    good = BeatSchedule({"a": ("@every 3s", "check_visibility"), "b": ("", "visibility")})
    assert dict(good) == beat_schedule(good.schedules) and list(good) == ["a"]


def test_a_process_that_sends_no_job_loads_no_celery():
    """Settings hold the beat schedule unbuilt and the Celery app lives with the jobs' tasks:
    a process that only loads Django (a worker, a writer, a one-off command) imports none of
    Celery (0.3 CPU-s of its start)."""
    code = ("import os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'synapse_repl.settings'; "
            "import django; django.setup(); print(sorted(m for m in sys.modules if m.split('.')[0] == 'celery'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""Celery beat entries from schedule strings kept in settings (and so in the environment).

A schedule is a crontab ``"minute hour day-of-month month day-of-week"`` or an interval
``"@every 30s"`` (``s``, ``m`` or ``h``; for tests and demos that cannot wait for a minute
boundary); an empty string turns it off.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_EVERY = re.compile(r"@every\s+(\d+)\s*([smh])")
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours"}


def parse_schedule(name: str, text: str):
    """``text`` as a Celery schedule (a crontab or a fixed interval); raises naming ``name``."""
    from celery.schedules import crontab, schedule

    every = _EVERY.fullmatch(text.strip())
    if every:
        interval = timedelta(**{_UNIT[every.group(2)]: int(every.group(1))})
        if not interval:
            raise ImproperlyConfigured(f"schedule {name!r}: {text!r}: the interval must be positive")
        return schedule(run_every=interval)
    fields = text.split()
    if len(fields) != 5:
        raise ImproperlyConfigured(f"schedule {name!r}: {text!r} is not 'minute hour day month weekday' "
                                   "nor '@every N(s|m|h)'")
    try:
        minute, hour, day_of_month, month_of_year, day_of_week = fields
        return crontab(minute=minute, hour=hour, day_of_month=day_of_month,
                       month_of_year=month_of_year, day_of_week=day_of_week)
    except ValueError as e:
        raise ImproperlyConfigured(f"schedule {name!r}: {text!r}: {e}") from e


def half_an_hour_later(text: str) -> str:
    """The crontab ``text`` at minute 30 instead (the visibility job, after the orderings it
    ranges over); an interval or an empty schedule stays as it is."""
    if not text.strip() or text.strip().startswith("@"):
        return text
    return " ".join(["30", *text.split()[1:]])


def beat_schedule(schedules: dict[str, tuple[str, str]]) -> dict[str, dict]:
    """``{"name": (schedule, job)}`` -> ``CELERY_BEAT_SCHEDULE`` (empty schedule: off)."""
    out = {}
    for name, (text, job) in schedules.items():
        if not text.strip():
            continue
        out[name] = {"task": "streams.run_job", "schedule": parse_schedule(name, text), "args": (job,),
                     "kwargs": {"trigger": "beat"}}
    return out


class BeatSchedule(Mapping[str, dict]):
    """``CELERY_BEAT_SCHEDULE`` as settings hold it: the entries of :func:`beat_schedule`, made
    from the schedule strings when first read. Every process loads the settings, and only
    beat, the jobs panel and ``runservice``'s start-up check read this: Celery's schedule
    classes (0.3 CPU-s of imports) load there and nowhere else. A bad schedule string is
    refused when first read, naming its entry."""

    def __init__(self, schedules: dict[str, tuple[str, str]]) -> None:
        self.schedules = schedules
        self._entries: dict[str, dict] | None = None

    def entries(self) -> dict[str, dict]:
        if self._entries is None:
            self._entries = beat_schedule(self.schedules)
        return self._entries

    def __getitem__(self, name: str) -> dict:
        return self.entries()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries())

    def __len__(self) -> int:
        return len(self.entries())

    def __repr__(self) -> str:
        return f"BeatSchedule({self.schedules!r})"


def next_cron_minute(cron, now):
    """The first minute after ``now`` (same time zone) that Celery crontab ``cron`` matches."""
    t = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(366 * 24 * 60):
        if (t.minute in cron.minute and t.hour in cron.hour and t.day in cron.day_of_month
                and t.month in cron.month_of_year and (t.weekday() + 1) % 7 in cron.day_of_week):
            return t
        t += timedelta(minutes=1)
    return None


def next_runs(beat: dict[str, dict], now, last_runs: dict[str, object] | None = None) -> list[dict]:
    """When each beat entry fires next, for the jobs panel: ``[{"name", "job", "next_run"}]``
    sorted by time. ``last_runs``: the job -> the start of its last beat run (an interval
    schedule counts from it; from ``now`` when it never ran)."""
    out = []
    for name, entry in beat.items():
        job = entry["args"][0]
        sched = entry["schedule"]
        last = (last_runs or {}).get(job) or now
        if hasattr(sched, "run_every") and not hasattr(sched, "minute"):  # a fixed interval
            nxt = last + sched.run_every
            while nxt < now:
                nxt += sched.run_every
        else:
            nxt = next_cron_minute(sched, now)
        out.append({"name": name, "job": job, "next_run": nxt})
    return sorted(out, key=lambda e: e["next_run"])


#: Who holds a schedule file's lock, as a refusal names it.
BEAT_LOCK_WHAT = "a celery beat on this schedule file"


def beat_lock_path(schedule_filename: str) -> Path:
    """The lock of a beat's schedule file: beside it."""
    return Path(f"{schedule_filename}.lock")

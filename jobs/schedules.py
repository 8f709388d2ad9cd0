"""Celery beat entries from schedule strings kept in settings (and so in the environment).

A schedule is a crontab ``"minute hour day-of-month month day-of-week"`` or an interval
``"@every 30s"`` (``s``, ``m`` or ``h``; for tests and demos that cannot wait for a minute
boundary); an empty string turns it off.
"""
from __future__ import annotations

import re
from datetime import timedelta

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

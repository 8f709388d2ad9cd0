"""Celery beat entries from crontab strings kept in settings (and so in the environment)."""
from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


def beat_schedule(schedules: dict[str, tuple[str, str]]) -> dict[str, dict]:
    """``{"name": ("m h dom mon dow", job)}`` -> ``CELERY_BEAT_SCHEDULE`` (empty cron: off)."""
    from celery.schedules import crontab

    out = {}
    for name, (cron, job) in schedules.items():
        if not cron.strip():
            continue
        fields = cron.split()
        if len(fields) != 5:
            raise ImproperlyConfigured(f"schedule {name!r}: {cron!r} is not 'minute hour day month weekday'")
        try:
            minute, hour, day_of_month, month_of_year, day_of_week = fields
            entry = crontab(minute=minute, hour=hour, day_of_month=day_of_month,
                            month_of_year=month_of_year, day_of_week=day_of_week)
        except ValueError as e:
            raise ImproperlyConfigured(f"schedule {name!r}: {cron!r}: {e}") from e
        out[name] = {"task": "streams.run_job", "schedule": entry, "args": (job,), "kwargs": {"trigger": "beat"}}
    return out

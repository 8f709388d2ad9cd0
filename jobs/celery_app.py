"""The Celery app that launches the jobs. Eager on the embedded default; Redis broker when
REDIS_URL is set. Only a process that sends or runs jobs imports it (``jobs.tasks``, the
dashboard's Celery check, ``celery -A synapse_repl`` through ``synapse_repl/celery.py``):
Celery's imports cost about 0.3 CPU-s, which every other process of the service saves.

One beat per schedule file: a beat holds ``<schedule file>.lock`` for its life
(common/state_lock.py), so two never send the same scheduled jobs.
"""
import logging
import os
import sys

from celery import Celery, signals

from common.state_lock import StateLockHeld, hold
from common.url_redaction import RedactingWrapper
from jobs.schedules import BEAT_LOCK_WHAT, beat_lock_path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")

app = Celery("synapse_repl")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def redact_celery_logs(logger, **kwargs) -> None:
    """A Celery worker sets up logging of its own (not ``LOGGING``): its lines go through the
    same redaction of URL passwords (docs/security.md)."""
    for handler in logger.handlers:
        if not isinstance(handler.formatter, RedactingWrapper):
            handler.setFormatter(RedactingWrapper(handler.formatter or logging.Formatter()))


@signals.beat_init.connect
def hold_the_schedule(sender, **kwargs) -> None:
    """Before beat opens its schedule file: take its lock, or exit with one line naming the
    beat that holds it (the lock stays held as long as the beat process lives)."""

    try:
        sender.schedule_lock = hold(beat_lock_path(sender.schedule_filename), BEAT_LOCK_WHAT)
    except StateLockHeld as e:
        sys.stderr.write(f"error: {e}\n")
        sys.stderr.flush()
        raise SystemExit(1) from None

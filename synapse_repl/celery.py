"""The Celery app. Eager on the embedded default; Redis broker when REDIS_URL is set.

One beat per schedule file: a beat holds ``<schedule file>.lock`` for its life
(common/state_lock.py), so two never send the same scheduled jobs.
"""
import logging
import os
import sys
from pathlib import Path

from celery import Celery, signals

from common.state_lock import StateLockHeld, hold
from common.url_redaction import RedactingWrapper

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


#: Who holds a schedule file's lock, as a refusal names it.
BEAT_LOCK_WHAT = "a celery beat on this schedule file"


def beat_lock_path(schedule_filename: str) -> Path:
    """The lock of a beat's schedule file: beside it."""
    return Path(f"{schedule_filename}.lock")

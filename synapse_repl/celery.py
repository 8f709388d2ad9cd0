"""The Celery app. Eager on the embedded default; Redis broker when REDIS_URL is set."""
import logging
import os

from celery import Celery, signals

from .redaction import RedactingWrapper

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

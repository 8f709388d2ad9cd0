"""The Celery app. Eager on the embedded default; Redis broker when REDIS_URL is set."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")

app = Celery("synapse_repl")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

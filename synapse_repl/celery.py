"""The entry point of ``celery -A synapse_repl worker``: the jobs' Celery app (jobs/celery_app.py)."""
from jobs.celery_app import app

__all__ = ("app",)

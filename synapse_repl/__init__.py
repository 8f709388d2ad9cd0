"""synapse_repl: the stream and replication backbone of a Matrix homeserver cluster."""
from .celery import app as celery_app

__all__ = ("celery_app",)

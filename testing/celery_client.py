"""The test process as a Celery client of a real worker process: the in-process app pointed at
the worker's broker and result backend, and a way to wait until the worker has nothing running.

Celery keeps the result backend and the broker connections it first made: a test that changes
``broker_url`` / ``result_backend`` must make them anew, or ``result.get()`` asks a backend an
earlier test made (the eager default has none: it fails at once, while the worker goes on with
the task). A test whose worker still runs a job when the test ends would see its database
flushed under the job: the job's snapshot holds a transaction open, the flush waits for it, and
the job's reads wait for the flush.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

_KEYS = ("broker_url", "result_backend", "task_always_eager")


def forget_connections(app: Any) -> None:
    """Drop the result backend and the pooled broker connections the app made, and kombu's
    process-wide pools keyed by broker URL: a later client of the same URL got the producer
    pool an earlier one closed ("Acquire on closed pool")."""
    from kombu import pools

    app._backend_cache = None
    app._local.__dict__.pop("backend", None)
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None
    pools.reset()


@contextmanager
def client_of(redis_url: str) -> Iterator[Any]:
    """The project's Celery app sending to and reading results from ``redis_url``; as it was
    afterwards."""
    from jobs.celery_app import app

    saved = {k: app.conf[k] for k in _KEYS}
    app.conf.update(broker_url=redis_url, result_backend=redis_url, task_always_eager=False)
    forget_connections(app)
    try:
        yield app
    finally:
        app.conf.update(saved)
        forget_connections(app)


def wait_idle(app: Any, timeout: float = 300.0) -> bool:
    """Until no worker on the app's broker runs a task (True), or ``timeout`` (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active = app.control.inspect(timeout=2).active()
        if active is not None and not any(active.values()):
            return True
        time.sleep(0.5)
    return False

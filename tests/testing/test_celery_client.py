"""testing.celery_client: one test after another may be a client of the same broker."""
from __future__ import annotations

from testing.celery_client import client_of


def test_a_second_client_of_the_same_broker_sends(redis_server):
    """Each client closes what it made when it ends; the next one of the same URL makes its
    own (kombu keeps producer pools per URL for the whole process)."""
    from jobs.tasks import run_job_task

    for _ in range(2):
        with client_of(redis_server.url) as app:
            run_job_task.apply_async(args=("no_such_job",), kwargs={"trigger": "test"}, queue="nobody_listens")
            with app.connection_for_write() as conn:
                assert conn.default_channel.client.llen("nobody_listens") >= 1

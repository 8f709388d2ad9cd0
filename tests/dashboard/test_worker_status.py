"""Workers reporting where they stand: the Connections page and /metrics show each one, TCP or
Redis, with its lag per stream against the writers' positions."""
import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from dashboard import worker_status
from dashboard.models import WorkerStatus
from tests.dashboard.test_views import receipts_written, staff_client  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


def test_lag_sums_what_each_writer_wrote_beyond_the_worker():
    writers = {"events": {"w1": 10, "w2": 7}, "receipts": {"master": 3}}
    assert worker_status.lag({"events": {"w1": 4, "w2": 7}, "receipts": {"master": 3}}, writers) == \
        {"events": 6, "receipts": 0}
    assert worker_status.lag({"events": {}}, writers) == {"events": 17}  # nothing applied yet


def test_connections_page_and_metrics_show_a_redis_worker_with_its_lag(staff_client, receipts_written):  # noqa: F811
    from prometheus_client.parser import text_string_to_metric_families

    rt, w, ids = receipts_written
    worker_status.save("redis-w1", "redis", True, {("receipts", "master"): ids[0]})
    worker_status.save("tcp-w2", "tcp", True, {("receipts", "master"): ids[-1]})
    WorkerStatus.objects.create(name="gone", transport="redis", pid=1, connected=True,
                                updated_at=datetime.now(timezone.utc) - timedelta(minutes=5), positions={})

    body = staff_client.get("/connections/").content.decode()
    behind = ids[-1] - ids[0]
    assert behind > 0
    assert 'data-worker="redis-w1"' in body and f'data-stream="receipts">receipts {behind}<' in body
    assert 'data-worker="tcp-w2"' in body and 'data-stream="receipts">receipts 0<' in body
    assert "silent for" in body  # the worker that stopped reporting

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(staff_client.get("/metrics").content.decode())
               for s in f.samples}
    assert samples[("synapse_repl_worker_lag", (("stream", "receipts"), ("transport", "redis"),
                                                ("worker", "redis-w1")))] == behind
    assert samples[("synapse_repl_worker_up", (("transport", "redis"), ("worker", "redis-w1")))] == 1
    assert samples[("synapse_repl_worker_up", (("transport", "redis"), ("worker", "gone")))] == 0


def test_publish_loop_records_the_workers_positions():
    # A real worker object (not run): the loop reads exactly what the command hands it.
    from replication.worker.tcp_worker import ReplicationWorker

    worker = ReplicationWorker(host="127.0.0.1", port=1, name="w9", server_name="localhost",
                               catchup_url="http://127.0.0.1:1", streams=["events"],
                               initial_tokens={("events", "master"): 12})
    worker.connected = True

    async def run():
        task = asyncio.create_task(worker_status.publish_loop(worker, "redis", interval=0.05))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if await asyncio.to_thread(WorkerStatus.objects.filter(name="w9").exists):
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    row = WorkerStatus.objects.get(name="w9")
    assert (row.transport, row.connected, row.positions) == ("redis", True, {"events": {"master": 12}})

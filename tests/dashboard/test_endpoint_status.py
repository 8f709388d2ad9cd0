"""A replication endpoint process (``runreplication``) publishes its connections to the
database, where the web process reads them: connected workers with NAME, address, PING,
streams and syncing users; disconnects with their reason; RDATA/POSITION counts."""
from __future__ import annotations

import random
import time

import pytest

from dashboard.endpoint_status import endpoint_statuses
from streams.models import Receipt
from tests.replication.endpoint.test_endpoint import endpoint, handshake, writer_runtime  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 30  # upper bound for what the endpoint records within 0.5 s


def wait_for_status(predicate, what: str) -> dict:
    deadline = time.monotonic() + WAIT
    last = None
    while time.monotonic() < deadline:
        statuses = endpoint_statuses()
        if statuses:
            last = statuses[0]
            if predicate(last):
                return last
        time.sleep(0.1)
    pytest.fail(f"endpoint status never showed {what}; last: {last}")


def test_connections_and_disconnects_are_published(endpoint, writer_runtime):  # noqa: F811
    port, _ = endpoint
    worker = handshake(port)  # NAME test-worker, PING, REPLICATE
    worker.send("USER_SYNC inst1 @alice:test DEV1 start 1000", "USER_SYNC inst1 @bob:test DEV2 start 1000")
    worker.read_until(lambda line: line.startswith("POSITION to_device"))
    ids = writer_runtime.writer("receipts").append(
        [[(Receipt, Receipt.synthetic(random.Random(n), n))] for n in range(4)])
    worker.read_until(lambda line: line.startswith(f"RDATA receipts master {ids[-1]} "))

    status = wait_for_status(lambda s: any(c["syncing_user_count"] == 2 for c in s["connections"])
                             and s["counters"]["rdata_sent"] >= 4, "the worker and its syncing users")
    [conn] = status["connections"]
    assert conn["name"] == "test-worker"
    assert conn["peer"].startswith("127.0.0.1:")
    assert conn["last_ping_at"] is not None and conn["connected_at"] <= conn["last_ping_at"]
    assert conn["syncing_users"] == ["@alice:test", "@bob:test"]
    assert "receipts" in conn["streams"] and "events" in conn["streams"]
    assert conn["outbound_queue"] == 0
    assert status["counters"]["rdata_sent"] >= 4
    assert status["counters"]["position_sent"] >= 8  # the REPLICATE answer
    assert status["stale"] is False

    bad = handshake(port)
    bad.send("FOO bar")
    bad.read_until(lambda line: line.startswith("ERROR"))
    worker.close()
    # (The fixture's readiness probe was an anonymous connection too.)
    workers = lambda s: [d for d in s["recent_disconnects"] if d["name"] == "test-worker"]  # noqa: E731
    status = wait_for_status(lambda s: len(workers(s)) == 2 and not s["connections"], "both disconnects")
    assert sorted(d["reason"] for d in workers(status)) == ["bad line", "shut down"]
    assert status["counters"]["disconnects"]["bad line"] == 1
    assert status["counters"]["disconnects"]["shut down"] >= 1
    assert status["counters"]["connections"] == len(status["recent_disconnects"])


def test_the_endpoint_records_facts_per_minute(endpoint, writer_runtime):  # noqa: F811
    """The endpoint runs as long as the service: it keeps the facts/s history going with no page open."""
    from dashboard.models import FactsPerMinute

    writer_runtime.writer("receipts").append([[(Receipt, Receipt.synthetic(random.Random(1), 1))]])
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and not FactsPerMinute.objects.filter(stream="receipts").exists():
        time.sleep(0.1)
    assert FactsPerMinute.objects.filter(stream="receipts").exists(), "no minute recorded by the endpoint"

"""One set of process figures per process: this process's own read from /proc, and /metrics
carrying the web process's, each live endpoint's and each live worker's."""
from __future__ import annotations

import os
import time

import pytest
from django.contrib.auth import get_user_model

from dashboard.process_stats import process_stats


def _vm_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_the_figures_follow_what_the_process_does():
    before = process_stats()
    # resident memory as the kernel's status file says it (another view of the same pages)
    assert abs(before["resident_bytes"] - _vm_rss_bytes()) < 8 * 2**20
    files = [open(os.devnull) for _ in range(5)]
    try:
        assert process_stats()["open_fds"] == before["open_fds"] + 5
    finally:
        for f in files:
            f.close()
    spent = time.process_time()
    while time.process_time() - spent < 0.3:  # burn CPU
        pass
    after = process_stats()
    assert after["cpu_seconds"] - before["cpu_seconds"] >= 0.25
    assert before["start_time"] <= time.time() and after["start_time"] == before["start_time"]
    assert after["pid"] == os.getpid() and len(after["gc_collections"]) == 3


@pytest.mark.django_db(transaction=True)
def test_metrics_carry_one_set_per_process(client):
    from prometheus_client.parser import text_string_to_metric_families

    from dashboard import endpoint_status, worker_status

    endpoint_status.save("host 127.0.0.1:9092", "hs", {
        "server_name": "hs", "connections": [], "recent_disconnects": [],
        "counters": {"started_at": 0, "connections": 0, "rdata_sent": 0, "position_sent": 0, "other_sent": 0,
                     "disconnects": {}}})
    worker_status.save("worker1", "tcp", True, {("receipts", "master"): 5})
    client.force_login(get_user_model().objects.create_user("operator", password="x" * 12, is_staff=True))
    text = client.get("/metrics").content.decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    roles = {dict(labels)["role"]: value for (name, labels), value in samples.items()
             if name == "synapse_repl_process_resident_memory_bytes"}
    assert set(roles) == {"web", "endpoint", "worker"} and all(v > 0 for v in roles.values())
    cpu = {dict(labels)["role"]: value for (name, labels), value in samples.items()
           if name == "synapse_repl_process_cpu_seconds_total"}
    assert cpu["web"] >= cpu["endpoint"] > 0  # the same process, sampled earlier
    gens = {dict(labels)["generation"] for (name, labels) in samples
            if name == "synapse_repl_process_gc_collections_total"}
    assert gens == {"0", "1", "2"}

"""What the operators' dashboard costs the processes it watches, against baselines measured
in the same run.

    .venv/bin/python benchmarks/bench_dashboard.py [--facts N] [--repeat R]

Starts a throwaway PostgreSQL (``PostgresServer(fast=True)``), migrates a fresh database,
writes ``N`` facts to each database-backed stream through the real writer path and records
three endpoint snapshots with 10 connections each, then measures:

* **endpoint hot path**: ``EndpointCounters.lines_sent`` on a 1,000-line RDATA batch with a
  trailing POSITION (what every relayed batch costs per connection), against scanning the
  batch for POSITION lines once (``bytes.count``: the obvious way, ~one pass over 340 kB);
* **feed refresh**: ``dashboard.feed.collect_state`` (positions, pending IDs, endpoint
  snapshots) on a kept connection, as the feed's own thread runs it every
  ``FEED_REFRESH_SECONDS`` and on line batches (at most 5/s) while a page is open, against a
  bare ``SELECT 1`` round trip on the same connection;
* **/metrics scrape**: ``generate_latest`` of the dashboard registry, connecting and closing
  as a request does, against ``connect + SELECT 1 + close``.

Reported: median of ``R`` repetitions (each the mean of many calls), and the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._machine import cpu_description  # noqa: E402
from benchmarks._setup import migrated_database  # noqa: E402


def per_call(fn, calls: int, repeat: int) -> float:
    """Median over ``repeat`` runs of the mean seconds per call."""
    fn()  # warm up
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls)
    return statistics.median(runs)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--facts", type=int, default=20_000, help="facts per stream (default 20,000)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    print(f"machine: {cpu_description()}; load average {os.getloadavg()[0]:.2f} (1 min) at start")
    with migrated_database("bench_dashboard", fast=True, env={"LOG_LEVEL": "WARNING"}):
        run(args)


def run(args) -> None:
    import random
    from datetime import datetime, timezone

    from django.db import connection
    from prometheus_client import generate_latest

    from dashboard.feed import collect_state
    from dashboard.metrics import REGISTRY
    from dashboard.models import EndpointStatus
    from replication.endpoint.connection_records import EndpointCounters
    from streams.registry import STREAMS
    from streams.runtime import runtime

    rt = runtime()
    rng = random.Random(1)
    for name, spec in STREAMS.items():
        if spec.db_backed and spec.has_writer_list and not spec.backwards:
            model = spec.primary_model
            writer = rt.writer(name)
            for start in range(0, args.facts, 1000):
                writer.append([[(model, model.synthetic(rng, start + i))] for i in range(1000)])
    rt.close()
    conn = {"name": "worker", "peer": "127.0.0.1:1", "connected_at": 0.0, "last_ping_at": 1.0, "outbound_queue": 0,
            "streams": sorted(STREAMS), "syncing_users": [f"@u{i}:test" for i in range(50)],
            "syncing_user_count": 500, "commands_in": 10, "lines_out": 10}
    snapshot = {"server_name": "bench", "connections": [conn] * 10, "recent_disconnects": [],
                "counters": {"started_at": 0.0, "connections": 10, "rdata_sent": 1, "position_sent": 1,
                             "other_sent": 1, "disconnects": {"ping timeout": 1}}}
    for i in range(3):
        EndpointStatus.objects.create(endpoint=f"host{i} 127.0.0.1:9092", server_name="bench", pid=i,
                                      updated_at=datetime.now(timezone.utc), snapshot=snapshot)
    connection.close()

    line = b"RDATA receipts bench 123456 " + json.dumps(
        ["!room:localhost", "m.read", "@user:localhost", "$event" * 5, None, {"ts": 1, "pad": "x" * 200}]).encode()
    batch = b"\n".join([line] * 1000) + b"\nPOSITION receipts bench 123456 123460\n"
    counters, message = EndpointCounters(), {"data": batch, "count": 1001}
    ours_hot = per_call(lambda: counters.lines_sent(message), 20_000, args.repeat)
    scan = per_call(lambda: batch.count(b"\nPOSITION "), 200, args.repeat)

    def select_one() -> None:
        with connection.cursor() as c:
            c.execute("SELECT 1")
            c.fetchone()

    def connect_select_one() -> None:
        select_one()
        connection.close()

    def scrape() -> None:  # a request: Django closes the connection after it (CONN_MAX_AGE=0)
        generate_latest(REGISTRY)
        connection.close()

    baseline = per_call(select_one, 200, args.repeat)
    connect_baseline = per_call(connect_select_one, 50, args.repeat)
    refresh = per_call(collect_state, 200, args.repeat)  # the feed keeps its thread's connection
    metrics = per_call(scrape, 50, args.repeat)

    print(f"facts per stream: {args.facts:,}; endpoint snapshots: 3 x 10 connections; repeat {args.repeat}")
    print("| what | ours | baseline | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| endpoint: count a 1,001-line batch (per connection) | {fmt(ours_hot)} | {fmt(scan)} (scan for POSITION) "
          f"| {ours_hot / scan:.4f} |")
    print(f"| feed refresh (`collect_state`, connection kept) | {fmt(refresh)} | {fmt(baseline)} (SELECT 1) "
          f"| {refresh / baseline:.1f} |")
    print(f"| /metrics scrape (connects) | {fmt(metrics)} | {fmt(connect_baseline)} (connect + SELECT 1) "
          f"| {metrics / connect_baseline:.1f} |")
    print(f"feed at 1 refresh/s + 5 pushes/s: {6 * refresh * 100:.2f}% of a core at most")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at end")


if __name__ == "__main__":
    main()

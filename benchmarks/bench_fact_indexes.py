"""What the indexes of ``receipts_linearized`` cost PostgreSQL per inserted row.

    .venv/bin/python benchmarks/bench_fact_indexes.py [--rows N] [--repeat R]

Starts a throwaway PostgreSQL (``PostgresServer(fast=False)``: fsync on) and makes two copies
of the table in one database: **before** with the 6 indexes of migration 0001 (pk,
``stream_id``, ``room_id`` and its ``varchar_pattern_ops`` "like" copy, ``instance_name`` and
its "like" copy) and **after** with the 4 of migration 0004 (pk, ``stream_id``,
``(instance_name, stream_id)``, ``room_id``). Then inserts the same synthetic receipts into
each, 100 per transaction, with the writer's statement (``INSERT ... SELECT * FROM
unnest(...)``, binary parameters), alternating the two tables run by run, and prints the
PostgreSQL backend's CPU per row (from ``/proc/<backend pid>/stat``: immune to other load on
the machine, unlike wall time, which is printed too) and the ratio after / before.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

COLUMNS = "id bigserial PRIMARY KEY, stream_id bigint NOT NULL, instance_name varchar(255) NOT NULL, " \
          "room_id varchar(255) NOT NULL, receipt_type varchar(255) NOT NULL, user_id varchar(255) NOT NULL, " \
          "event_id varchar(255) NOT NULL, thread_id varchar(255), data jsonb NOT NULL"
INDEXES = {
    "before": ["(stream_id)", "(room_id)", "(room_id varchar_pattern_ops)", "(instance_name)",
               "(instance_name varchar_pattern_ops)"],
    "after": ["(stream_id)", "(instance_name, stream_id)", "(room_id)"],
}
INSERT = ("INSERT INTO {t} (stream_id, instance_name, room_id, receipt_type, user_id, event_id, thread_id, data) "
          "SELECT * FROM unnest(%b::bigint[], %b::varchar[], %b::varchar[], %b::varchar[], %b::varchar[], "
          "%b::varchar[], %b::varchar[], %b::jsonb[])")
PER_TXN = 100


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows per run (default 100000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per table, alternating (default 3)")
    args = parser.parse_args(argv)

    import psycopg
    from _machine import load_average

    from testing.services import PostgresServer

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
    import django

    django.setup()
    from streams.models import Receipt

    rng = random.Random(1)
    rows = [Receipt.synthetic(rng, n) for n in range(args.rows)]
    columns = [[r["room_id"] for r in rows], [r["receipt_type"] for r in rows], [r["user_id"] for r in rows],
               [r["event_id"] for r in rows], [r["thread_id"] for r in rows],
               [json.dumps(r["data"]) for r in rows]]
    pg = PostgresServer(fast=False).start()
    try:
        url = pg.create_database("bench_fact_indexes")
        with psycopg.connect(url, autocommit=True) as conn:
            for name, indexes in INDEXES.items():
                conn.execute(f"CREATE TABLE receipts_{name} ({COLUMNS})")
                for i, cols in enumerate(indexes):
                    conn.execute(f"CREATE INDEX receipts_{name}_{i} ON receipts_{name} {cols}")
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            print(f"PostgreSQL {conn.info.server_version}, fsync on; {args.rows:,} rows per run, {PER_TXN} per "
                  f"transaction; load average {load_average()}")
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in INDEXES}
            stream_id = 0
            for rep in range(args.repeat):
                for name in (INDEXES if rep % 2 == 0 else reversed(list(INDEXES))):
                    conn.execute(f"TRUNCATE receipts_{name}")
                    conn.execute("CHECKPOINT")
                    sql = INSERT.format(t=f"receipts_{name}")
                    cpu0, t0 = backend_cpu(pid), time.monotonic()
                    for start in range(0, args.rows, PER_TXN):
                        end = min(start + PER_TXN, args.rows)
                        ids = list(range(stream_id + start + 1, stream_id + end + 1))
                        with conn.transaction(), conn.cursor() as cur:
                            cur.execute(sql, [ids, [f"w{rep % 4 + 1}"] * len(ids),
                                              *(col[start:end] for col in columns)])
                    results[name].append((backend_cpu(pid) - cpu0, time.monotonic() - t0))
                    stream_id += args.rows
        for name, runs in results.items():
            cpu = min(c for c, _ in runs)
            wall = min(w for _, w in runs)
            print(f"  {name:<6} {len(INDEXES[name]) + 1} indexes: PostgreSQL CPU {1e6 * cpu / args.rows:5.1f} us/row "
                  f"(best of {len(runs)}: {', '.join(f'{1e6 * c / args.rows:.1f}' for c, _ in runs)}); "
                  f"{args.rows / wall:,.0f} rows/s wall")
        before = min(c for c, _ in results["before"])
        after = min(c for c, _ in results["after"])
        print(f"after / before (PostgreSQL CPU per row): {after / before:.2f}; load average {load_average()}")
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

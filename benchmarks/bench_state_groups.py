"""State groups of big rooms: rows stored per group, megabytes and the cold state read, with
Synapse's snapshot policy (the baseline) and with base deltas, in the same run.

    .venv/bin/python benchmarks/bench_state_groups.py [--sizes 20000,80000,140000] [--groups N]
                                                      [--samples N] [--quick]

Starts a throwaway PostgreSQL (fsync off: the writes are not what is measured), migrates a
fresh database, then per policy and per size N (the keys of a big room of ``generate_rooms``:
~22k at 1 M events, ~77k at 4 M, ~140k at 10 M) writes one room's state groups through the
persist path's own ``StateGroupStore.new_group`` and ``write_state_groups``: a snapshot of N
member keys, then ``--groups`` one-row groups, each on the one before (as the persist path's
fast path makes them), half a new member and half a member's change (left members stay in
state), and an ``event_to_state_groups`` row per group. Prints per room:

* **rows per group** stored in ``state_groups_state``, and the ratio to the same groups
  stored as full snapshots (issue 19's goal: <= 0.05);
* **MB**: what the room added to the three state-group tables and their indexes on disk;
* **state at event, cold**: p50/p99 of ``reads.state_at_event`` for random groups of the
  second half of the room's groups (past the first chains), the process's caches dropped
  before each call (so a chain walk and the rows of the chain, from PostgreSQL's buffers),
  with the CPU per call here and in the database backend, and the p50 of the chain walk
  (the recursive CTE) alone.

The baseline (``StateGroupStore(base_deltas=False)``: a snapshot every 100 groups) runs first,
then the tables are emptied and the same groups are written with base deltas. Exit status 0.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._machine import cpu_description, load_average  # noqa: E402

TABLES = ("state_groups_state", "state_groups", "state_group_edges")
BATCH = 500


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def backend_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tables_bytes(cur) -> int:
    cur.execute("SELECT " + " + ".join(f"pg_total_relation_size('{t}')" for t in TABLES))
    return int(cur.fetchone()[0])


def build_room(store, room: str, size: int, groups: int, seed: int) -> tuple[list[int], int]:
    """The room's groups (ids, in order) and the rows they would take as full snapshots."""
    from django.db import transaction

    from streams.storage.plan_writer import write_state_groups
    from streams.storage.sql import insert_rows, store_cursor

    rng = random.Random(seed)
    current = {("m.room.member", f"@u{i}:hs"): f"$join{i}" for i in range(size)}
    users = size
    ids: list[int] = []
    full_rows = 0
    parent: int | None = None
    chain: int | None = None
    made = 0
    while made <= groups:
        with transaction.atomic(), store_cursor() as cur:
            batch = []
            for _ in range(min(BATCH, groups + 1 - made)):
                if parent is None:
                    delta: dict = {}
                elif rng.random() < 0.5:
                    delta = {("m.room.member", f"@u{users}:hs"): f"$e{made}"}
                    users += 1
                else:
                    delta = {("m.room.member", f"@u{rng.randrange(users)}:hs"): f"$e{made}"}
                current.update(delta)
                g = store.new_group(cur, room_id=room, event_id=f"${room}/{made}", parent=parent,
                                    parent_chain_length=chain, delta=delta, full_state=lambda: current,
                                    hint=BATCH)
                batch.append(g)
                ids.append(g.id)
                full_rows += len(current)
                parent, chain = g.id, g.chain_length
                made += 1
            write_state_groups(cur, batch)
            insert_rows(cur, "event_to_state_groups", ["event_id", "state_group"], ["text", "bigint"],
                        [(g.event_id, g.id) for g in batch])
            store.written(batch)
    return ids, full_rows


def measure(policy: str, sizes: list[int], groups: int, samples: int) -> dict[int, dict]:
    from django.db import connection

    from streams.storage import reads
    from streams.storage.caches import storage_caches
    from streams.storage.sql import fetch_all, store_cursor
    from streams.storage.state_groups import _CHAIN, StateGroupStore

    out = {}
    for size in sizes:
        room = f"!{policy}{size}:hs"
        store = StateGroupStore(base_deltas=policy == "new")
        with connection.cursor() as c:
            before = tables_bytes(c)
        t = time.perf_counter()
        ids, full_rows = build_room(store, room, size, groups, seed=size)
        built = time.perf_counter() - t
        with connection.cursor() as c:
            c.execute("ANALYZE state_groups_state")
            c.execute("ANALYZE state_group_edges")
            c.execute("SELECT count(*) FROM state_groups_state WHERE room_id = %s", [room])
            rows = c.fetchone()[0]
            c.execute("SELECT count(*) FROM state_groups WHERE room_id = %s AND chain_length = 1", [room])
            snapshots = c.fetchone()[0]
            added = tables_bytes(c) - before
            c.execute("SELECT pg_backend_pid()")
            pid = c.fetchone()[0]
        rng = random.Random(size)
        half = ids[len(ids) // 2:]
        sample = [f"${room}/{ids.index(g)}" for g in (rng.choice(half) for _ in range(samples))]
        caches = storage_caches()
        ms = []
        state_len = 0
        cpu0, backend0 = time.process_time(), backend_cpu_seconds(pid)
        for event_id in sample:
            caches.forget()
            t = time.perf_counter()
            state_len = len(reads.state_at_event(event_id))
            ms.append((time.perf_counter() - t) * 1000)
        cpu = (time.process_time() - cpu0) * 1000 / len(sample)
        backend = (backend_cpu_seconds(pid) - backend0) * 1000 / len(sample)
        walks = []
        with store_cursor() as cur:
            for g in (rng.choice(half) for _ in range(samples)):
                t = time.perf_counter()
                fetch_all(cur, _CHAIN, [g])
                walks.append((time.perf_counter() - t) * 1000)
        out[size] = r = {"groups": len(ids), "rows": rows, "snapshots": snapshots, "full_rows": full_rows,
                         "mb": added / 1e6, "p50": pct(ms, 50), "p99": pct(ms, 99), "cpu": cpu,
                         "backend": backend, "keys": state_len, "built": built, "walk": pct(walks, 50)}
        print(f"  {policy:3} N={size:>7,}: {r['rows'] / r['groups']:8.1f} rows/group "
              f"({r['rows'] / r['full_rows']:.4f} of full snapshots; {snapshots} snapshots in {len(ids):,} groups), "
              f"{r['mb']:7.1f} MB; state at event cold p50 {r['p50']:6.1f} ms p99 {r['p99']:6.1f} ms "
              f"({state_len:,} keys; CPU per read {cpu:.1f} ms here + {backend:.1f} ms database; "
              f"the chain walk alone p50 {r['walk']:.2f} ms); "
              f"built in {built:.0f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=None, help="state keys per room (default 20000,80000,140000; "
                                                      "--quick 20000,80000)")
    parser.add_argument("--groups", type=int, default=None, help="groups per room after its first snapshot "
                                                                 "(default 2,000; --quick 600)")
    parser.add_argument("--samples", type=int, default=None, help="cold reads per room (default 100, --quick 30)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in (args.sizes or ("20000,80000" if args.quick else "20000,80000,140000")).split(",")]
    groups = args.groups or (600 if args.quick else 2_000)
    samples = args.samples or (30 if args.quick else 100)

    from benchmarks._setup import migrated_database

    print(f"machine: {cpu_description()}; load average {load_average()}")
    with migrated_database("bench_state_groups", fast=True):
        from django.db import connection

        print(f"{groups:,} groups per room; {samples} cold reads per room")
        results = {}
        for policy in ("old", "new"):
            print(f"{policy}: " + ("a snapshot every 100 groups (Synapse's policy)" if policy == "old"
                                   else "base deltas on the snapshot while <= 5% of the state"), flush=True)
            results[policy] = measure(policy, sizes, groups, samples)
            with connection.cursor() as c:
                c.execute("TRUNCATE state_groups_state, state_groups, state_group_edges, event_to_state_groups")
        print("new / old:")
        for size in sizes:
            old, new = results["old"][size], results["new"][size]
            print(f"  N={size:>7,}: rows {new['rows'] / old['rows']:.3f}, MB {new['mb'] / old['mb']:.3f}, "
                  f"cold read p50 {new['p50'] / old['p50']:.2f} p99 {new['p99'] / old['p99']:.2f}")
        print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

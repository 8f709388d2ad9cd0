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
  stored as full snapshots (the goal: <= 0.05);
* **MB**: what the room added to the state-group tables (with the big groups' packed copies)
  and their indexes on disk;
* **state at event, cold**: p50/p99 of ``reads.state_at_event`` for random groups of the
  second half of the room's groups (past the first chains), the process's caches dropped
  before each call (so a chain walk and the rows of the chain, from PostgreSQL's buffers),
  with the CPU per call here and in the database backend, and the p50 of the chain walk
  (the recursive CTE) alone; on the old policy's room also with the read as it was before
  (``state_at_event_by_rows``: a tuple per row, unpacked in a loop), the read's baseline.

The baseline (``StateGroupStore(base_deltas=False)``: a snapshot every 100 groups) and base
deltas each write their own room of every size, with the same changes, in one database; the
cold reads then alternate the two rooms call by call (the same heap, the same load: read one
after the other, the second policy's reads cost up to twice the CPU of the first's in a
process grown by the first's). Exit status 0.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._machine import cpu_description, load_average  # noqa: E402

TABLES = ("state_groups_state", "state_groups", "state_group_edges", "state_groups_packed")
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

    from rooms.storage.plan_needs import NeedsData
    from rooms.storage.plan_writer import write_state_groups
    from rooms.storage.sql import insert_rows, store_cursor

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
            planning = store.batch()  # the groups of one transaction, applied once written
            reserved = store.reserve(cur, BATCH)
            for _ in range(min(BATCH, groups + 1 - made)):
                if parent is None:
                    delta: dict = {}
                elif rng.random() < 0.5:
                    delta = {("m.room.member", f"@u{users}:hs"): f"$e{made}"}
                    users += 1
                else:
                    delta = {("m.room.member", f"@u{rng.randrange(users)}:hs"): f"$e{made}"}
                current.update(delta)
                while True:
                    try:
                        g = planning.new_group(reserved[len(batch)], room_id=room, event_id=f"${room}/{made}",
                                               parent=parent, parent_chain_length=chain, delta=delta,
                                               full_state=lambda: current)
                        break
                    except NeedsData as needs:  # a stored chain the view has not read: read it, ask again
                        planning.load(cur, needs)
                batch.append(g)
                ids.append(g.id)
                full_rows += len(current)
                parent, chain = g.id, g.chain_length
                made += 1
            write_state_groups(cur, batch)
            insert_rows(cur, "event_to_state_groups", ["event_id", "state_group"], ["text", "bigint"],
                        [(g.event_id, g.id) for g in batch])
        store.apply(planning.delta(reserved[len(batch):]))
    return ids, full_rows


POLICIES = ("old", "new")


def state_at_event_by_rows(event_id: str) -> dict:
    """``reads.state_at_event`` reading a group by rows (the baseline of the
    read): the chain, then its rows, a tuple each, applied in a loop."""
    from rooms.storage.sql import fetch_all, store_cursor
    from rooms.storage.state_groups import _CHAIN

    with store_cursor() as cur:
        cur.execute("SELECT state_group FROM event_to_state_groups WHERE event_id = %s", [event_id])
        chain = [g for (g,) in fetch_all(cur, _CHAIN, [cur.fetchone()[0]])]
        rows: dict[int, list] = {g: [] for g in chain}
        for g, t, k, e in fetch_all(cur, "SELECT state_group, type, state_key, event_id FROM state_groups_state "
                                         "WHERE state_group = ANY(%s)", [chain]):
            rows[g].append((t, k, e))
    state = {}
    for g in reversed(chain):
        for t, k, e in rows[g]:
            state[(t, k)] = e
    return state


def build_all(sizes: list[int], groups: int) -> dict[tuple[str, int], dict]:
    """Every room, of both policies: what each stored."""
    from django.db import connection

    from rooms.storage.state_groups import StateGroupStore

    out = {}
    for size in sizes:
        for policy in POLICIES:
            room = f"!{policy}{size}:hs"
            store = StateGroupStore(base_deltas=policy == "new")
            with connection.cursor() as c:
                before = tables_bytes(c)
            t = time.perf_counter()
            ids, full_rows = build_room(store, room, size, groups, seed=size)
            built = time.perf_counter() - t
            with connection.cursor() as c:
                c.execute("SELECT count(*) FROM state_groups_state WHERE room_id = %s", [room])
                rows = c.fetchone()[0]
                c.execute("SELECT count(*) FROM state_groups WHERE room_id = %s AND chain_length = 1", [room])
                snapshots = c.fetchone()[0]
                added = tables_bytes(c) - before
            out[(policy, size)] = r = {"room": room, "ids": ids, "groups": len(ids), "rows": rows,
                                       "snapshots": snapshots, "full_rows": full_rows, "mb": added / 1e6}
            print(f"  {policy} N={size:>7,}: {rows / len(ids):8.1f} rows/group ({rows / full_rows:.4f} of full "
                  f"snapshots; {snapshots} snapshots in {len(ids):,} groups), {r['mb']:7.1f} MB; built in "
                  f"{built:.0f} s", flush=True)
    return out


def read_all(rooms: dict[tuple[str, int], dict], sizes: list[int], samples: int) -> None:
    """Cold reads of random groups of each room's second half, the two policies' rooms
    alternated call by call (so both run in the same heap and under the same load)."""
    from django.db import connection

    from rooms.storage import reads
    from rooms.storage.caches import storage_caches
    from rooms.storage.sql import fetch_all, store_cursor
    from rooms.storage.state_groups import _CHAIN

    with connection.cursor() as c:
        c.execute("ANALYZE state_groups_state")
        c.execute("ANALYZE state_group_edges")
        c.execute("SELECT pg_backend_pid()")
        pid = c.fetchone()[0]
    caches = storage_caches()
    gc.collect()
    for size in sizes:
        rng = random.Random(size)
        picks = {}
        for policy in POLICIES:
            r = rooms[(policy, size)]
            half = range(len(r["ids"]) // 2, len(r["ids"]))
            picks[policy] = [rng.choice(half) for _ in range(samples)]
        #: (policy, reader): "rows" is the read by rows, on the old policy's room
        variants = [("old", "rows"), ("old", "strings"), ("new", "strings")]
        ms: dict[tuple, list[float]] = {v: [] for v in variants}
        cpu = dict.fromkeys(variants, 0.0)
        backend = dict.fromkeys(variants, 0.0)
        keys = {}
        for i in range(samples):
            for v in (variants if i % 2 else variants[::-1]):
                policy, reader = v
                event_id = f"${rooms[(policy, size)]['room']}/{picks[policy][i]}"
                read = reads.state_at_event if reader == "strings" else state_at_event_by_rows
                caches.forget()
                c0, b0, t = time.process_time(), backend_cpu_seconds(pid), time.perf_counter()
                keys[v] = len(read(event_id))
                ms[v].append((time.perf_counter() - t) * 1000)
                cpu[v] += time.process_time() - c0
                backend[v] += backend_cpu_seconds(pid) - b0
        rows_v = ("old", "rows")
        print(f"  old N={size:>7,}, read by rows (the baseline): state at event cold p50 "
              f"{pct(ms[rows_v], 50):6.1f} ms p99 {pct(ms[rows_v], 99):6.1f} ms ({keys[rows_v]:,} keys); CPU per "
              f"read {cpu[rows_v] * 1000 / samples:.1f} ms here + {backend[rows_v] * 1000 / samples:.1f} ms database")
        rooms[("rows", size)] = {"p50": pct(ms[rows_v], 50), "p99": pct(ms[rows_v], 99),
                                 "cpu": cpu[rows_v] * 1000 / samples, "backend": backend[rows_v] * 1000 / samples}
        for policy in POLICIES:
            r = rooms[(policy, size)]
            walks = []
            with store_cursor() as cur:
                for n in picks[policy]:
                    t = time.perf_counter()
                    fetch_all(cur, _CHAIN, [r["ids"][n]])
                    walks.append((time.perf_counter() - t) * 1000)
            v = (policy, "strings")
            r.update(p50=pct(ms[v], 50), p99=pct(ms[v], 99), cpu=cpu[v] * 1000 / samples,
                     backend=backend[v] * 1000 / samples, walk=pct(walks, 50))
            print(f"  {policy} N={size:>7,}, read by strings: state at event cold p50 {r['p50']:6.1f} ms p99 "
                  f"{r['p99']:6.1f} ms ({keys[v]:,} keys); CPU per read {r['cpu']:.1f} ms here + {r['backend']:.1f} ms "
                  f"database; the chain walk alone p50 {r['walk']:.2f} ms", flush=True)


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
        print(f"{groups:,} groups per room; {samples} cold reads per room; old: a snapshot every 100 groups "
              f"(Synapse's policy), new: base deltas on the snapshot while <= 5% of the state")
        rooms = build_all(sizes, groups)
        read_all(rooms, sizes, samples)
        print("new policy and read / before (old policy, read by rows):")
        for size in sizes:
            old, new, before = rooms[("old", size)], rooms[("new", size)], rooms[("rows", size)]
            print(f"  N={size:>7,}: rows {new['rows'] / old['rows']:.3f}, MB {new['mb'] / old['mb']:.3f}, "
                  f"cold read p50 {new['p50'] / before['p50']:.2f} p99 {new['p99'] / before['p99']:.2f}, "
                  f"CPU per read {(new['cpu'] + new['backend']) / (before['cpu'] + before['backend']):.2f}")
        print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

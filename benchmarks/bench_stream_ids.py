"""Stream-ID writer throughput on PostgreSQL, against a raw psycopg baseline.

    .venv/bin/python benchmarks/bench_stream_ids.py [--facts N] [--quick]

Starts a throwaway PostgreSQL (``PostgresServer(fast=False)``: fsync and full-page writes
on, as a real server), migrates a fresh database, then measures, on that one server:

* **writer**: facts/s through ``StreamWriter.append`` on the ``receipts`` stream (reserve
  IDs with one ``nextval`` round trip, insert with ``executemany`` in one transaction,
  commit, complete the IDs), with 1 writer process (``STREAM_WRITERS=receipts=w1``) and with
  4 writer processes (``receipts=w1,w2,w3,w4``), at 1 and at 100 facts per transaction;
* **baseline**: rows/s inserting the same rows (same table, same values, same batching) with
  plain psycopg 3: no Django, no ID reservation, the stream ID from a local counter; each
  transaction is one pipeline (``BEGIN``, ``executemany(INSERT)``, ``COMMIT``).

Every process is a separate OS process (multiprocessing, ``spawn``) that sets up its own
connection(s). The synthetic rows (``Receipt.synthetic``) are generated once in the parent
before anything is timed, and the writer and baseline runs of a case get the very same
values. Each process warms up (connections, prepared plans, the ID generator's start-up)
before a barrier; the clock runs from the barrier until the last process finishes.
``receipts_linearized`` is truncated and a CHECKPOINT taken before every timed run, so all
runs start from the same table state.

Exit status 0 whether or not the goal (ratio >= 0.8 at 100 facts per transaction) is met.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STREAM = "receipts"
TABLE = "receipts_linearized"
# Column order of StreamWriter's insert plan for Receipt: stream ID, writer, then the fields.
COLUMNS = ("stream_id", "instance_name", "room_id", "receipt_type", "user_id", "event_id", "thread_id", "data")
BASELINE_SQL = 'INSERT INTO "{}" ({}) VALUES ({})'.format(
    TABLE, ", ".join(f'"{c}"' for c in COLUMNS), ", ".join(["%s"] * len(COLUMNS))
)
GOAL_RATIO = 0.8
GOAL_BATCH = 100


@dataclass
class RunResult:
    facts: int
    seconds: float
    cpu_seconds: float  # client CPU, summed over the processes

    @property
    def rate(self) -> float:
        return self.facts / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_fact(self) -> float:
        return 1e6 * self.cpu_seconds / self.facts if self.facts else 0.0


# -- worker processes (spawned: they import this module afresh) ------------------------------

def _writer_worker(url, instance, writers_env, per_txn, warmup, values, barrier, queue):
    os.environ.update(
        DATABASE_URL=url, INSTANCE_NAME=instance, STREAM_WRITERS=writers_env,
        DJANGO_SETTINGS_MODULE="synapse_repl.settings",
    )
    try:
        import django

        django.setup()
        from streams.models import Receipt
        from streams.runtime import runtime

        rt = runtime()
        writer = rt.writer(STREAM)
        facts = [[(Receipt, v)] for v in values]
        batches = [facts[i:i + per_txn] for i in range(0, len(facts), per_txn)]
        warm, timed = batches[:warmup], batches[warmup:]
        for batch in warm:
            writer.append(batch)
        n = sum(len(b) for b in timed)
        barrier.wait()
        t0, c0 = time.monotonic(), time.process_time()
        for batch in timed:
            writer.append(batch)
        t1, c1 = time.monotonic(), time.process_time()
        rt.close()
        queue.put(("ok", n, t0, t1, c1 - c0))
    except BaseException as e:  # report, and release the others
        barrier.abort()
        queue.put(("error", f"{instance}: {type(e).__name__}: {e}"))


def _baseline_worker(url, instance, writers_env, per_txn, warmup, values, barrier, queue):
    try:
        import psycopg
        from psycopg.types.json import Jsonb

        conn = psycopg.connect(url, autocommit=False, application_name=f"bench baseline {instance}")
        cur = conn.cursor()
        counter = 0

        def run(batch):
            nonlocal counter
            params = []
            for v in batch:
                counter += 1
                params.append((counter, instance, v["room_id"], v["receipt_type"], v["user_id"],
                               v["event_id"], v["thread_id"], Jsonb(v["data"])))
            with conn.pipeline(), conn.transaction():
                cur.executemany(BASELINE_SQL, params)

        batches = [values[i:i + per_txn] for i in range(0, len(values), per_txn)]
        warm, timed = batches[:warmup], batches[warmup:]
        for batch in warm:
            run(batch)
        n = sum(len(b) for b in timed)
        barrier.wait()
        t0, c0 = time.monotonic(), time.process_time()
        for batch in timed:
            run(batch)
        t1, c1 = time.monotonic(), time.process_time()
        conn.close()
        queue.put(("ok", n, t0, t1, c1 - c0))
    except BaseException as e:
        barrier.abort()
        queue.put(("error", f"{instance}: {type(e).__name__}: {e}"))


# -- parent ----------------------------------------------------------------------------------

def _prepare_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        conn.execute("CHECKPOINT")


def run_case(kind: str, url: str, procs: int, per_txn: int, facts_per_proc: int,
             warmup_txns: int, data: list[list[dict]]) -> RunResult:
    _prepare_table(url)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    queue = ctx.Queue()
    writers_env = f"{STREAM}=" + ",".join(f"w{i + 1}" for i in range(procs))
    target = _writer_worker if kind == "writer" else _baseline_worker
    need = (warmup_txns * per_txn) + facts_per_proc
    workers = []
    for i in range(procs):
        values = data[i][:need]
        p = ctx.Process(target=target, args=(url, f"w{i + 1}", writers_env, per_txn, warmup_txns,
                                             values, barrier, queue), daemon=True)
        p.start()
        workers.append(p)
    results = []
    for _ in workers:
        msg = queue.get(timeout=600)
        if msg[0] != "ok":
            for p in workers:
                p.kill()
            raise RuntimeError(f"{kind} worker failed: {msg[1]}")
        results.append(msg[1:])
    for p in workers:
        p.join(timeout=60)
    n = sum(r[0] for r in results)
    start, end = min(r[1] for r in results), max(r[2] for r in results)
    return RunResult(n, end - start, sum(r[3] for r in results))


def machine_info(url: str) -> list[str]:
    import django
    import psycopg
    from _machine import cpu_description  # benchmarks/ is on sys.path when run as a script

    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SELECT version()").fetchone()[0]
        settings = {name: conn.execute(f"SHOW {name}").fetchone()[0]
                    for name in ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
                                 "shared_buffers")}
    return [
        f"machine: {cpu_description()}; {platform.platform()}",
        f"python {platform.python_version()}, django {django.__version__}, psycopg {psycopg.__version__} "
        f"({psycopg.pq.__impl__}, libpq {psycopg.pq.version()})",
        f"server: {version}",
        "server settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=None,
                        help="facts per process in each timed run at 100 facts/txn "
                             "(default 25000, --quick 3000); runs at 1 fact/txn write a tenth of it")
    parser.add_argument("--quick", action="store_true", help="small counts: a ~20 s run")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed runs per case and path, alternating writer and baseline; "
                             "the best of each is reported (default 2, --quick 1)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    facts_100 = args.facts or (3000 if args.quick else 25000)
    facts_1 = max(facts_100 // 10, 50)
    repeat = args.repeat or (1 if args.quick else 2)
    warmup = {1: 50, 100: 5}

    from benchmarks._setup import migrated_database

    t_begin = time.monotonic()
    with migrated_database("bench_stream_ids") as db:
        url = db.url
        from streams.models import Receipt

        for line in machine_info(url):
            print(line)

        # The same synthetic rows for both paths: one list per process index.
        max_need = max(warmup[b] * b + (facts_100 if b == 100 else facts_1) for b in (1, 100))
        data = []
        for i in range(4):
            rng = random.Random(args.seed * 1000 + i)
            data.append([Receipt.synthetic(rng, n) for n in range(max_need)])
        print(f"rows: Receipt.synthetic, ~{_row_bytes(data[0][0])} bytes each; per process per timed run: "
              f"{facts_1} facts at 1/txn, {facts_100} facts at 100/txn; warm-up {warmup[1]} / {warmup[100]} "
              f"transactions; best of {repeat} run(s)")
        print("baseline: plain psycopg 3, one pipeline per transaction (BEGIN, executemany INSERT, COMMIT), "
              "stream ID from a local counter")
        print(flush=True)

        cases = [(procs, batch) for batch in (1, 100) for procs in (1, 4)]
        rows = []
        for procs, batch in cases:
            n = facts_100 if batch == 100 else facts_1
            best = {"writer": None, "baseline": None}
            for r in range(repeat):
                order = ("writer", "baseline") if r % 2 == 0 else ("baseline", "writer")
                for kind in order:
                    res = run_case(kind, url, procs, batch, n, warmup[batch], data)
                    if best[kind] is None or res.rate > best[kind].rate:
                        best[kind] = res
                    print(f"  {procs} proc x {batch:>3}/txn  {kind:<8} {res.rate:>9.0f}/s "
                          f"({res.facts} in {res.seconds:.2f} s, client CPU {res.cpu_us_per_fact:.0f} us/fact)",
                          flush=True)
            rows.append((procs, batch, best["writer"], best["baseline"]))

        print()
        header = (f"{'case':<28}{'writer facts/s':>16}{'baseline rows/s':>17}{'ratio':>8}"
                  f"{'writer client us/fact':>23}{'baseline client us/fact':>25}")
        print(header)
        print("-" * len(header))
        goal_ok = True
        for procs, batch, w, b in rows:
            ratio = w.rate / b.rate if b.rate else 0.0
            name = f"{procs} writer{'s' if procs > 1 else ''}, {batch} fact{'s' if batch > 1 else ''}/txn"
            print(f"{name:<28}{w.rate:>16.0f}{b.rate:>17.0f}{ratio:>8.2f}"
                  f"{w.cpu_us_per_fact:>23.0f}{b.cpu_us_per_fact:>25.0f}")
            if batch == GOAL_BATCH and ratio < GOAL_RATIO:
                goal_ok = False
        print("(client us/fact: CPU time of the writing processes themselves, summed, per fact; "
              "server CPU not included)")
        print()
        print(f"goal: ratio >= {GOAL_RATIO} at {GOAL_BATCH} facts/txn: {'met' if goal_ok else 'NOT met'}")
        print(f"total time {time.monotonic() - t_begin:.0f} s")
    return 0


def _row_bytes(values: dict) -> int:
    import json

    return sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in values.values() if v is not None)


if __name__ == "__main__":
    sys.exit(main())

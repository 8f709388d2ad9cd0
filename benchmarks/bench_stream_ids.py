"""Stream-ID writer throughput on PostgreSQL, against a raw psycopg baseline.

    .venv/bin/python benchmarks/bench_stream_ids.py [--facts N] [--quick]

Starts a throwaway PostgreSQL (``PostgresServer(fast=False)``: fsync and full-page writes
on, as a real server), migrates a fresh database, then measures, on that one server:

* **writer**: facts/s through ``StreamWriter.append`` on the ``receipts`` stream (reserve
  IDs with a visible reservation, insert, commit, complete the IDs and record the position),
  with 1 writer process (``STREAM_WRITERS=receipts=w1``) and with 4 writer processes
  (``receipts=w1,w2,w3,w4``), at 1 and at 100 facts per transaction;
* **raw baselines**: rows/s inserting the same rows (same table, same values, same batching)
  with plain psycopg 3, no Django, no reservation. The yardstick is the fastest raw method
  drawing IDs from the writer's own sequence: at 1 fact per transaction one pipeline
  (``BEGIN; INSERT ... VALUES (nextval(seq), ...); COMMIT``), at 100 COPY (text and binary
  both measured, the faster counts) after one ``nextval`` round trip for the batch. The
  first yardstick, ``executemany`` in one pipeline with IDs from a local counter, is
  printed beside it.

Every process is a separate OS process (multiprocessing, ``spawn``) that sets up its own
connection(s). The synthetic rows (``Receipt.synthetic``) are generated once in the parent
before anything is timed, and the writer and baseline runs of a case get the very same
values. Each process warms up (connections, prepared plans, the ID generator's start-up)
before a barrier; the clock runs from the barrier until the last process finishes.
``receipts_linearized`` is truncated and a CHECKPOINT taken before every timed run, so all
runs start from the same table state.

Besides facts/s, each run reports CPU per fact: the writing processes' (client) and the
server's (the postmaster's process tree: backends, WAL writer, checkpointer, alive or exited,
from /proc; ``testing/accounting.py``), over the timed run.

Exit status 0 whether or not the goals (ratio to the fastest raw method >= 0.8 at 100 facts
per transaction, >= 0.7 at 1) are met.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import random
import sys
import threading
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
SEQUENCE = "receipts_sequence"  # the writer's: registry.py
_COLS = ", ".join(f'"{c}"' for c in COLUMNS)
NEXTVAL_INSERT_SQL = 'INSERT INTO "{}" ({}) VALUES (nextval(\'{}\'), {})'.format(
    TABLE, _COLS, SEQUENCE, ", ".join(["%s"] * (len(COLUMNS) - 1))
)
NEXTVAL_SERIES_SQL = f"SELECT nextval('{SEQUENCE}') FROM generate_series(1, %s)"
COPY_TEXT_SQL = f'COPY "{TABLE}" ({_COLS}) FROM STDIN'
COPY_BINARY_SQL = COPY_TEXT_SQL + " (FORMAT BINARY)"
COPY_TYPES = ["int8", "text", "text", "text", "text", "text", "text", "jsonb"]
#: raw psycopg methods; the yardstick of a case is the fastest raw method drawing IDs from the
#: writer's sequence (executemany, with a local counter, is the first yardstick, kept for the
#: record)
BASELINES = {1: ("insert-nextval", "executemany"), 100: ("copy-text", "copy-binary", "executemany")}
GOAL_RATIO = {100: 0.8, 1: 0.7}


@dataclass
class RunResult:
    facts: int
    seconds: float
    cpu_seconds: float  # client CPU, summed over the processes
    server_cpu_seconds: float  # PostgreSQL's: every process of the server, over the timed run

    @property
    def server_us_per_fact(self) -> float:
        return 1e6 * self.server_cpu_seconds / self.facts if self.facts else 0.0

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


def _baseline_worker(url, instance, method, per_txn, warmup, values, barrier, queue):
    """A raw psycopg 3 writer of the same rows: ``method`` is one of :data:`BASELINES`."""
    try:
        import json

        import psycopg
        from psycopg.types.json import Jsonb

        autocommit = method != "executemany"
        conn = psycopg.connect(url, autocommit=autocommit, application_name=f"bench {method} {instance}")
        cur = conn.cursor()
        counter = 0
        dumps = json.dumps

        def run_executemany(batch):
            # The first yardstick: stream ID from a local counter, one pipeline.
            nonlocal counter
            params = []
            for v in batch:
                counter += 1
                params.append((counter, instance, v["room_id"], v["receipt_type"], v["user_id"],
                               v["event_id"], v["thread_id"], Jsonb(v["data"])))
            with conn.pipeline(), conn.transaction():
                cur.executemany(BASELINE_SQL, params)

        def run_insert_nextval(batch):
            # One pipeline: BEGIN; INSERT ... VALUES (nextval(seq), ...) per row; COMMIT.
            params = [(instance, v["room_id"], v["receipt_type"], v["user_id"], v["event_id"],
                       v["thread_id"], dumps(v["data"])) for v in batch]
            with conn.pipeline(), conn.transaction():
                if len(params) == 1:
                    cur.execute(NEXTVAL_INSERT_SQL, params[0])
                else:
                    cur.executemany(NEXTVAL_INSERT_SQL, params)

        def run_copy(batch, binary):
            # IDs in one round trip from the writer's sequence (several processes draw from
            # it at once: nextval is the only correct way), then BEGIN, COPY, COMMIT.
            ids = [r[0] for r in cur.execute(NEXTVAL_SERIES_SQL, (len(batch),)).fetchall()]
            with conn.transaction():
                with cur.copy(COPY_BINARY_SQL if binary else COPY_TEXT_SQL) as copy:
                    if binary:
                        copy.set_types(COPY_TYPES)
                        for sid, v in zip(ids, batch):
                            copy.write_row((sid, instance, v["room_id"], v["receipt_type"], v["user_id"],
                                            v["event_id"], v["thread_id"], Jsonb(v["data"])))
                    else:
                        for sid, v in zip(ids, batch):
                            copy.write_row((sid, instance, v["room_id"], v["receipt_type"], v["user_id"],
                                            v["event_id"], v["thread_id"], dumps(v["data"])))

        run = {
            "executemany": run_executemany,
            "insert-nextval": run_insert_nextval,
            "copy-text": lambda batch: run_copy(batch, False),
            "copy-binary": lambda batch: run_copy(batch, True),
        }[method]
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


def _ensure_sequence(url: str) -> None:
    """The writer's sequence as its ID store makes it (ID 1 consumed), if no writer ran yet."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_class WHERE relkind = 'S' AND relname = %s", (SEQUENCE,)).fetchone() is None:
            conn.execute(f"CREATE SEQUENCE {SEQUENCE}")
            conn.execute("SELECT nextval(%s)", (SEQUENCE,))


def run_case(kind: str, url: str, procs: int, per_txn: int, facts_per_proc: int,
             warmup_txns: int, data: list[list[dict]], server_pid: int) -> RunResult:
    """``kind``: ``writer`` or a raw method of :data:`BASELINES`. ``server_pid``: the
    postmaster, whose process tree's CPU (backends, WAL writer, checkpointer, alive or
    exited) is read as the timed run starts and after the writing processes are gone."""
    from testing.accounting import all_stats, tree_cpu

    _prepare_table(url)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs + 1)  # the writing processes, and this one reading the server's CPU
    queue = ctx.Queue()
    writers_env = f"{STREAM}=" + ",".join(f"w{i + 1}" for i in range(procs))
    target = _writer_worker if kind == "writer" else _baseline_worker
    if kind != "writer":
        writers_env = kind
    need = (warmup_txns * per_txn) + facts_per_proc
    workers = []
    for i in range(procs):
        values = data[i][:need]
        p = ctx.Process(target=target, args=(url, f"w{i + 1}", writers_env, per_txn, warmup_txns,
                                             values, barrier, queue), daemon=True)
        p.start()
        workers.append(p)
    try:
        barrier.wait(timeout=600)
    except threading.BrokenBarrierError:
        pass  # a worker failed: its message says why
    server_cpu_start = tree_cpu(server_pid, all_stats())
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
    # Their backends exit on the clients' goodbye; the postmaster then counts their CPU.
    time.sleep(0.3)
    server_cpu = tree_cpu(server_pid, all_stats()) - server_cpu_start
    n = sum(r[0] for r in results)
    start, end = min(r[1] for r in results), max(r[2] for r in results)
    return RunResult(n, end - start, sum(r[3] for r in results), server_cpu)


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
                             "the best of each is reported (default 3, --quick 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", default="1x1,4x1,1x100,4x100",
                        help="the cases to run, as PROCSxFACTS_PER_TXN, comma-separated (default: all four)")
    args = parser.parse_args(argv)
    facts_100 = args.facts or (3000 if args.quick else 25000)
    facts_1 = max(facts_100 // 10, 50)
    repeat = args.repeat or (2 if args.quick else 3)
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
        cases = _parse_cases(args.cases)
        for i in range(max(procs for procs, _ in cases)):
            rng = random.Random(args.seed * 1000 + i)
            data.append([Receipt.synthetic(rng, n) for n in range(max_need)])
        print(f"rows: Receipt.synthetic, ~{_row_bytes(data[0][0])} bytes each; per process per timed run: "
              f"{facts_1} facts at 1/txn, {facts_100} facts at 100/txn; warm-up {warmup[1]} / {warmup[100]} "
              f"transactions; best of {repeat} run(s)")
        print("baselines (plain psycopg 3, same rows, same table): at 1 fact/txn insert-nextval = one pipeline "
              "BEGIN; INSERT ... VALUES (nextval(seq), ...); COMMIT; at 100 facts/txn copy-text / copy-binary = "
              "SELECT nextval(seq) FROM generate_series(1, n) (one round trip, autocommit), BEGIN, COPY, COMMIT; "
              "executemany (the first yardstick) = one pipeline BEGIN, executemany INSERT, COMMIT, stream ID "
              "from a local counter. seq is the writer's own sequence.")
        print(f"load average at start: {_loadavg()}")
        print(flush=True)
        _ensure_sequence(url)

        rows = []
        loads = []
        for procs, batch in cases:
            n = facts_100 if batch == 100 else facts_1
            kinds = ["writer", *BASELINES[batch]]
            best: dict[str, RunResult] = {}
            for r in range(repeat):
                # Alternate the order (the machine is shared): each kind goes first in turn.
                order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
                for kind in order:
                    res = run_case(kind, url, procs, batch, n, warmup[batch], data, db.pg.proc.pid)
                    if kind not in best or res.rate > best[kind].rate:
                        best[kind] = res
                    print(f"  {procs} proc x {batch:>3}/txn  {kind:<15} {res.rate:>9.0f}/s "
                          f"({res.facts} in {res.seconds:.2f} s, CPU us/fact: client {res.cpu_us_per_fact:.1f}, "
                          f"server {res.server_us_per_fact:.1f})",
                          flush=True)
            loads.append(_loadavg())
            rows.append((procs, batch, best))

        print()
        header = (f"{'case':<26}{'writer/s':>10}{'raw/s':>9}  {'raw method':<15}{'ratio':>6}{'goal':>6}"
                  f"{'executemany/s':>15}{'ratio':>7}{'writer us/fact':>16}{'raw us/fact':>13}"
                  f"{'writer srv us':>15}{'raw srv us':>12}")
        print(header)
        print("-" * len(header))
        goal_ok = True
        for procs, batch, best in rows:
            w = best["writer"]
            raws = [k for k in BASELINES[batch] if k != "executemany"]
            fastest = max(raws, key=lambda k: best[k].rate)
            raw, em = best[fastest], best["executemany"]
            ratio = w.rate / raw.rate if raw.rate else 0.0
            em_ratio = w.rate / em.rate if em.rate else 0.0
            goal = GOAL_RATIO[batch]
            name = f"{procs} writer{'s' if procs > 1 else ''}, {batch} fact{'s' if batch > 1 else ''}/txn"
            print(f"{name:<26}{w.rate:>10.0f}{raw.rate:>9.0f}  {fastest:<15}{ratio:>6.2f}{goal:>6.1f}"
                  f"{em.rate:>15.0f}{em_ratio:>7.2f}{w.cpu_us_per_fact:>16.1f}{raw.cpu_us_per_fact:>13.1f}"
                  f"{w.server_us_per_fact:>15.1f}{raw.server_us_per_fact:>12.1f}")
            if ratio < goal:
                goal_ok = False
            if len(raws) > 1:
                print("    " + ", ".join(f"{k} {best[k].rate:.0f}/s" for k in raws))
        print("(raw: the fastest raw method drawing IDs from the writer's sequence; us/fact: client CPU of the "
              "writing processes, summed, per fact; srv us: PostgreSQL's CPU per fact, all its processes, in the "
              "same best run)")
        print(f"load average after each case: {'; '.join(loads)}")
        print()
        print(f"goal: ratio to the fastest raw method >= {GOAL_RATIO[100]} at 100 facts/txn and >= {GOAL_RATIO[1]} "
              f"at 1 fact/txn: {'met' if goal_ok else 'NOT met'}")
        print(f"total time {time.monotonic() - t_begin:.0f} s")
    return 0


def _parse_cases(text: str) -> list[tuple[int, int]]:
    cases = []
    for part in text.split(","):
        procs, _, batch = part.strip().partition("x")
        if not (procs.isdigit() and batch in ("1", "100")):
            raise SystemExit(f"--cases: {part!r} is not PROCSx1 or PROCSx100")
        cases.append((int(procs), int(batch)))
    return cases


def _loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _row_bytes(values: dict) -> int:
    import json

    return sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in values.values() if v is not None)


if __name__ == "__main__":
    sys.exit(main())

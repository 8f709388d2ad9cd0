"""One writer process with and without its replication streamer: what publishing costs it.

    .venv/bin/python benchmarks/bench_writer_streamer.py [--facts N] [--repeat R] [--quick]

Starts a throwaway PostgreSQL (fsync on) and Redis, migrates a fresh database, then runs
``StreamWriter.append`` on ``receipts`` (100 facts per transaction, rows made beforehand) in
a child process per run, alternating:

* **streamer on**: ``REDIS_URL`` set, as a writer of a cluster: every advance becomes one
  channel-layer message and a PUBLISH per line on the Synapse channel (nobody listens but
  the writer's own bridge);
* **streamer on, rows by the standard library**: the same, with the fast paths of
  ``replication/protocol/wire_json.py`` off (``use_fast_paths(False)``): every row encoded by
  the standard library's ``json``, as before msgspec;
* **baseline, no streamer**: ``REDIS_URL`` unset, the same writer otherwise, same server.

Printed per run: facts/s, process CPU per fact, and per thread (``/proc/self/task``) user
and system CPU per fact: the writing thread (``MainThread``, which encodes each advance's
lines) and ``replication-streamer``. At the end: the writing thread's CPU per fact with rows
by msgspec and by the standard library and the baseline's (median of the runs), the best
streamer-on rate over the best baseline rate; and, in this process, the row encoding alone on
the benchmark's rows (``encode_rows`` of 100 rows against ``encode_json`` of each). This is
the single writer's part of ``bench_cluster``'s end-to-end figure (docs/benchmarks.md).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PER_TXN = 100
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _thread_times() -> dict[str, tuple[int, int]]:
    """user and system clock ticks of every thread of this process, by thread name."""
    import threading

    out = {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[t.name] = (int(fields[11]), int(fields[12]))
        except (OSError, IndexError, TypeError):
            pass
    return out


def _child(env: dict, facts: int, seed: int, results, fast_json: bool = True) -> None:
    try:
        from replication.protocol.wire_json import use_fast_paths

        use_fast_paths(fast_json)
        os.environ.update(env)
        if not env.get("REDIS_URL"):
            os.environ.pop("REDIS_URL", None)
        import django

        django.setup()
        import random

        from streams.registry import get_stream
        from streams.runtime import runtime

        rt = runtime()
        writer = rt.writer("receipts")
        streamer = rt.streamer
        if streamer is not None:  # subscribed before it writes, as a long-running writer is
            deadline = time.monotonic() + 20
            while (streamer.bridge is None or not streamer.bridge.subscribed.is_set()) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
        model = get_stream("receipts").primary_model
        rng = random.Random(seed)
        rows = [model.synthetic(rng, n) for n in range(facts)]
        batches = [[[(model, row)] for row in rows[i:i + PER_TXN]] for i in range(0, facts, PER_TXN)]
        writer.append(batches[0])  # warm-up: connections, plans
        t0_threads = _thread_times()
        c0, t0 = time.process_time(), time.perf_counter()
        for batch in batches[1:]:
            writer.append(batch)
        if streamer is not None:
            streamer.flush()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        t1_threads = _thread_times()
        written = facts - len(batches[0])
        threads = {name: tuple((t1_threads[name][i] - t0_threads[name][i]) / CLK_TCK for i in (0, 1))
                   for name in t1_threads if name in t0_threads}
        results.put(("ok", written, elapsed, cpu, threads))
        rt.close()
    except BaseException as e:  # report, never hang the parent
        results.put(("error", f"{type(e).__name__}: {e}"))


def _row_encoding(repeat: int) -> None:
    """The row encoding alone, in this process, on the benchmark's rows (synthetic receipts in
    runs of 100, as an advance of 100 facts): the standard library's ``encode_json`` per row
    against ``encode_rows`` of a run; median of ``repeat`` rounds of 300 runs each."""
    import random

    import django

    django.setup()  # the settings of migrated_database's environment
    from replication.protocol.wire_json import encode_json, encode_rows
    from streams.models import Receipt

    rng = random.Random(0)
    fields = Receipt.WIRE_FIELDS
    runs = [[[row[f] for f in fields] for row in (Receipt.synthetic(rng, i * PER_TXN + n) for n in range(PER_TXN))]
            for i in range(300)]
    assert [encode_rows(rows) for rows in runs] == [[encode_json(r).encode() for r in rows] for rows in runs]
    std, fast = [], []
    for _ in range(repeat):
        c = time.process_time()
        for rows in runs:
            [encode_json(row) for row in rows]
        std.append(1e6 * (time.process_time() - c) / (300 * PER_TXN))
        c = time.process_time()
        for rows in runs:
            encode_rows(rows)
        fast.append(1e6 * (time.process_time() - c) / (300 * PER_TXN))
    s, f = sorted(std)[len(std) // 2], sorted(fast)[len(fast) // 2]
    print(f"row encoding alone (this process, the benchmark's rows, median of {repeat}): standard library "
          f"{s:.3f} us/row, encode_rows {f:.3f} us/row: {s / f:.1f}x faster")


def main(argv: list[str] | None = None) -> int:
    from benchmarks._setup import run_size

    facts, repeat = run_size(__doc__, argv, facts=60_000, quick_facts=10_000)

    from benchmarks._machine import cpu_description, load_average, server_versions
    from benchmarks._setup import migrated_database

    extra = {"SERVER_NAME": "bench.example", "STREAM_WRITERS": "receipts=w1", "INSTANCE_NAME": "w1",
             "LOG_LEVEL": "WARNING"}
    with migrated_database("bench_writer_streamer", redis=True, env=extra, django_setup=False) as db:
        versions = server_versions(db.url, db.redis.url)
        print(f"machine: {cpu_description()}; load avg {load_average()}")
        print("servers: " + "; ".join(f"{k} {v}" for k, v in versions.items()))
        print(f"writer: StreamWriter.append on receipts, {PER_TXN} facts per transaction, {facts:,} facts a run "
              f"(the first transaction is a warm-up, not timed), one child process per run")
        print()
        ctx = mp.get_context("spawn")
        kinds = {"msgspec": "streamer on", "stdlib": "stdlib rows", "baseline": "no streamer"}
        best = dict.fromkeys(kinds, 0.0)
        main_thread: dict[str, list[float]] = {kind: [] for kind in kinds}
        for rep in range(repeat):
            for kind, label in kinds.items():
                env = {k: v for k, v in db.env.items() if isinstance(v, str)}
                env["REDIS_URL"] = db.redis.url if kind != "baseline" else ""
                results = ctx.Queue()
                proc = ctx.Process(target=_child, args=(env, facts, rep, results, kind != "stdlib"), daemon=True)
                proc.start()
                msg = results.get(timeout=600)
                proc.join(30)
                if msg[0] != "ok":
                    raise RuntimeError(f"{kind} run failed: {msg[1]}")
                _, written, elapsed, cpu, threads = msg
                rate = written / elapsed
                best[kind] = max(best[kind], rate)
                user, system = threads.get("MainThread", (0.0, 0.0))
                main_thread[kind].append(1e6 * (user + system) / written)
                per = ", ".join(f"{name} {1e6 * u / written:.1f} + {1e6 * s / written:.1f}"
                                for name, (u, s) in sorted(threads.items()) if u + s > 0)
                print(f"  run {rep + 1} {label:<12} {rate:>9,.0f} facts/s; process CPU {1e6 * cpu / written:.1f} "
                      f"us/fact; per thread, user + system us/fact: {per}", flush=True)
        print()
        med = {kind: sorted(v)[len(v) // 2] for kind, v in main_thread.items()}
        print(f"writing thread (MainThread), median: rows by msgspec {med['msgspec']:.1f} us/fact, by the standard "
              f"library {med['stdlib']:.1f}, no streamer {med['baseline']:.1f}: the streamer's part "
              f"{med['msgspec'] - med['baseline']:.1f} against {med['stdlib'] - med['baseline']:.1f} us/fact")
        print(f"best: streamer on {best['msgspec']:,.0f} facts/s, with stdlib rows {best['stdlib']:,.0f}, no streamer "
              f"(baseline) {best['baseline']:,.0f} facts/s: ratio {best['msgspec'] / best['baseline']:.2f} "
              f"(stdlib rows {best['stdlib'] / best['baseline']:.2f})")
        _row_encoding(repeat)
        print(f"load avg {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

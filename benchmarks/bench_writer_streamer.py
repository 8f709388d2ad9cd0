"""One writer process with and without its replication streamer: what publishing costs it.

    .venv/bin/python benchmarks/bench_writer_streamer.py [--facts N] [--repeat R] [--quick]

Starts a throwaway PostgreSQL (fsync on) and Redis, migrates a fresh database, then runs
``StreamWriter.append`` on ``receipts`` (100 facts per transaction, rows made beforehand) in
a child process per run, alternating:

* **streamer on**: ``REDIS_URL`` set, as a writer of a cluster: every advance becomes one
  channel-layer message and a PUBLISH per line on the Synapse channel (nobody listens but
  the writer's own bridge);
* **baseline, no streamer**: ``REDIS_URL`` unset, the same writer otherwise, same server.

Printed per run: facts/s, process CPU per fact, and per thread (``/proc/self/task``) user
and system CPU per fact: the writing thread and ``replication-streamer``. The ratio printed
at the end is the best streamer-on rate over the best baseline rate. This is the single
writer's part of ``bench_cluster``'s end-to-end figure (docs/benchmarks.md).
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


def _child(env: dict, facts: int, seed: int, results) -> None:
    try:
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
        best = {"streamer": 0.0, "baseline": 0.0}
        for rep in range(repeat):
            for kind in ("streamer", "baseline"):
                env = {k: v for k, v in db.env.items() if isinstance(v, str)}
                env["REDIS_URL"] = db.redis.url if kind == "streamer" else ""
                results = ctx.Queue()
                proc = ctx.Process(target=_child, args=(env, facts, rep, results), daemon=True)
                proc.start()
                msg = results.get(timeout=600)
                proc.join(30)
                if msg[0] != "ok":
                    raise RuntimeError(f"{kind} run failed: {msg[1]}")
                _, written, elapsed, cpu, threads = msg
                rate = written / elapsed
                best[kind] = max(best[kind], rate)
                per = ", ".join(f"{name} {1e6 * u / written:.1f} + {1e6 * s / written:.1f}"
                                for name, (u, s) in sorted(threads.items()) if u + s > 0)
                label = "streamer on" if kind == "streamer" else "no streamer"
                print(f"  run {rep + 1} {label:<12} {rate:>9,.0f} facts/s; process CPU {1e6 * cpu / written:.1f} "
                      f"us/fact; per thread, user + system us/fact: {per}", flush=True)
        print()
        print(f"best: streamer on {best['streamer']:,.0f} facts/s, no streamer (baseline) {best['baseline']:,.0f} "
              f"facts/s: ratio {best['streamer'] / best['baseline']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

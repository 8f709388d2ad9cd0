"""End-to-end cluster throughput (write -> Redis -> 3 workers), against raw Redis pub/sub.

    .venv/bin/python benchmarks/bench_cluster.py [--quick] [--facts F] [--writers 1,2,4]
                     [--sink count|jsonl] [--synthetic-in-loop] [--no-dbonly] [--repeat R]
                     [--profile DIR] [--keep] [--per-txn N] [--concurrency C] [--workers W]
                     [--followers-nice N|idle]

Starts a throwaway PostgreSQL (``PostgresServer(fast=False)``: fsync on) and a throwaway Redis,
migrates a fresh database, then runs a whole cluster as separate OS processes, the way
``tests/replication/test_redis_faults.py`` does (env ``DATABASE_URL``, ``REDIS_URL``,
``SERVER_NAME``, ``STREAM_WRITERS=receipts=w1,w2,w3,w4``, ``INSTANCE_NAME``):

* one replication endpoint (``manage.py runreplication``) and daphne (the catch-up endpoint);
* 3 workers following ``receipts``: two over TCP through the endpoint, one straight from
  Redis. ``--sink count`` (default): small worker processes of this script running the Python
  API (``ReplicationWorker`` / ``RedisReplicationWorker``) with a counting coroutine callback.
  ``--sink jsonl``: the real ``manage.py replication_worker --connect/--redis --jsonl``
  processes, delivery timed by tailing their files; their sink is a plain function, which the
  worker calls through ``run_in_executor`` once per fact: that thread hop (~45 us) and the
  write cost 5-8x what the rest of the worker costs, so it would be the jsonl sink that is
  measured;
* for each writer count N (1, 2, 4): N writer processes, each writing F facts to
  ``receipts``, 100 per transaction, through ``write_facts`` (``call_command("write_facts",
  "receipts", count=F, per_txn=100)``: ``manage.py write_facts receipts --count F --per-txn
  100`` minus the interpreter start-up) in a process that has set up Django and its stream
  runtime and waited until its Redis bridge is subscribed (as a long-running writer would be)
  before a common start signal. With ``REDIS_URL`` set, the runtime's streamer publishes one
  channel-layer message per batch (to the endpoint) and every line on the Synapse channel
  (to the Redis worker). By default the synthetic rows ``write_facts`` would make inside its
  loop (``Receipt.synthetic``, ~50 us each) are made beforehand, the same rows, as
  ``bench_stream_ids`` does (``--synthetic-in-loop``: as is).

``--workers`` names other workers than the default three (``tcp1``: one worker over TCP),
or ``none``: the writers with replication on (streamer, endpoint, Redis) and nobody to serve,
the floor under any worker's cost; the goals are judged only with the default three.

``--concurrency C`` passes ``concurrency=C`` to each writer's ``write_facts``: C threads per
writer process, each with its own database connection, sharing the process's writer, ID
generator and streamer (C transactions in flight, as an event persister with a connection
pool); the header says which was used. Default 1: one transaction at a time.

**End to end**: facts/s = N x F / (from the first write's start until the last of the 3
workers has every fact). Exactly-once is checked on the way: each worker's facts of the run
against the rows in the database (no duplicates, none missing, tokens ascending per writer).

Compared in the same run (each run of a writer count does all of them, one after the other,
so that a ratio never spans a change in the machine's load):

* **the same writers without replication**: the same writer processes with ``REDIS_URL`` unset
  (no streamer at all) into a copy of the database on the same server. **Goal (1 writer):
  end to end >= 0.8 of it.**
* **raw Redis**, same payloads (the RDATA lines of the facts just written, rebuilt from the
  database exactly as the writers publish them), on a channel the cluster does not listen to,
  N redis-py publishers to 3 redis-py subscribers; facts/s = lines / (first publish until the
  last subscriber has them all):
  (a) one PUBLISH per line, 100 per pipeline (the Synapse channel's shape);
  (b) batched: 100 lines per PUBLISH (newline-separated, as a transaction's batch), 100
  PUBLISH per pipeline, the subscribers counting the lines (cycled so a run lasts long enough
  to time): the fastest raw way to move the same bytes.

**Replication's price**: CPU us/fact of every part that replication adds: the writers'
streamers (the batch's formatting on the writing thread, timed around the streamer's
``_prepare``, and the ``replication-streamer`` thread, from ``/proc/self/task/*/schedstat``),
the endpoint, daphne (catch-up), Redis (``/proc``) and each worker; the writers' remaining CPU
is their database part. **Goals: <= 10 us/fact before the workers (streamers + endpoint +
daphne + Redis), <= 3 us/fact per worker.**

Also printed: the writers' own write phase; CPU time of every process of the cluster per fact
(writers, endpoint, daphne, each worker, Redis, PostgreSQL, this script) and of the rest of
the machine (other users), with the load average at the start of each run; catch-up requests
(daphne's access log); lines the writers' bridges dropped. ``--profile DIR`` runs the endpoint
and workers under cProfile and profiles the writers' main and streamer threads.

**The writers' chain**, with and without replication: a writer writes one transaction at a
time, so its rate is the sum, per fact, of its writing thread's time and its database
backend's. Printed per fact, from ``schedstat``: the writing thread's wait for a core (time
runnable but not running), the backend's CPU and its wait for a core. With the writing
thread's CPU (the writers' CPU above, less the streamer's thread) they account for the end
to end time per fact, so the gap to the writer alone splits into CPU replication adds to the
chain and time the chain stands waiting for a core while both cores are busy.
``--followers-nice N`` runs the endpoint, daphne, Redis and the workers at niceness N, and
``--followers-nice idle`` under ``SCHED_IDLE`` (on a core only when nothing else wants it):
a diagnosis of those waits; the goals are then not judged.

Redis runs with ``client-output-buffer-limit pubsub 0 0 0`` (a slow subscriber is never cut
off), for the cluster and the baseline alike. Exit status 0 whether or not the goal is met.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import mmap
import multiprocessing as mp
import os
import pickle
import platform
import queue as queue_mod
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from testing.accounting import all_stats, machine_busy, read_stat, tree_cpu  # noqa: E402
from testing.processes import tail, wait_port  # noqa: E402
from testing.services import free_port  # noqa: E402

SERVER_NAME = "bench.example"
RAW_CHANNEL = "rawbench.example"   # the baseline's channel: the cluster does not listen to it
STREAM = "receipts"
WRITER_NAMES = ["w1", "w2", "w3", "w4"]
STREAM_WRITERS = f"{STREAM}=" + ",".join(WRITER_NAMES)
PER_TXN = 100
#: Goals: the 1-writer end-to-end rate against the same writer without
#: replication, and replication's own CPU per fact before the workers and in each worker.
GOAL_E2E_VS_WRITER = 0.8
GOAL_BEFORE_WORKERS_US = 10.0
GOAL_PER_WORKER_US = 3.0
#: the cluster's workers, (name, transport); ``--workers`` changes the list in place
DEFAULT_WORKERS = "tcp1,tcp2,redis1"
WORKERS: list[tuple[str, str]] = []
POLL = 0.01
STALL = 20.0  # seconds without any delivery after the writers finished: a run is declared incomplete
# count sink: per worker a shared file of 5 doubles: facts, duplicates, out-of-order, last fact time, reserved
COUNT_FMT = "ddddd"


# -- small helpers ---------------------------------------------------------------------------

def _django_setup(env: dict) -> None:
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
    import django

    django.setup()


# -- writer processes (spawned) --------------------------------------------------------------

def _thread_cpu(name: str) -> float:
    """CPU seconds of this process's thread called ``name`` (0 if none), from its
    ``schedstat`` (nanoseconds on a CPU: the clock-tick counts of ``stat`` are too coarse for
    a thread busy a few tens of milliseconds)."""
    import threading

    for t in threading.enumerate():
        if t.name == name and t.native_id is not None:
            return _schedstat(f"/proc/self/task/{t.native_id}/schedstat")[0]
    return 0.0


def _schedstat(path: str) -> tuple[float, float]:
    """Seconds on a CPU and seconds waiting for one (runnable, not running) of the task at
    ``path`` (``/proc/<pid>[/task/<tid>]/schedstat``); zeros when it cannot be read."""
    try:
        with open(path) as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):  # ValueError also for a short line (unpacking)
        return 0.0, 0.0


def _chain_clocks(backend_pid: int) -> tuple[float, float, float]:
    """The writer's chain, so far: the writing thread's wait for a core, its database
    backend's CPU and its wait for a core (seconds)."""
    import threading

    _, thread_wait = _schedstat(f"/proc/self/task/{threading.get_native_id()}/schedstat")
    backend_cpu, backend_wait = _schedstat(f"/proc/{backend_pid}/schedstat")
    return thread_wait, backend_cpu, backend_wait


def _writer_child(env: dict, instance: str, count: int, seed: int, pregenerate: bool, ready, go, results) -> None:
    try:
        _django_setup({**env, "INSTANCE_NAME": instance})
        from django.core.management import call_command

        from streams.registry import get_stream
        from streams.runtime import runtime

        if pregenerate:
            # write_facts makes each row in its loop (model.synthetic(rng, n), ~50 us a row:
            # one rng.choice per padding character). Make the very same rows now, before the
            # clock starts (as bench_stream_ids does), and let write_facts take them.
            import random

            model = get_stream(STREAM).primary_model
            rng = random.Random(seed)
            rows = [model.synthetic(rng, n) for n in range(count)]
            model.synthetic = classmethod(lambda cls, rng, n: rows[n])

        rt = runtime()
        rt.writer(STREAM)
        streamer = rt.streamer
        if streamer is not None:
            # A long-running writer is subscribed before it writes (write_facts alone would
            # drop its first lines while the subscription is being confirmed).
            deadline = time.monotonic() + 20
            while (streamer.bridge is None or not streamer.bridge.subscribed.is_set()) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
        profiles = []
        if env.get("BENCH_PROFILE_DIR"):
            import cProfile

            # this thread, the streamer's thread; CPU time of each thread (wall time would show
            # mostly the waits for the database and for the other thread's GIL)
            profiles = [cProfile.Profile(time.thread_time), cProfile.Profile(time.thread_time)]
            if streamer is not None:
                streamer._loop.call_soon_threadsafe(profiles[1].enable)
        prepare_cpu, streamer_cpu = [0.0], [0.0]
        if streamer is not None:
            # Replication's price in this process, apart from the database path: the
            # batch's formatting on the writing thread (the streamer's notifier callback)...
            prepare = streamer._prepare

            def timed_prepare(advance):
                c0 = time.thread_time()
                try:
                    return prepare(advance)
                finally:
                    prepare_cpu[0] += time.thread_time() - c0

            streamer._prepare = timed_prepare
            close = streamer.close

            def measured_close():
                # write_facts closes the runtime: the streamer's thread is gone after this
                streamer.flush()
                streamer_cpu[0] = _thread_cpu("replication-streamer") - streamer_cpu0
                close()

            streamer.close = measured_close
        from django.db import connection

        with connection.cursor() as c:  # write_facts writes on this thread's connection
            c.execute("SELECT pg_backend_pid()")
            backend_pid = c.fetchone()[0]
        ready.put(instance)
        go.wait()
        chain0 = _chain_clocks(backend_pid)
        # ... and the streamer's own thread (writes to Redis, reads its subscription back).
        streamer_cpu0 = _thread_cpu("replication-streamer")
        if streamer is not None and streamer_cpu0 == 0.0:
            raise RuntimeError("the writer has no replication-streamer thread to measure")
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        out = io.StringIO()
        if profiles:
            profiles[0].enable()
        per_txn = int(env.get("BENCH_PER_TXN", PER_TXN))
        concurrency = int(env.get("BENCH_CONCURRENCY", 1))
        call_command("write_facts", STREAM, count=count, per_txn=per_txn, seed=seed, no_progress=True,
                     concurrency=concurrency, stdout=out)
        t1 = time.monotonic()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        chain = [b - a for a, b in zip(chain0, _chain_clocks(backend_pid))]
        if profiles:
            profiles[0].disable()
            tag = f"{instance}-{'redis' if streamer is not None else 'dbonly'}-{os.getpid()}"
            profiles[0].dump_stats(os.path.join(env["BENCH_PROFILE_DIR"], f"writer-{tag}-main.prof"))
            if streamer is not None:
                profiles[1].dump_stats(os.path.join(env["BENCH_PROFILE_DIR"], f"writer-{tag}-streamer.prof"))
        text = out.getvalue()
        # "wrote N facts to receipts as w1 in X s (...)": the write loop's own duration
        elapsed = float(text.split(" in ", 1)[1].split(" s", 1)[0])
        stats = {"thread_wait": chain[0], "backend_cpu": chain[1], "backend_wait": chain[2]}
        if streamer is not None:
            stats |= {"messages": streamer.published_messages, "lines": streamer.published_lines,
                     "bridge_published": streamer.bridge.published if streamer.bridge else 0,
                     "bridge_dropped": streamer.bridge.dropped if streamer.bridge else 0,
                     "prepare_cpu": prepare_cpu[0], "streamer_cpu": streamer_cpu[0]}
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        results.put(("ok", instance, t0, elapsed, t1, cpu, stats, text.strip()))
    except BaseException as e:  # report, never hang the parent
        results.put(("error", instance, f"{type(e).__name__}: {e}"))
        ready.put(instance)


# -- counting workers (--sink count), spawned -----------------------------------------------

def _count_worker_child(env: dict, name: str, transport: str, port: int, web_port: int, path: str) -> None:
    _django_setup(env)
    import asyncio
    import signal

    from replication.worker.redis_worker import RedisReplicationWorker
    from replication.worker.tcp_worker import ReplicationWorker

    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, struct.calcsize(COUNT_FMT))
    state = {"n": 0, "dup": 0, "order": 0}
    last: dict[str, int] = {}

    async def on_facts(stream: str, writer: str, token: int, rows: list) -> None:
        prev = last.get(writer, 0)
        if token == prev:
            state["dup"] += 1
        elif token < prev:
            state["order"] += 1
        last[writer] = max(prev, token)
        state["n"] += 1
        struct.pack_into(COUNT_FMT, mm, 0, state["n"], state["dup"], state["order"], time.monotonic(), 0.0)

    # Catch-up pages as `replication_worker` asks for them (REPLICATION_CATCHUP_MAX_LIMIT).
    common = dict(name=name, server_name=SERVER_NAME, catchup_url=f"http://127.0.0.1:{web_port}",
                  streams=[STREAM], on_facts=on_facts, catchup_page_limit=1000,
                  replication_secret=env.get("REPLICATION_SECRET", ""))
    worker = (RedisReplicationWorker(redis_url=env["REDIS_URL"], **common) if transport == "redis"
              else ReplicationWorker(host="127.0.0.1", port=port, **common))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    if env.get("BENCH_PROFILE_DIR"):
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            asyncio.run(run())
        finally:
            prof.disable()
            prof.dump_stats(os.path.join(env["BENCH_PROFILE_DIR"], f"{name}.prof"))
    else:
        asyncio.run(run())


# -- raw Redis baseline processes (spawned) ----------------------------------------------------

def _raw_subscriber(url: str, index: int, expected: int, count_lines: bool, ready, results) -> None:
    """Counts messages (``count_lines``: the lines in them) until it has ``expected``."""
    import redis

    try:
        r = redis.Redis.from_url(url)
        p = r.pubsub()
        p.subscribe(RAW_CHANNEL)
        while True:
            m = p.get_message(timeout=5)
            if m is not None and m["type"] == "subscribe":
                break
        ready.put(index)
        c0 = time.process_time()
        n = 0
        t_first = t_last = None
        deadline = time.monotonic() + 600
        while n < expected and time.monotonic() < deadline:
            m = p.get_message(timeout=1.0)
            if m is not None and m["type"] == "message":
                n += m["data"].count(b"\n") + 1 if count_lines else 1
                if t_first is None:
                    t_first = time.monotonic()
        t_last = time.monotonic()
        cpu = time.process_time() - c0
        p.close()
        r.close()
        results.put(("sub", index, n, t_first, t_last, cpu))
    except BaseException as e:
        results.put(("error", index, f"{type(e).__name__}: {e}"))
        ready.put(index)


def _raw_publisher(url: str, index: int, path: str, per_pipeline: int, ready, go, results) -> None:
    import redis

    try:
        with open(path, "rb") as f:
            messages: list[bytes] = pickle.load(f)
        r = redis.Redis.from_url(url)
        r.ping()
        ready.put(index)
        go.wait()
        t0 = time.monotonic()
        c0 = time.process_time()
        for i in range(0, len(messages), per_pipeline):
            pipe = r.pipeline(transaction=False)
            for m in messages[i:i + per_pipeline]:
                pipe.publish(RAW_CHANNEL, m)
            pipe.execute()
        t1 = time.monotonic()
        results.put(("pub", index, len(messages), t0, t1, time.process_time() - c0))
        r.close()
    except BaseException as e:
        results.put(("error", index, f"{type(e).__name__}: {e}"))
        ready.put(index)


@dataclass
class RawResult:
    facts: int
    seconds: float
    messages: int
    pub_cpu: float
    sub_cpu: float
    redis_cpu: float

    @property
    def rate(self) -> float:
        return self.facts / self.seconds if self.seconds > 0 else 0.0


def run_raw(ctx, url: str, redis_pid: int, per_publisher: list[list[bytes]], batched: bool,
            workdir: Path, label: str) -> RawResult:
    """N publishers (one per list) -> a subscriber per worker; every subscriber must get every message.
    ``batched``: each message is several newline-separated lines, and a fact is a line."""
    messages = sum(len(m) for m in per_publisher)
    total = sum(m.count(b"\n") + 1 for msgs in per_publisher for m in msgs) if batched else messages
    paths = []
    for i, msgs in enumerate(per_publisher):
        path = workdir / f"raw-{label}-{i}.pickle"
        with open(path, "wb") as f:
            pickle.dump(msgs, f)
        paths.append(str(path))
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    subs = [ctx.Process(target=_raw_subscriber, args=(url, i, total, batched, ready, results), daemon=True)
            for i in range(len(WORKERS))]
    for p in subs:
        p.start()
    for _ in subs:
        ready.get(timeout=60)
    pubs = [ctx.Process(target=_raw_publisher, args=(url, i, paths[i], PER_TXN, ready, go, results), daemon=True)
            for i in range(len(per_publisher))]
    for p in pubs:
        p.start()
    for _ in pubs:
        ready.get(timeout=60)
    redis_cpu0 = (read_stat(redis_pid) or (0, 0.0))[1]
    go.set()
    pub, sub = [], []
    try:
        for _ in range(len(subs) + len(pubs)):
            msg = results.get(timeout=600)
            if msg[0] not in ("sub", "pub"):
                raise RuntimeError(f"raw Redis process {msg[1]} failed: {msg[2]}")
            (sub if msg[0] == "sub" else pub).append(msg)
    finally:
        for p in subs + pubs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        for path in paths:
            os.unlink(path)
    redis_cpu1 = (read_stat(redis_pid) or (0, 0.0))[1]
    short = [m for m in sub if m[2] < total]
    if short:
        raise RuntimeError(f"raw Redis subscriber got {short[0][2]} of {total} messages")
    start = min(m[3] for m in pub)
    end = max(m[4] for m in sub)
    return RawResult(total, end - start, messages, sum(m[5] for m in pub),
                     sum(m[5] for m in sub), redis_cpu1 - redis_cpu0)


def raw_payloads(updates: dict[str, list[list]]) -> dict[str, list[bytes]]:
    """Per writer, the RDATA lines its streamer publishes for these facts (``batch`` tokens
    for all but the last row of a multi-row fact)."""
    from replication.protocol.commands import RdataCommand

    out = {}
    for writer, pairs in updates.items():
        lines = []
        for i, (token, row) in enumerate(pairs):
            last = i + 1 == len(pairs) or pairs[i + 1][0] != token
            lines.append(RdataCommand(STREAM, writer, token if last else None, row).to_line().encode())
        out[writer] = lines
    return out


def batch_messages(lines: list[bytes], min_lines: int) -> list[bytes]:
    """The same lines, ``PER_TXN`` to a message (newline-separated, as a transaction's batch),
    cycled to at least ``min_lines`` so that a run lasts long enough to time."""
    msgs = [b"\n".join(lines[i:i + PER_TXN]) for i in range(0, len(lines), PER_TXN)]
    out = list(msgs)
    while sum(m.count(b"\n") + 1 for m in out) < min_lines:
        out.extend(msgs)
    return out


# -- the cluster -------------------------------------------------------------------------------

class Tail:
    """Counts complete lines appended to a worker's jsonl file since ``mark()``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = self.base_offset = 0
        self.count = self.base = 0

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.count - self.base
        if data:
            self.offset += len(data)
            self.count += data.count(b"\n")
        return self.count - self.base

    def mark(self) -> None:
        self.poll()
        self.base = self.count
        self.base_offset = self.offset

    def new_facts(self) -> list[tuple[str, int]]:
        with open(self.path, "rb") as f:
            f.seek(self.base_offset)
            data = f.read()
        out = []
        for line in data.splitlines():
            if line.strip():
                fact = json.loads(line)
                out.append((fact["writer"], int(fact["token"])))
        return out


class Counter:
    """The count sink's shared counters for one worker."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "wb") as f:
            f.write(b"\0" * struct.calcsize(COUNT_FMT))
        self._f = open(path, "r+b")
        self.mm = mmap.mmap(self._f.fileno(), struct.calcsize(COUNT_FMT))
        self.base = (0.0, 0.0, 0.0)

    def read(self) -> tuple[float, ...]:
        return struct.unpack_from(COUNT_FMT, self.mm, 0)

    def poll(self) -> int:
        return int(self.read()[0] - self.base[0])

    def mark(self) -> None:
        self.base = self.read()[:3]

    def anomalies(self) -> tuple[int, int]:
        v = self.read()
        return int(v[1] - self.base[1]), int(v[2] - self.base[2])


class Cluster:
    def __init__(self, env: dict, workdir: Path, sink: str, ctx) -> None:
        self.env, self.workdir, self.sink, self.ctx = env, workdir, sink, ctx
        self.procs: dict[str, subprocess.Popen] = {}
        self.mprocs: dict[str, mp.Process] = {}
        self.web_port = free_port()
        self.repl_port = free_port()
        self.access_log = workdir / "access.log"
        self.start("daphne", "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port),
                   "--access-log", str(self.access_log), "synapse_repl.asgi:application")
        self.start("endpoint", "manage.py", "runreplication", "--listen", f"127.0.0.1:{self.repl_port}")
        wait_port(self.repl_port, self.procs["endpoint"], workdir / "endpoint.log")
        wait_port(self.web_port, self.procs["daphne"], workdir / "daphne.log")
        self.progress: dict[str, Tail | Counter] = {}
        for name, transport in WORKERS:
            if sink == "jsonl":
                how = ["--redis"] if transport == "redis" else ["--connect", f"127.0.0.1:{self.repl_port}"]
                self.start(name, "manage.py", "replication_worker", "--name", name, *how,
                           "--catchup-url", f"http://127.0.0.1:{self.web_port}", "--server-name", SERVER_NAME,
                           "--streams", STREAM, "--jsonl", str(workdir / f"{name}.jsonl"))
                self.progress[name] = Tail(workdir / f"{name}.jsonl")
            else:
                counter = Counter(workdir / f"{name}.count")
                self.progress[name] = counter
                p = ctx.Process(target=_count_worker_entry,
                                args=(env, name, transport, self.repl_port, self.web_port, str(counter.path),
                                      str(workdir / f"{name}.log")), daemon=True)
                p.start()
                self.mprocs[name] = p
        deadline = time.monotonic() + 60
        for name, transport in WORKERS:
            needle = "replication subscribed" if transport == "redis" else "replication connected"
            while needle not in tail(workdir / f"{name}.log", 200):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {name} did not connect:\n{tail(workdir / f'{name}.log')}")
                time.sleep(0.05)

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        if self.env.get("BENCH_PROFILE_DIR") and args[0] == "manage.py":
            args = ("-m", "cProfile", "-o", os.path.join(self.env["BENCH_PROFILE_DIR"], f"{name}.prof"), *args)
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def pid(self, name: str) -> int:
        return self.procs[name].pid if name in self.procs else self.mprocs[name].pid

    def catch_up_requests(self) -> int:
        try:
            return self.access_log.read_text(errors="replace").count("get_repl_stream_updates")
        except OSError:
            return 0

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for p in self.mprocs.values():
            if p.is_alive():
                p.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for p in self.mprocs.values():
            p.join(timeout=15)
            if p.is_alive():
                p.kill()


def _count_worker_entry(env, name, transport, port, web_port, path, log) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    _count_worker_child(env, name, transport, port, web_port, path)


# -- one run -----------------------------------------------------------------------------------

@dataclass
class WriteResult:
    facts: int
    start: float             # first write's start
    write_end: float         # last write loop's end (before the runtime is closed)
    closed: float            # last writer's write_facts returned (streamer flushed)
    cpu: float               # writers' CPU from the start signal to their end
    stats: dict = field(default_factory=dict)

    @property
    def write_rate(self) -> float:
        return self.facts / (self.write_end - self.start)


def run_writers(ctx, env: dict, n: int, facts: int, seed: int, on_poll=None, timeout: float = 600,
                pregenerate: bool = True) -> WriteResult:
    """N writer processes, each ``write_facts`` of ``facts`` facts, started together.
    ``on_poll("start")`` runs just before the start signal, ``on_poll("poll")`` every POLL
    seconds until the writers have finished and it returns True."""
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_writer_child,
                         args=(env, WRITER_NAMES[i], facts, seed * 100 + i, pregenerate, ready, go, results),
                         daemon=True) for i in range(n)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    if on_poll is not None:
        on_poll("start")
    go.set()
    got = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if len(got) < n:
                try:
                    msg = results.get(timeout=POLL)
                except queue_mod.Empty:
                    msg = None
                if msg is not None:
                    if msg[0] != "ok":
                        raise RuntimeError(f"writer {msg[1]} failed: {msg[2]}")
                    got.append(msg)
            else:
                time.sleep(POLL)
            finished = on_poll("poll") if on_poll is not None else True
            if len(got) == n and (finished or on_poll("stalled")):
                break
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if len(got) < n:
        raise RuntimeError("writers did not finish in time")
    stats: dict = {}
    for m in got:
        for k, v in m[6].items():
            stats[k] = stats.get(k, 0) + v
    return WriteResult(facts * n, min(m[2] for m in got), max(m[2] + m[3] for m in got), max(m[4] for m in got),
                       sum(m[5] for m in got), stats)


@dataclass
class E2EResult:
    writes: WriteResult
    done: dict                       # worker -> time it had every fact (None: never)
    got: dict                        # worker -> facts received
    checks: dict                     # worker -> "ok" or what is wrong
    cpu: dict                        # component -> CPU seconds during the run
    busy: float                      # machine CPU seconds during the run
    wall: float
    catch_ups: int
    updates: dict                    # writer -> [[token, row]...] written in this run

    @property
    def complete(self) -> bool:
        return all(t is not None for t in self.done.values())

    @property
    def seconds(self) -> float:
        # with no workers, until the last writer's streamer has flushed
        return max(self.done.values(), default=self.writes.closed) - self.writes.start

    @property
    def rate(self) -> float:
        return self.writes.facts / self.seconds if self.complete else 0.0


def _positions(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = %s",
                            (STREAM,)).fetchall()
    return {w: t for w, t in rows}


def _checkpoint(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def run_e2e(ctx, cluster: Cluster, env: dict, url: str, pids: dict, n: int, facts: int,
            seed: int, timeout: float, pregenerate: bool) -> E2EResult:
    from streams.registry import get_stream
    from streams.updates_since import get_updates_since

    expected = n * facts
    before = _positions(url)
    _checkpoint(url)
    state: dict = {"done": {name: None for name, _ in WORKERS}, "got": {}}
    snap: dict = {}

    def snapshot() -> dict:
        stats = all_stats()
        out = {name: tree_cpu(pid, stats) for name, pid in pids.items()}
        ru = resource.getrusage(resource.RUSAGE_SELF)
        out["bench"] = ru.ru_utime + ru.ru_stime
        out["_busy"] = machine_busy()
        out["_wall"] = time.monotonic()
        return out

    def on_poll(what: str) -> bool:
        if what == "start":
            for prog in cluster.progress.values():
                prog.mark()
            snap["catch_ups"] = cluster.catch_up_requests()
            snap["before"] = snapshot()
            state["progress_at"] = time.monotonic()
            return False
        now = time.monotonic()
        if what == "stalled":  # the writers are done: give up after STALL seconds without progress
            return now - state.get("progress_at", now) > STALL
        for name, prog in cluster.progress.items():
            count = prog.poll()
            if count != state["got"].get(name):
                state["progress_at"] = now
            state["got"][name] = count
            if state["done"][name] is None and count >= expected:
                state["done"][name] = now
        return all(t is not None for t in state["done"].values())

    try:
        writes = run_writers(ctx, env, n, facts, seed, on_poll=on_poll, timeout=timeout, pregenerate=pregenerate)
    except RuntimeError as e:
        raise RuntimeError(f"{e}; delivered so far: {state['got']}") from None
    after = snapshot()
    time.sleep(0.3)
    on_poll("poll")  # late extras (duplicates) show up in the checks
    cpu = {k: after[k] - snap["before"][k] for k in after if not k.startswith("_")}
    cpu["writers"] = writes.cpu
    busy = after["_busy"] - snap["before"]["_busy"]
    wall = after["_wall"] - snap["before"]["_wall"]
    catch_ups = cluster.catch_up_requests() - snap["catch_ups"]

    # What the database holds for this run, exactly as the catch-up endpoint serves it.
    spec = get_stream(STREAM)
    now_pos = _positions(url)
    updates = {}
    for w in WRITER_NAMES[:n]:
        up = get_updates_since(spec, w, before.get(w, 0), now_pos[w], limit=10 ** 8)
        updates[w] = [list(x) for x in up.updates]
    db = {(w, t) for w, pairs in updates.items() for t, _ in pairs}
    checks = {}
    for name, prog in cluster.progress.items():
        problems = []
        if len(db) != expected:
            problems.append(f"database holds {len(db)} facts, not {expected}")
        if isinstance(prog, Tail):
            got = prog.new_facts()
            dups = len(got) - len(set(got))
            missing = len(db - set(got))
            extra = len(set(got) - db)
            order = 0
            last: dict = {}
            for w, t in got:
                if t < last.get(w, 0):
                    order += 1
                last[w] = max(t, last.get(w, 0))
            if missing:
                problems.append(f"{missing} missing")
            if extra:
                problems.append(f"{extra} unexpected")
        else:
            dups, order = prog.anomalies()
            if prog.poll() != expected + dups + order:
                problems.append(f"{prog.poll()} delivered")
        if dups:
            problems.append(f"{dups} duplicates")
        if order:
            problems.append(f"{order} out of order")
        checks[name] = "ok" if not problems else ", ".join(problems)
    return E2EResult(writes, dict(state["done"]), dict(state["got"]), checks, cpu, busy, wall, catch_ups, updates)


# -- report --------------------------------------------------------------------------------------

def machine_info(pg_url: str, redis_url: str) -> list[str]:
    import django
    import psycopg
    import redis
    from _machine import cpu_description, load_average, server_versions  # benchmarks/ is on sys.path

    v = server_versions(pg_url, redis_url)
    load = load_average()
    return [
        f"machine: {cpu_description()}; {platform.platform()}; load avg {load}",
        f"python {platform.python_version()}, django {django.__version__}, redis-py {redis.__version__} ({v['hiredis']}), "
        f"psycopg {psycopg.__version__}",
        f"servers: redis {v['redis']} (client-output-buffer-limit pubsub 0 0 0); "
        f"{v['postgres']} (fsync={v['fsync']})",
    ]


def cpu_order() -> list[str]:
    """The processes whose CPU is reported, in order (the workers as ``--workers`` names them)."""
    return ["writers", "endpoint", *(name for name, _ in WORKERS), "daphne", "redis", "postgres", "bench"]


IDLE_SECONDS = 3.0


def renice_tree(pid: int, niceness: int, idle: bool = False) -> int:
    """Set every thread of ``pid`` and of its descendants to ``niceness``, or to the
    ``SCHED_IDLE`` policy if ``idle`` (threads they start later inherit it); returns how many
    threads."""
    done, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                if idle:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                else:
                    os.setpriority(os.PRIO_PROCESS, tid, niceness)
                done += 1
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    return done


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Cores each process of the cluster keeps busy while nothing is written."""
    from testing.accounting import all_stats, tree_cpu

    before = all_stats()
    time.sleep(seconds)
    after = all_stats()
    return {name: (tree_cpu(pid, after) - tree_cpu(pid, before)) / seconds for name, pid in pids.items()
            if name != "postgres"}


def replication_price(e2e: "E2EResult") -> dict[str, float]:
    """CPU us/fact that replication costs, per component, from one end-to-end run: the
    writers' streamers (their formatting on the writing thread, their own thread), the
    endpoint, daphne (catch-up), Redis and each worker; and the writers' remaining, database part."""
    facts = e2e.writes.facts
    st = e2e.writes.stats
    us = {k: 1e6 * e2e.cpu.get(k, 0.0) / facts for k in cpu_order()}
    out = {"prepare": 1e6 * st.get("prepare_cpu", 0.0) / facts,
           "streamer_thread": 1e6 * st.get("streamer_cpu", 0.0) / facts}
    out["streamer"] = out["prepare"] + out["streamer_thread"]
    out["writer_db"] = us["writers"] - out["streamer"]
    for k in ("endpoint", "daphne", "redis", *(name for name, _ in WORKERS)):
        out[k] = us[k]
    out["before"] = out["streamer"] + out["endpoint"] + out["daphne"] + out["redis"]
    return out


def chain_figures(writes: WriteResult) -> str:
    """The writers' chain per fact: their writing threads' waits for a core, their database
    backends' CPU and waits for a core (from ``schedstat``: time runnable but not running is
    time the one-batch-at-a-time chain stands still for want of a core)."""
    st, us = writes.stats, 1e6 / writes.facts
    return (f"writing thread waits for a core {us * st.get('thread_wait', 0.0):.1f}, database backend CPU "
            f"{us * st.get('backend_cpu', 0.0):.1f} and waits for a core {us * st.get('backend_wait', 0.0):.1f}")


def parse_workers(text: str) -> list[tuple[str, str]]:
    """``--workers``: names, each beginning with its transport (``tcp2``, ``redis1``), or
    ``none``."""
    if text.strip() == "none":
        return []
    out = []
    for name in (x.strip() for x in text.split(",")):
        transport = "redis" if name.startswith("redis") else "tcp" if name.startswith("tcp") else None
        if transport is None or not name.isalnum():
            raise ValueError(f"worker {name!r}: a name starting with tcp or redis, letters and digits")
        out.append((name, transport))
    if len({n for n, _ in out}) != len(out):
        raise ValueError("worker names repeat")
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a ~60 s run")
    parser.add_argument("--facts", type=int, default=None,
                        help="facts per writer process in each run (default 25000, --quick 3000)")
    parser.add_argument("--writers", default="1,2,4", help="writer process counts (default 1,2,4)")
    parser.add_argument("--sink", choices=("jsonl", "count"), default="count",
                        help="workers: the Python API with a counting callback (default), or manage.py "
                             "replication_worker --jsonl (its per-fact thread hop costs ~5x the rest of the worker)")
    parser.add_argument("--synthetic-in-loop", action="store_true",
                        help="let write_facts make its synthetic rows inside the timed loop (default: made "
                             "beforehand, the same rows)")
    parser.add_argument("--no-dbonly", action="store_true", help="skip the writers-without-Redis runs")
    parser.add_argument("--batch-lines", type=int, default=None,
                        help="raw (b): lines per publisher, batches cycled (default 100000, --quick 20000)")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="run the endpoint and workers under cProfile (main thread) and profile the writers' "
                             "main and streamer threads, writing DIR/*.prof (slows everything down)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, jsonl files)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="end-to-end and raw runs per writer count, the best of each reported "
                             "(default 2, --quick 1)")
    parser.add_argument("--concurrency", type=int, default=1, metavar="C",
                        help="transactions in flight per writer process (write_facts --concurrency C: C threads, "
                             "each on its own connection; default 1)")
    parser.add_argument("--per-txn", type=int, default=PER_TXN,
                        help=f"facts per writer transaction (default {PER_TXN}); also the raw publishers' "
                             "pipeline and the raw (b) batch size")
    parser.add_argument("--workers", default=DEFAULT_WORKERS,
                        help=f"the workers, each name starting with its transport (default {DEFAULT_WORKERS}), or "
                             "'none': the writers with replication on and nobody following (no raw runs); "
                             "the goals are judged only with the default workers")
    parser.add_argument("--followers-nice", default="0", metavar="N|idle",
                        help="run the endpoint, daphne, Redis and the workers at this niceness (1-19), or "
                             "'idle': under SCHED_IDLE (they run only on a core nothing else wants): "
                             "how much of the end-to-end gap is the followers taking the writers' cores")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        WORKERS[:] = parse_workers(args.workers)
    except ValueError as e:
        parser.error(f"--workers: {e}")
    judged = WORKERS == parse_workers(DEFAULT_WORKERS)
    if args.per_txn < 1:
        parser.error("--per-txn must be >= 1")
    followers_idle = args.followers_nice == "idle"
    try:
        args.followers_nice = 0 if followers_idle else int(args.followers_nice)
    except ValueError:
        parser.error("--followers-nice must be 0-19 or 'idle'")
    if not 0 <= args.followers_nice <= 19:
        parser.error("--followers-nice must be 0-19 or 'idle'")
    args.followers_idle = followers_idle
    args.followers_setting = "under SCHED_IDLE" if followers_idle else f"at nice {args.followers_nice}"
    judged = judged and not args.followers_nice and not followers_idle
    globals()["PER_TXN"] = args.per_txn
    os.environ["BENCH_PER_TXN"] = str(args.per_txn)  # for the (spawned) writer processes
    if args.concurrency < 1:
        parser.error("--concurrency must be >= 1")
    os.environ["BENCH_CONCURRENCY"] = str(args.concurrency)
    facts = args.facts or (3000 if args.quick else 25000)
    writer_counts = _ints(args.writers)
    if not writer_counts or max(writer_counts) > len(WRITER_NAMES) or min(writer_counts) < 1:
        parser.error(f"--writers: 1 to {len(WRITER_NAMES)}")
    batch_lines = args.batch_lines or (20000 if args.quick else 100000)
    repeat = args.repeat or (1 if args.quick else 2)

    from benchmarks._setup import migrated_database

    t_begin = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="bench_cluster_"))
    cluster = None
    extra = {"SERVER_NAME": SERVER_NAME, "STREAM_WRITERS": STREAM_WRITERS, "PYTHONUNBUFFERED": "1",
             "LOG_LEVEL": "INFO"}
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        extra["BENCH_PROFILE_DIR"] = os.path.abspath(args.profile)
    servers = contextlib.ExitStack()
    try:
        db = servers.enter_context(migrated_database("bench_cluster", redis=True, env=extra, django_setup=False))
        pg, rs, url = db.pg, db.redis, db.url
        import redis

        r = redis.Redis.from_url(rs.url)
        r.config_set("client-output-buffer-limit", "pubsub 0 0 0")  # never drop a slow subscriber
        r.close()
        env = dict(db.env)
        env.pop("INSTANCE_NAME", None)
        import psycopg

        with psycopg.connect(pg.url("postgres"), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "bench_cluster_dbonly" TEMPLATE "bench_cluster"')
        dbonly_env = {**env, "DATABASE_URL": pg.url("bench_cluster_dbonly"), "REDIS_URL": "", "LOG_LEVEL": "WARNING"}
        _django_setup({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "SERVER_NAME", "STREAM_WRITERS",
                                           "DJANGO_SETTINGS_MODULE")})

        for line in machine_info(url, rs.url):
            print(line)
        ctx = mp.get_context("spawn")
        cluster = Cluster(env, workdir, args.sink, ctx)
        pids = {name: cluster.pid(name) for name in ("endpoint", "daphne", *(w for w, _ in WORKERS))}
        pids["redis"] = rs.proc.pid
        pids["postgres"] = pg.proc.pid
        sink = ("manage.py replication_worker --jsonl (delivery timed by tailing the files)" if args.sink == "jsonl"
                else "Python API (ReplicationWorker / RedisReplicationWorker) with a counting coroutine callback")
        print(f"cluster: 1 endpoint (runreplication), daphne (catch-up), {len(WORKERS)} workers on {STREAM}: "
              + (", ".join(f"{w} over {'TCP' if t == 'tcp' else 'Redis'}" for w, t in WORKERS) or "none")
              + f"; workers: {sink}")
        print(f"writers: write_facts {STREAM} --count {facts} --per-txn {PER_TXN} --concurrency {args.concurrency} "
              f"per process ({args.concurrency} transaction(s) in flight per writer) "
              f"(STREAM_WRITERS={STREAM_WRITERS}), in processes set up and subscribed before a common start; "
              + ("synthetic rows made inside the timed loop" if args.synthetic_in_loop else
                 "its synthetic rows made beforehand (the same rows)"))
        print(f"raw Redis: the same RDATA lines from N redis-py publishers to {len(WORKERS)} redis-py subscribers: (a) one "
              f"PUBLISH per line, {PER_TXN} per pipeline; (b) batched: {PER_TXN} lines per PUBLISH "
              f"(newline-separated), {PER_TXN} PUBLISH per pipeline, subscribers counting the lines")
        print("without replication: the same writer processes with REDIS_URL unset (no streamer), into a copy of "
              "the database on the same server, alternated with the end-to-end runs")
        if args.followers_nice or args.followers_idle:
            followers = [name for name in pids if name != "postgres"]
            threads = sum(renice_tree(pids[name], args.followers_nice, args.followers_idle) for name in followers)
            print(f"followers {args.followers_setting} (a diagnosis, not the product's setting): "
                  f"{', '.join(followers)} ({threads} threads); the writers and PostgreSQL at 0")
        idle = idle_cpu(pids, IDLE_SECONDS)
        print(f"idle cluster, CPU over {IDLE_SECONDS:g} s with nothing written (cores): "
              + ", ".join(f"{k} {v:.3f}" for k, v in idle.items())
              + " (timers, pings and polls: part of each figure below, whatever the rate)")
        print(flush=True)

        from _machine import load_average

        rows = []
        for n in writer_counts:
            label = f"{n} writer{'s' if n > 1 else ' '}"
            for rep in range(repeat):
                tag = f" run {rep + 1}" if repeat > 1 else ""
                load = load_average()
                dbonly = None
                if not args.no_dbonly:
                    _checkpoint(dbonly_env["DATABASE_URL"])
                    dbonly = run_writers(ctx, dbonly_env, n, facts, args.seed + 1000,
                                         pregenerate=not args.synthetic_in_loop)
                    print(f"  {label}{tag} without replication (no Redis, no streamer): {dbonly.write_rate:>9,.0f} "
                          f"facts/s ({dbonly.facts:,} in {dbonly.write_end - dbonly.start:.2f} s; writer CPU "
                          f"{1e6 * dbonly.cpu / dbonly.facts:.1f} us/fact)", flush=True)
                e2e = run_e2e(ctx, cluster, env, url, pids, n, facts, args.seed, timeout=max(120.0, n * facts / 500),
                              pregenerate=not args.synthetic_in_loop)
                w = e2e.writes
                lag = ", ".join(f"{k} +{(t - w.write_end):.2f}" if t is not None else f"{k} never ({e2e.got[k]:,})"
                                for k, t in e2e.done.items())
                if e2e.complete:
                    head = f"{e2e.rate:>9,.0f} facts/s ({w.facts:,} in {e2e.seconds:.2f} s)"
                else:
                    head = f"INCOMPLETE after {time.monotonic() - w.start:.0f} s"
                print(f"  {label}{tag} end to end: {head}; write phase {w.write_rate:,.0f} facts/s "
                      f"({w.write_end - w.start:.2f} s); workers done after the last write: {lag} s", flush=True)
                checks = "; ".join(f"{k} {v}" for k, v in e2e.checks.items())
                st = w.stats
                print(f"      exactly once: {checks}; catch-up requests {e2e.catch_ups}; writers published "
                      f"{st.get('messages', 0):,} channel-layer messages, "
                      f"{st.get('bridge_published', 0):,} Redis lines, "
                      f"dropped {st.get('bridge_dropped', 0):,}")
                per = ", ".join(f"{k} {1e6 * e2e.cpu.get(k, 0.0) / w.facts:.1f}" for k in cpu_order())
                ours = sum(e2e.cpu.get(k, 0.0) for k in cpu_order())
                other = max(0.0, e2e.busy - ours)
                writer_core = e2e.cpu["writers"] / n / (w.closed - w.start)
                print(f"      CPU us/fact: {per}; total {1e6 * ours / w.facts:.0f}; each writer at {writer_core:.2f} "
                      f"cores while it ran; other processes {other / e2e.wall:.2f} cores; machine busy "
                      f"{e2e.busy / e2e.wall:.2f} cores over {e2e.wall:.2f} s", flush=True)
                price = replication_price(e2e)
                workers = ", ".join(f"{k} {price[k]:.1f}" for k, _ in WORKERS)
                print(f"      replication's price, CPU us/fact: writers' streamer {price['streamer']:.1f} (formatting on "
                      f"the writing thread {price['prepare']:.1f}, streamer thread {price['streamer_thread']:.1f}), "
                      f"endpoint {price['endpoint']:.1f}, daphne {price['daphne']:.1f}, redis {price['redis']:.1f}: "
                      f"before workers {price['before']:.1f} (goal <= {GOAL_BEFORE_WORKERS_US:g}); each worker: "
                      f"{workers} (goal <= {GOAL_PER_WORKER_US:g})", flush=True)
                if dbonly is not None:
                    print(f"      writers' database part {price['writer_db']:.1f} us/fact (with no replication at all: "
                          f"{1e6 * dbonly.cpu / dbonly.facts:.1f})")
                print(f"      writers' chain, us/fact: {chain_figures(w)}"
                      + (f" (with no replication at all: {chain_figures(dbonly)})" if dbonly is not None else ""))

                if not WORKERS:  # no subscribers for the raw runs either
                    rows.append((n, rep, load, e2e, dbonly, None, None, price,
                                 all(v == "ok" for v in e2e.checks.values())))
                    continue
                lines = raw_payloads(e2e.updates)
                per_pub = [lines[wn] for wn in WRITER_NAMES[:n]]
                raw_a = run_raw(ctx, rs.url, rs.proc.pid, per_pub, False, workdir, f"a{n}-{rep}")
                raw_cpu = raw_a.pub_cpu + raw_a.sub_cpu + raw_a.redis_cpu
                print(f"  {label}{tag} raw Redis (a) per fact: {raw_a.rate:>9,.0f} facts/s "
                      f"({raw_a.facts:,} PUBLISH x {len(WORKERS)} subscribers in {raw_a.seconds:.2f} s; CPU us/fact: publishers "
                      f"{1e6 * raw_a.pub_cpu / raw_a.facts:.1f}, subscribers {1e6 * raw_a.sub_cpu / raw_a.facts:.1f}, "
                      f"redis {1e6 * raw_a.redis_cpu / raw_a.facts:.1f}; total {1e6 * raw_cpu / raw_a.facts:.0f})",
                      flush=True)
                per_pub_b = [batch_messages(lines[wn], batch_lines) for wn in WRITER_NAMES[:n]]
                raw_b = run_raw(ctx, rs.url, rs.proc.pid, per_pub_b, True, workdir, f"b{n}-{rep}")
                raw_cpu = raw_b.pub_cpu + raw_b.sub_cpu + raw_b.redis_cpu
                print(f"  {label}{tag} raw Redis (b) batched: {raw_b.rate:>9,.0f} facts/s ({raw_b.facts:,} lines in "
                      f"{raw_b.messages:,} PUBLISH x {len(WORKERS)} subscribers in {raw_b.seconds:.2f} s; "
                      "CPU us/fact: publishers "
                      f"{1e6 * raw_b.pub_cpu / raw_b.facts:.2f}, subscribers {1e6 * raw_b.sub_cpu / raw_b.facts:.2f}, "
                      f"redis {1e6 * raw_b.redis_cpu / raw_b.facts:.2f}; total {1e6 * raw_cpu / raw_b.facts:.1f})",
                      flush=True)
                ok = all(v == "ok" for v in e2e.checks.values())
                rows.append((n, rep, load, e2e, dbonly, raw_a, raw_b, price, ok))
            print(flush=True)

        header = (f"{'writers':<8}{'load avg':>16}{'e2e facts/s':>13}{'no repl.':>10}{'ratio':>7}{'raw (a)':>10}"
                  f"{'ratio':>7}{'raw (b)':>10}{'ratio':>7}{'before workers':>16}{'per worker':>12}{'others':>8}")
        print(header)
        print("-" * len(header))
        goal = {"e2e": True, "before": True, "worker": True}
        for n, _rep, load, e2e, dbonly, raw_a, raw_b, price, ok in rows:
            vs_db = e2e.rate / dbonly.write_rate if dbonly else float("nan")
            worst = max((price[k] for k, _ in WORKERS), default=0.0)
            if n == 1:
                goal["e2e"] &= vs_db >= GOAL_E2E_VS_WRITER and ok
            goal["before"] &= price["before"] <= GOAL_BEFORE_WORKERS_US
            goal["worker"] &= worst <= GOAL_PER_WORKER_US
            ours = sum(e2e.cpu.get(k, 0.0) for k in cpu_order())
            others = max(0.0, e2e.busy - ours) / e2e.wall
            raw = (f"{raw_a.rate:>10,.0f}{e2e.rate / raw_a.rate:>7.2f}{raw_b.rate:>10,.0f}{e2e.rate / raw_b.rate:>7.2f}"
                   if raw_a is not None and raw_b is not None else f"{'-':>10}{'-':>7}{'-':>10}{'-':>7}")
            print(f"{n:<8}{load:>16}{e2e.rate:>13,.0f}{dbonly.write_rate if dbonly else float('nan'):>10,.0f}"
                  f"{vs_db:>7.2f}{raw}{price['before']:>16.1f}{worst:>12.1f}{others:>8.2f}"
                  f"{'' if ok else '  (NOT exactly once)'}")
        print("(each run: the writers without replication, then end to end, then raw (a) and (b), one after the other; "
              "ratios are end to end over the others of the same run; before workers: CPU us/fact of the writers' "
              "streamers, the endpoint, daphne and Redis; per worker: the costliest worker; others: cores "
              "busy with processes not ours during the end-to-end run)")
        print()
        if not judged:
            print(f"goals: not judged (workers {args.workers}, followers {args.followers_setting}; "
                  f"the goals are for {DEFAULT_WORKERS} at nice 0)")
            goal = {}
        if goal:
            print(f"goal: 1-writer end to end >= {GOAL_E2E_VS_WRITER} of the same writer without replication, "
                  f"exactly once: {'met' if goal['e2e'] else 'NOT met'}")
            print(f"goal: replication <= {GOAL_BEFORE_WORKERS_US:g} us/fact before workers: "
                  f"{'met' if goal['before'] else 'NOT met'}; <= {GOAL_PER_WORKER_US:g} us/fact per worker: "
                  f"{'met' if goal['worker'] else 'NOT met'}")
        print(f"total time {time.monotonic() - t_begin:.0f} s")
    finally:
        if cluster is not None:
            cluster.stop()
        servers.close()
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

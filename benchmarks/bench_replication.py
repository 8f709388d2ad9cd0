"""Replication endpoint throughput and latency, against a bare asyncio ceiling.

    .venv/bin/python benchmarks/bench_replication.py [--quick] [--lines N1,N10] [--batch B]
                     [--repeat R] [--seconds S] [--profile-endpoint DIR]

Starts a throwaway PostgreSQL (``PostgresServer(fast=True)``: the database is not what is
measured here; commit-to-worker starts after the commit) and a throwaway Redis, migrates a fresh
database, then measures on those servers:

* **throughput, ours**: RDATA lines/s delivered to 1 and to 10 workers through the replication
  endpoint (``manage.py runreplication``, a fresh process for every run). A *feeder* process
  publishes pre-built line batches the way writers do: one ``replication.lines`` message per
  batch (``line_batch.build_lines`` output for ``B`` receipts rows, ~340 bytes a line) on the group
  ``replication.lines`` of ``channels_redis.pubsub.RedisPubSubChannelLayer``, serialized by the
  layer and sent as one PUBLISH by ``GroupPublisher`` (as a writer's streamer sends it). Its writer
  (``receipts``/``bench``) is unknown to the fresh endpoint, so a first one-fact message primes
  the relay (which answers it with a POSITION, not counted); the timed messages follow with
  contiguous ``prev``/``new``. 200 distinct batches are built and cycled (the endpoint never
  parses the lines it relays; only the messages' ``prev``/``new`` must be contiguous). The feeder
  keeps at most ``--window`` lines in flight beyond what the slowest worker has counted (shared
  memory), so neither Redis nor the endpoint's 10,000-command congestion limit drops anything;
  the pipeline runs at the speed of its slowest stage.
* **throughput, ceiling**: a bare asyncio server (``asyncio.Protocol``, in a process of its own)
  that sends ``SERVER``/``PING``, waits for ``REPLICATE``, answers one POSITION and, once every
  worker replicates, pushes the very same batches in the same order, each batch as one
  ``write()`` per connection, waiting for ``resume_writing`` while a transport is paused.

  Both use the same workers: line-counting clients, one process each (plain sockets): handshake
  (``NAME``, ``PING 1``, ``REPLICATE ``), then count lines starting with ``RDATA`` until ``N``
  (sending a PING every 5 s, as workers do).
  The clock runs from the first RDATA any worker receives to the last worker's ``N``-th
  (CLOCK_MONOTONIC, shared by all processes). Reported: lines/s in total (``N`` x workers /
  elapsed) and per worker, CPU per delivered line of the server process (and, for ours, of the
  feeder and of redis-server), and ours / ceiling.
* **latency**: commit-to-worker at a fixed write rate (``--rate``, 1,000 facts/s; one fact per
  transaction): a real writer process (Django, ``REDIS_URL`` set, so ``runtime()`` attaches the
  ReplicationStreamer) appends ``Receipt`` facts whose ``data`` is ``{"ts": time.time_ns(), ...}``
  taken just before ``append`` (pre-commit) and records, per stream ID, the time right after
  ``append`` returned (commit done). Workers timestamp every RDATA as it arrives and parse the
  row's ``ts``; joined by stream ID afterwards. Reported: commit-to-worker p50/p99/max,
  send-to-worker (from the ``ts`` in the row) and the duration of ``append`` itself.

Goals: ours/ceiling >= 0.7 with 1 worker, >= 0.9 with more; commit-to-worker p99 <= 10 ms.
Every process shares the machine's cores (2 here): the workers' own CPU weighs on every figure,
the same way for ours and the ceiling. ``BENCH_ENDPOINT_WRAPPER=script.py`` runs that script
instead of ``manage.py`` for the endpoint (to try a patched endpoint without editing the
project). Exit status 0 whether or not the goals are met.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import os
import pickle
import platform
import queue as queue_mod
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from testing.accounting import cpu_seconds, minor_faults  # noqa: E402

SERVER_NAME = "bench.example"
STREAM = "receipts"
BENCH_WRITER = "bench"          # the feeder's writer name: unknown to the endpoint, primed first
LATENCY_WRITER = "latw"         # the real writer of the latency runs
STREAM_WRITERS = f"{STREAM}=master,{LATENCY_WRITER}"
UNIQUE_BATCHES = 200            # distinct pre-built batches, cycled
GOAL_RATIO = {1: 0.7}  # ours/ceiling by workers; GOAL_RATIO_MANY with more than one
GOAL_RATIO_MANY = 0.9
GOAL_P99_MS = 10.0
PING_SECONDS = 5.0              # workers PING this often (Synapse's PING_TIME)
DRAIN_SECONDS = 30.0            # latency: how long after the last write a fact may still arrive


def _django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
    import django

    django.setup()


# -- the lines -------------------------------------------------------------------------------

def build_batches(n_batches: int, batch: int, path: str) -> dict:
    """Pre-build the priming message and ``n_batches`` batches of ``batch`` RDATA lines (tokens
    2 ... n_batches * batch + 1, exactly as ``ReplicationStreamer`` builds them); save to ``path``."""
    import random

    _django_setup()
    from replication.protocol.line_batch import build_lines
    from streams.models import Receipt
    from streams.registry import get_stream

    table = get_stream(STREAM).tables[0]
    rng = random.Random(7)
    rows = []
    for n in range(2000):  # distinct rows, cycled (Receipt.synthetic's padding is slow to make)
        values = Receipt.synthetic(rng, n)
        rows.append(table.to_wire([values[f] for f in table.fields]))

    def lines(prev: int, new: int) -> tuple[bytes, int]:
        facts = [(token, [rows[token % len(rows)]]) for token in range(prev + 1, new + 1)]
        text = build_lines(STREAM, BENCH_WRITER, prev, new, facts)
        return ("\n".join(text) + "\n").encode(), len(text)

    prime = lines(0, 1)
    batches = [lines(1 + i * batch, 1 + (i + 1) * batch) for i in range(n_batches)]
    with open(path, "wb") as f:
        pickle.dump({"prime": prime, "batches": batches, "batch": batch}, f, protocol=pickle.HIGHEST_PROTOCOL)
    return {"line_bytes": statistics.mean(len(d) / c for d, c in batches),
            "example": batches[0][0].split(b"\n", 1)[0].decode()}


def _load_batches(path: str) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


# -- the workers (line-counting clients) -----------------------------------------------------

def _handshake(port: int, name: str) -> tuple[socket.socket, bytes]:
    """Connect, read SERVER and PING, send NAME/PING/REPLICATE, wait for the first POSITION.
    Returns the socket and the bytes received after that POSITION line."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    buf = b""
    seen: set[bytes] = set()
    while not {b"SERVER", b"PING"} <= seen:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        buf += chunk
        *lines, buf = buf.split(b"\n")
        seen.update(line.split(b" ", 1)[0] for line in lines)
    sock.sendall(f"NAME {name}\nPING 1\nREPLICATE \n".encode())
    while True:
        idx = buf.find(b"POSITION ")
        if idx >= 0 and (idx == 0 or buf[idx - 1:idx] == b"\n"):
            end = buf.find(b"\n", idx)
            if end >= 0:
                return sock, buf[end + 1:]
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before answering REPLICATE")
        buf += chunk


def _count_client(port: int, index: int, n: int, counts, ready, results) -> None:
    """Count RDATA lines until ``n``; report (index, first, last, count, error)."""
    try:
        sock, buf = _handshake(port, f"bench-{index}")
        sock.settimeout(120)
        ready.put(index)
        count = 0
        first = last = None
        recv = sock.recv
        monotonic = time.monotonic
        pinged = monotonic()
        chunk = b""
        while count < n:
            previous, chunk = chunk, recv(1 << 18)
            if not chunk:
                tail = previous + buf
                i = tail.find(b"ERROR ")
                why = ": " + tail[i:tail.find(b"\n", i)].decode() if i >= 0 else ""
                raise ConnectionError(f"closed after {count} RDATA lines{why}")
            buf += chunk
            cut = buf.rfind(b"\n") + 1
            if not cut:
                continue
            got = buf.count(b"\nRDATA ", 0, cut) + buf.startswith(b"RDATA ")
            now = monotonic()
            if now - pinged >= PING_SECONDS:  # as workers do: the endpoint drops a silent peer after 25 s
                sock.sendall(f"PING {int(time.time() * 1000)}\n".encode())
                pinged = now
            if got:
                if first is None:
                    first = now
                count += got
                last = now
                counts[index] = count
            elif buf.startswith(b"ERROR ") or buf.find(b"\nERROR ", 0, cut) >= 0:
                i = buf.find(b"ERROR ")
                raise ConnectionError(buf[i:buf.find(b"\n", i)].decode())
            buf = buf[cut:]
        sock.close()
        results.put((index, first, last, count, None))
    except BaseException as e:
        counts[index] = 1 << 60  # never hold the feeder back
        results.put((index, None, None, 0, f"{type(e).__name__}: {e}"))


def _latency_client(port: int, index: int, last_token, stop, ready, results) -> None:
    """Record (stream ID, arrival ns, arrival - ts of the row) for every RDATA of the latency
    writer, until the last stream ID written (``last_token``, once known) arrived or ``stop``."""
    import json

    try:
        sock, buf = _handshake(port, f"lat-{index}")
        sock.settimeout(0.1)
        ready.put(index)
        prefix = f"RDATA {STREAM} {LATENCY_WRITER} ".encode()
        records: list[tuple[int, int, int]] = []
        highest = 0
        pinged = time.monotonic()
        while not stop.is_set() and not (last_token.value and highest >= last_token.value):
            if time.monotonic() - pinged >= PING_SECONDS:
                sock.sendall(f"PING {int(time.time() * 1000)}\n".encode())
                pinged = time.monotonic()
            try:
                chunk = sock.recv(1 << 18)
            except socket.timeout:
                continue
            now = time.time_ns()
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.startswith(prefix):
                    _, _, _, token, row = line.split(b" ", 4)
                    token = int(token)
                    ts = json.loads(row)[5]["ts"]  # Receipt wire row: [..., data]
                    records.append((token, now, now - ts))
                    highest = max(highest, token)
                elif line.startswith(b"ERROR "):
                    raise ConnectionError(line.decode())
        sock.close()
        results.put((index, records, None))
    except BaseException as e:
        results.put((index, [], f"{type(e).__name__}: {e}"))


# -- the feeder (publishes like a writer) ----------------------------------------------------

def _feeder(redis_url: str, path: str, n_messages: int, window: int, counts, loaded, go, results) -> None:
    try:
        from channels_redis.pubsub import RedisPubSubChannelLayer

        data = _load_batches(path)
        batches, batch = data["batches"], data["batch"]
        layer = RedisPubSubChannelLayer(hosts=[redis_url])

        from replication.protocol.line_batch import counts_of

        # commands per name of each payload, as the writer's streamer sends them
        kinds = {payload: counts_of(payload.decode().splitlines()) for payload, _ in [*batches, data["prime"]]}

        def message(prev: int, new: int, payload: bytes, count: int) -> dict:
            return {"type": "replication.lines", "stream": STREAM, "writer": BENCH_WRITER,
                    "prev": prev, "new": new, "data": payload, "count": count, "counts": kinds[payload]}

        async def run() -> float:
            from replication.publish.layer_publish import GroupPublisher

            # As a writer's streamer publishes: the layer's serializer, one PUBLISH on the
            # group's channel over a RESP connection of its own (layer_publish.py).
            publisher = GroupPublisher.for_layer(layer, "replication.lines")
            assert publisher is not None, "the benchmark's layer is channels-redis pub/sub on a plain URL"
            loaded.set()
            while not go.wait(0.01):
                await asyncio.sleep(0)
            c0 = time.process_time()
            await publisher.send(message(0, 1, *data["prime"]))
            sent = 0
            for i in range(n_messages):
                payload, count = batches[i % len(batches)]
                while sent + count - min(counts) > window:
                    await asyncio.sleep(0.001)  # a batch in flight takes about that long at 1M lines/s
                prev = 1 + i * batch
                await publisher.send(message(prev, prev + count, payload, count))
                sent += count
            cpu = time.process_time() - c0
            await publisher.close()
            return cpu

        cpu = asyncio.run(run())
        results.put(("feeder", cpu, None))
    except BaseException as e:
        loaded.set()
        results.put(("feeder", 0.0, f"{type(e).__name__}: {e}"))


# -- the ceiling: a bare asyncio server pushing the same batches -----------------------------

def _ceiling_server(port: int, path: str, n_messages: int, nclients: int, listening, results) -> None:
    try:
        batches = [d for d, _ in _load_batches(path)["batches"]]

        async def main() -> None:
            loop = asyncio.get_running_loop()
            replicating: list[Conn] = []
            everyone = loop.create_future()

            class Conn(asyncio.Protocol):
                def connection_made(self, transport):
                    self.transport = transport
                    self.buf = b""
                    self.replicating = False
                    self.waiter = None
                    transport.write(f"SERVER {SERVER_NAME}\nPING {int(time.time() * 1000)}\n".encode())

                def data_received(self, data):
                    if self.replicating:
                        return
                    self.buf += data
                    if b"REPLICATE " in self.buf:
                        self.replicating = True
                        self.transport.write(f"POSITION {STREAM} {BENCH_WRITER} 1 1\n".encode())
                        replicating.append(self)
                        if len(replicating) == nclients and not everyone.done():
                            everyone.set_result(None)

                def pause_writing(self):
                    self.waiter = loop.create_future()

                def resume_writing(self):
                    if self.waiter is not None and not self.waiter.done():
                        self.waiter.set_result(None)
                    self.waiter = None

                def connection_lost(self, exc):
                    self.resume_writing()

            server = await loop.create_server(Conn, "127.0.0.1", port)
            listening.set()
            await everyone
            c0 = time.process_time()
            conns = list(replicating)
            for i in range(n_messages):
                data = batches[i % len(batches)]
                for c in conns:
                    c.transport.write(data)
                for c in conns:
                    if c.waiter is not None:
                        await c.waiter
            for c in conns:
                while c.transport.get_write_buffer_size() and not c.transport.is_closing():
                    await asyncio.sleep(0.001)
            results.put(("ceiling", time.process_time() - c0, None))
            await asyncio.sleep(0.2)
            server.close()

        asyncio.run(main())
    except BaseException as e:
        listening.set()
        results.put(("ceiling", 0.0, f"{type(e).__name__}: {e}"))


# -- the latency writer ------------------------------------------------------------------------

def _latency_writer(env: dict, rate: float, seconds: float, warmup: int, results) -> None:
    try:
        os.environ.update(env)
        _django_setup()
        import random

        from streams.models import Receipt
        from streams.runtime import runtime

        rt = runtime()
        writer = rt.writer(STREAM)
        rng = random.Random(11)
        templates = [Receipt.synthetic(rng, n) for n in range(200)]
        n_timed = int(rate * seconds)
        records: list[tuple[int, int, int]] = []
        results.put(("started",))
        start = time.monotonic()
        for i in range(warmup + n_timed):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            values = dict(templates[i % len(templates)])
            pre = time.time_ns()
            values["data"] = {"ts": pre, "pad": templates[i % len(templates)]["data"]["pad"]}
            ids = writer.append([[(Receipt, values)]])
            post = time.time_ns()
            if i >= warmup:
                records.append((ids[0], pre, post))
        elapsed = time.monotonic() - start
        rt.close()
        results.put(("writer", records, (warmup + n_timed) / elapsed, None))
    except BaseException as e:
        import traceback

        results.put(("writer", [], 0.0, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


# -- the endpoint ------------------------------------------------------------------------------

class EndpointProcess:
    def __init__(self, env: dict, workdir: str, label: str, profile_dir: str | None) -> None:
        from testing.services import free_port

        self.port = free_port()
        self.log_path = os.path.join(workdir, f"endpoint-{label}.log")
        self.log = open(self.log_path, "w+")
        cmd = [sys.executable]
        if profile_dir:
            cmd += ["-m", "cProfile", "-o", os.path.join(profile_dir, f"endpoint-{label}.prof")]
        script = os.environ.get("BENCH_ENDPOINT_WRAPPER") or str(ROOT / "manage.py")
        cmd += [script, "runreplication", "--listen", f"127.0.0.1:{self.port}"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"endpoint did not start:\n{self.tail()}") from None
                time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, n: int = 30) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return "".join(f.readlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# -- throughput runs ---------------------------------------------------------------------------

@dataclass
class ThroughputResult:
    kind: str
    clients: int
    lines: int          # RDATA lines delivered, all workers together
    seconds: float
    server_cpu: float   # CPU seconds of the endpoint / ceiling process during the run
    spread: float       # last worker done - first worker done (s)
    feeder_cpu: float = float("nan")  # ours: CPU seconds of the feeder (publishing)
    redis_cpu: float = float("nan")   # ours: CPU seconds of redis-server
    faults_per_batch: float = float("nan")  # ours: the endpoint's minor page faults per batch

    @property
    def rate(self) -> float:
        return self.lines / self.seconds if self.seconds > 0 else 0.0

    def us_per_line(self, cpu: float) -> float:
        return 1e6 * cpu / self.lines if self.lines else float("nan")


def _start_clients(ctx, port: int, nclients: int, n: int, counts, timeout: float = 60):
    ready, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_count_client, args=(port, i, n, counts, ready, results), daemon=True)
             for i in range(nclients)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=timeout)
    return procs, results


def _collect(procs, results, nclients: int, timeout: float) -> list:
    out = [results.get(timeout=timeout) for _ in range(nclients)]
    for p in procs:
        p.join(timeout=10)
    return out


def _summarise(kind: str, nclients: int, res: list, cpu: float) -> ThroughputResult:
    errors = [r[4] for r in res if r[4]]
    if errors:
        raise RuntimeError(f"{kind}: worker failed: {errors[0]}")
    finished = [r[2] for r in res]
    return ThroughputResult(kind, nclients, sum(r[3] for r in res), max(finished) - min(r[1] for r in res),
                            cpu, max(finished) - min(finished))


def run_ours(ctx, env, workdir, path, n_messages, batch, nclients, window, label, profile_dir,
             redis_pid) -> ThroughputResult:
    ep = EndpointProcess(env, workdir, label, profile_dir)
    try:
        counts = ctx.RawArray("q", nclients)
        loaded, go, fresults = ctx.Event(), ctx.Event(), ctx.Queue()
        feeder = ctx.Process(target=_feeder, args=(env["REDIS_URL"], path, n_messages, window, counts,
                                                   loaded, go, fresults), daemon=True)
        feeder.start()
        procs, results = _start_clients(ctx, ep.port, nclients, n_messages * batch, counts)
        loaded.wait(60)
        cpu0, rcpu0, faults0 = cpu_seconds(ep.pid), cpu_seconds(redis_pid), minor_faults(ep.pid)
        go.set()
        try:
            res = _collect(procs, results, nclients, timeout=300)
        finally:
            cpu1, rcpu1, faults1 = cpu_seconds(ep.pid), cpu_seconds(redis_pid), minor_faults(ep.pid)
            fr = fresults.get(timeout=60)
            feeder.join(timeout=10)
        if fr[2]:
            raise RuntimeError(f"feeder failed: {fr[2]}")
        try:
            result = _summarise("ours", nclients, res, cpu1 - cpu0)
        except RuntimeError as e:
            raise RuntimeError(f"{e}\nendpoint log:\n{ep.tail()}") from None
        result.feeder_cpu, result.redis_cpu = fr[1], rcpu1 - rcpu0
        if faults0 is not None and faults1 is not None:
            result.faults_per_batch = (faults1 - faults0) / n_messages
        return result
    finally:
        ep.stop()


def run_ceiling(ctx, path, n_messages, batch, nclients) -> ThroughputResult:
    from testing.services import free_port

    port = free_port()
    listening, sresults = ctx.Event(), ctx.Queue()
    server = ctx.Process(target=_ceiling_server, args=(port, path, n_messages, nclients, listening, sresults),
                         daemon=True)
    server.start()
    try:
        listening.wait(60)
        counts = ctx.RawArray("q", nclients)
        procs, results = _start_clients(ctx, port, nclients, n_messages * batch, counts)
        res = _collect(procs, results, nclients, timeout=300)
        sr = sresults.get(timeout=60)
        if sr[2]:
            raise RuntimeError(f"ceiling server failed: {sr[2]}")
        return _summarise("ceiling", nclients, res, sr[1])
    finally:
        server.join(timeout=10)
        if server.is_alive():
            server.kill()


# -- latency runs ------------------------------------------------------------------------------

@dataclass
class LatencyResult:
    clients: int
    facts: int
    rate: float              # achieved write rate (facts/s)
    commit: list[float]      # ms, commit done -> worker, one per (fact, worker)
    send: list[float]        # ms, before append -> worker
    write: list[float]       # ms, duration of append
    missing: int             # (fact, worker) pairs not delivered within DRAIN_SECONDS
    endpoint_cpu: float      # CPU seconds of the endpoint, from the first write to the last delivery
    seconds: float           # wall time of that same span


def run_latency(ctx, env, workdir, nclients, rate, seconds, label, profile_dir) -> LatencyResult:
    ep = EndpointProcess(env, workdir, label, profile_dir)
    try:
        stop, ready, results = ctx.Event(), ctx.Queue(), ctx.Queue()
        last_token = ctx.RawValue("q", 0)
        procs = [ctx.Process(target=_latency_client, args=(ep.port, i, last_token, stop, ready, results),
                             daemon=True) for i in range(nclients)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=60)
        wresults = ctx.Queue()
        wenv = {**env, "INSTANCE_NAME": LATENCY_WRITER}
        warmup = int(rate * 0.5)
        writer = ctx.Process(target=_latency_writer, args=(wenv, rate, seconds, warmup, wresults), daemon=True)
        writer.start()
        first = wresults.get(timeout=120)
        if first[0] != "started":
            raise RuntimeError(f"latency writer failed: {first[3]}")
        t0, cpu0 = time.monotonic(), cpu_seconds(ep.pid)
        wr = wresults.get(timeout=seconds * 5 + 60)
        writer.join(timeout=30)
        if wr[3]:
            raise RuntimeError(f"latency writer failed: {wr[3]}")
        last_token.value = max((r[0] for r in wr[1]), default=0)
        # Until every worker has the last fact, or DRAIN_SECONDS: what has not arrived is missing.
        res = []
        deadline = time.monotonic() + DRAIN_SECONDS
        while len(res) < nclients:
            try:
                res.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue_mod.Empty:
                stop.set()
                if time.monotonic() > deadline + 30:
                    raise RuntimeError("latency workers did not report") from None
        t1, cpu1 = time.monotonic(), cpu_seconds(ep.pid)
        for p in procs:
            p.join(timeout=10)
        errors = [r[2] for r in res if r[2]]
        if errors:
            raise RuntimeError(f"latency worker failed: {errors[0]}\nendpoint log:\n{ep.tail()}")
        commits = {token: (pre, post) for token, pre, post in wr[1]}
        commit_ms, send_ms, missing = [], [], 0
        for _, records, _ in res:
            seen = {token: (arrival, since_ts) for token, arrival, since_ts in records if token in commits}
            missing += len(commits) - len(seen)
            for token, (arrival, since_ts) in seen.items():
                commit_ms.append((arrival - commits[token][1]) / 1e6)
                send_ms.append(since_ts / 1e6)
        write_ms = [(post - pre) / 1e6 for pre, post in commits.values()]
        return LatencyResult(nclients, len(commits), wr[2], commit_ms, send_ms, write_ms, missing,
                             cpu1 - cpu0, t1 - t0)
    finally:
        ep.stop()


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(len(s) * p / 100) - 1))]


# -- machine info ------------------------------------------------------------------------------

def machine_info(pg_url: str, redis_url: str) -> list[str]:
    import channels
    import channels_redis
    import django
    import psycopg
    import redis
    from _machine import cpu_description, load_average, server_versions  # benchmarks/ is on sys.path

    v = server_versions(pg_url, redis_url)
    load = load_average()
    return [
        f"machine: {cpu_description()}; {platform.platform()}; load avg {load}",
        f"python {platform.python_version()}, django {django.__version__}, channels {channels.__version__}, "
        f"channels_redis {channels_redis.__version__}, redis-py {redis.__version__} ({v['hiredis']}), "
        f"psycopg {psycopg.__version__}",
        f"servers: redis {v['redis']}; {v['postgres']} (fsync={v['fsync']})",
    ]


# -- main --------------------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a ~40 s run")
    parser.add_argument("--workers", default="1,10", help="worker counts for throughput (default 1,10)")
    parser.add_argument("--lines", default=None,
                        help="RDATA lines per worker in each throughput run, one figure per --workers entry "
                             "(default 3000000,600000; --quick 500000,100000)")
    parser.add_argument("--batch", type=int, default=1000,
                        help="lines per channel-layer message and per write() (default 1000)")
    parser.add_argument("--window", type=int, default=10_000,
                        help="most lines the feeder keeps in flight beyond the slowest worker (default 10000: "
                             "the endpoint drops a worker more than 10,000 commands behind)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="throughput runs per case and server, alternating; best reported (default 3, --quick 1)")
    parser.add_argument("--rate", type=float, default=1000.0, help="latency: facts/s (default 1000)")
    parser.add_argument("--seconds", type=float, default=None, help="latency: seconds per run (default 10, --quick 4)")
    parser.add_argument("--latency-workers", default=None, help="latency: worker counts (default 1,10; --quick 1)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--profile-endpoint", metavar="DIR", default=None,
                        help="run every endpoint under cProfile, writing DIR/endpoint-<run>.prof (slows it down)")
    args = parser.parse_args(argv)
    workers = _ints(args.workers)
    lines = _ints(args.lines or ("500000,100000" if args.quick else "3000000,600000"))
    if len(lines) < len(workers):
        lines += [lines[-1]] * (len(workers) - len(lines))
    repeat = args.repeat or (1 if args.quick else 3)
    seconds = args.seconds or (4.0 if args.quick else 10.0)
    lat_workers = _ints(args.latency_workers or ("1" if args.quick else "1,10"))
    if args.window < args.batch:
        parser.error("--window must be at least --batch")
    if args.profile_endpoint:
        os.makedirs(args.profile_endpoint, exist_ok=True)
        args.profile_endpoint = os.path.abspath(args.profile_endpoint)

    from benchmarks._setup import migrated_database

    t_begin = time.monotonic()
    # Django is set up in the spawned processes, not here.
    with tempfile.TemporaryDirectory(prefix="bench_replication_") as workdir, \
            migrated_database("bench_replication", fast=True, redis=True, django_setup=False,
                              env={"SERVER_NAME": SERVER_NAME, "STREAM_WRITERS": STREAM_WRITERS}) as db:
        url, rs = db.url, db.redis
        import redis

        r = redis.Redis.from_url(rs.url)
        r.config_set("client-output-buffer-limit", "pubsub 0 0 0")  # never drop a slow subscriber
        r.close()
        env = {**db.env, "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING"}

        for line in machine_info(url, rs.url):
            print(line)
        if os.environ.get("BENCH_ENDPOINT_WRAPPER"):
            print(f"endpoint: {os.environ['BENCH_ENDPOINT_WRAPPER']} (BENCH_ENDPOINT_WRAPPER)")
        ctx = mp.get_context("spawn")
        rows = []
        if not args.skip_throughput:
            path = os.path.join(workdir, "batches.pickle")
            n_messages = {k: -(-n // args.batch) for k, n in zip(workers, lines)}
            info = build_batches(min(UNIQUE_BATCHES, max(n_messages.values())), args.batch, path)
            print(f"throughput: {args.batch} lines per message / write(), ~{info['line_bytes']:.0f} bytes a line "
                  f"({UNIQUE_BATCHES} distinct batches, cycled), window {args.window} lines; "
                  f"best of {repeat} run(s), alternating")
            print(f"  e.g. {info['example'][:110]}...")
            print(flush=True)
            for k in workers:
                best: dict[str, ThroughputResult | None] = {"ours": None, "ceiling": None}
                for rep in range(repeat):
                    for kind in (("ours", "ceiling") if rep % 2 == 0 else ("ceiling", "ours")):
                        if kind == "ours":
                            res = run_ours(ctx, env, workdir, path, n_messages[k], args.batch, k, args.window,
                                           f"tp{k}-{rep}", args.profile_endpoint, rs.proc.pid)
                        else:
                            res = run_ceiling(ctx, path, n_messages[k], args.batch, k)
                        if best[kind] is None or res.rate > best[kind].rate:
                            best[kind] = res
                        extra = (f", feeder {res.us_per_line(res.feeder_cpu):.2f}, redis "
                                 f"{res.us_per_line(res.redis_cpu):.2f}; endpoint page faults per batch "
                                 f"{res.faults_per_batch:.0f}" if kind == "ours" else "")
                        print(f"  {k:>2} worker{'s' if k > 1 else ' '} {kind:<8}{res.rate:>11,.0f} lines/s  "
                              f"({res.lines:,} in {res.seconds:.2f} s; CPU us/line: server "
                              f"{res.us_per_line(res.server_cpu):.2f}{extra}; last worker "
                              f"+{res.spread * 1000:.0f} ms)", flush=True)
                rows.append((k, best["ours"], best["ceiling"]))

        lat_rows = []
        if not args.skip_latency:
            print()
            print(f"latency: a writer process appends 1 receipt per transaction at {args.rate:.0f} facts/s for "
                  f"{seconds:.0f} s (after 0.5 s of warm-up), published through Redis, relayed by the endpoint",
                  flush=True)
            for k in lat_workers:
                lr = run_latency(ctx, env, workdir, k, args.rate, seconds, f"lat{k}", args.profile_endpoint)
                lat_rows.append(lr)
                print(f"  {k:>2} worker{'s' if k > 1 else ' '}: {lr.facts} facts, written at {lr.rate:.0f}/s; "
                      f"commit-to-worker p50 {pct(lr.commit, 50):.2f} ms, p99 {pct(lr.commit, 99):.2f} ms, "
                      f"max {max(lr.commit, default=float('nan')):.2f} ms; not delivered {lr.missing}",
                      flush=True)

        print()
        goal_tp = goal_lat = True
        if rows:
            header = (f"{'workers':<9}{'ours lines/s':>14}{'ceiling lines/s':>17}{'ratio':>7}"
                      f"{'ours/worker':>13}{'ceiling/worker':>16}{'CPU us/line: endpoint':>23}{'ceiling':>9}")
            print(header)
            print("-" * len(header))
            for k, ours, ceil in rows:
                ratio = ours.rate / ceil.rate if ceil.rate else 0.0
                goal_tp &= ratio >= GOAL_RATIO.get(k, GOAL_RATIO_MANY)
                print(f"{k:<9}{ours.rate:>14,.0f}{ceil.rate:>17,.0f}{ratio:>7.2f}{ours.rate / k:>13,.0f}"
                      f"{ceil.rate / k:>16,.0f}{ours.us_per_line(ours.server_cpu):>23.2f}"
                      f"{ceil.us_per_line(ceil.server_cpu):>9.2f}")
            print("(lines/s: all workers together; CPU: of the server process per delivered line)")
            print()
        if lat_rows:
            header = (f"{'latency, ms':<13}{'commit->worker p50':>19}{'p99':>8}{'max':>8}"
                      f"{'send->worker p50':>18}{'p99':>8}{'append() p50':>14}{'p99':>8}"
                      f"{'write rate':>12}{'endpoint CPU':>14}")
            print(header)
            print("-" * len(header))
            for lr in lat_rows:
                goal_lat &= pct(lr.commit, 99) <= GOAL_P99_MS and lr.missing == 0
                print(f"{f'{lr.clients} worker(s)':<13}{pct(lr.commit, 50):>19.2f}{pct(lr.commit, 99):>8.2f}"
                      f"{max(lr.commit, default=float('nan')):>8.2f}{pct(lr.send, 50):>18.2f}"
                      f"{pct(lr.send, 99):>8.2f}{pct(lr.write, 50):>14.2f}{pct(lr.write, 99):>8.2f}"
                      f"{lr.rate:>10.0f}/s{100 * lr.endpoint_cpu / lr.seconds:>13.0f}%")
            print("(commit->worker: RDATA arrival minus the time append() returned; send->worker: minus the ts "
                  "taken before append(), carried in the row; endpoint CPU: share of one core from the first "
                  "write to the last delivery)")
            print()
        if rows:
            print(f"goal: ours/ceiling >= {GOAL_RATIO[1]} (1 worker), >= {GOAL_RATIO_MANY} (more): "
                  f"{'met' if goal_tp else 'NOT met'}")
        if lat_rows:
            print(f"goal: commit-to-worker p99 <= {GOAL_P99_MS:.0f} ms (everything delivered): "
                  f"{'met' if goal_lat else 'NOT met'}")
        print(f"total time {time.monotonic() - t_begin:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU per fact of a TCP replication worker's receive path, against reading the same bytes.

    .venv/bin/python benchmarks/bench_worker.py [--facts N] [--repeat R] [--quick] [--per-write 100 --pause-ms 10]

A sender process (plain sockets) listens on a free loopback port, answers the worker's
handshake with ``SERVER`` and ``POSITION receipts w1 0 1``, then sends N ``RDATA receipts w1
<token> <row>`` lines (a ~300-byte receipt row, the cluster benchmark's size) in one go, or
``--per-write N`` at a time with ``--pause-ms`` after each (the cluster's shape: a batch per
read, the worker idle in between; at 10 ms apart the same worker costs ~2.5x per fact, the
cost of waking up after idling).
The worker is :class:`~replication.worker.tcp_worker.ReplicationWorker` in this process with a
counting coroutine callback (what ``bench_cluster``'s count sink does); it is timed from
connect until the callback has seen every fact.

Baseline, same run: an asyncio client that connects, sends the same handshake and only
counts newlines in what it reads (``StreamReader.read(65536)``): the cost of getting the
bytes at all. Printed: facts/s and process CPU per fact of each, best of R runs.

Then, in this process without sockets, the receive path of each transport on the same lines
in 64 KiB chunks, to the same counting callback: the TCP worker's (``ReplicationConnection``
and the worker's dispatch) and the Redis worker's (the same lines as pub/sub messages in
RESP, through ``RedisReplicationWorker``'s chunk handler): CPU per fact, best of R. Last,
the floor under both: the same chunks split into lines and each line's token and row decoded,
with nothing else done (what any Python receiver of these lines pays).
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SERVER_NAME = "bench.example"
ROW = ["!room1:bench.example", "m.read", "@user123:bench.example", "$0123456789abcdef0123456789abcdef", None,
       {"ts": 1_700_000_000_000, "pad": "x" * 190}]


def _rdata_lines(facts: int) -> list[bytes]:
    """The N ``RDATA receipts w1 <token> <row>`` lines every run gets (tokens from 2, the same
    row), without their newlines."""
    body = json.dumps(ROW, separators=(",", ":"))
    return [f"RDATA receipts w1 {t} {body}".encode() for t in range(2, facts + 2)]


def _chunks(data: bytes) -> list[bytes]:
    """``data`` in 64 KiB reads, as the in-process runs feed it."""
    return [data[i:i + 65536] for i in range(0, len(data), 65536)]


def _sender(ports, facts: int, per_write: int = 0, pause: float = 0.001) -> None:
    """Serve one connection: read the 3 handshake lines, send everything (in one go, or
    ``per_write`` lines per write with ``pause`` seconds after each: one read per batch, as
    the endpoint sends a writer's transactions), wait to be closed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    ports.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    reader = conn.makefile("rb")
    for _ in range(3):
        reader.readline()
    head = f"SERVER {SERVER_NAME}\nPOSITION receipts w1 0 1\n".encode()
    lines = [line + b"\n" for line in _rdata_lines(facts)]
    if not per_write:
        conn.sendall(head + b"".join(lines))
    else:
        conn.sendall(head)
        for i in range(0, len(lines), per_write):
            conn.sendall(b"".join(lines[i:i + per_write]))
            time.sleep(pause)
    try:
        while conn.recv(65536):  # until the client goes away (a run over 5 s gets its PINGs)
            pass
    except OSError:
        pass


def _serve(facts: int, per_write: int = 0, pause: float = 0.001) -> tuple[mp.Process, int]:
    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    proc = ctx.Process(target=_sender, args=(ports, facts, per_write, pause), daemon=True)
    proc.start()
    return proc, ports.get(timeout=30)


def _cpu() -> float:
    return time.process_time()


def _counting(facts: int) -> tuple[Any, asyncio.Event]:
    """A worker callback that counts facts, and the event it sets at the ``facts``-th."""
    got = 0
    done = asyncio.Event()

    async def on_facts(stream: str, writer: str, token: int, rows: list) -> None:
        nonlocal got
        got += 1
        if got == facts:
            done.set()

    return on_facts, done


async def _worker_run(port: int, facts: int) -> tuple[float, float]:
    from replication.worker.tcp_worker import ReplicationWorker

    on_facts, done = _counting(facts)

    worker = ReplicationWorker(host="127.0.0.1", port=port, name="bench", server_name=SERVER_NAME,
                               catchup_url="http://127.0.0.1:9", on_facts=on_facts, streams=["receipts"])
    c0, t0 = _cpu(), time.perf_counter()
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), 300)
    elapsed, cpu = time.perf_counter() - t0, _cpu() - c0
    worker.stop()
    await task
    return elapsed, cpu


async def _baseline_run(port: int, facts: int) -> tuple[float, float]:
    c0, t0 = _cpu(), time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"NAME bench\nPING 1\nREPLICATE\n")
    lines = 0
    while lines < facts + 2:
        data = await reader.read(65536)
        if not data:
            raise RuntimeError("sender closed early")
        lines += data.count(b"\n")
    elapsed, cpu = time.perf_counter() - t0, _cpu() - c0
    writer.close()
    return elapsed, cpu


async def _in_process_run(transport: str, facts: int) -> float:
    """CPU per fact of one transport's receive path, fed 64 KiB chunks in this process."""
    from replication.protocol.commands import PositionCommand
    from replication.protocol.connection import ReplicationConnection
    from replication.worker.redis_worker import RedisReplicationWorker
    from replication.worker.tcp_worker import ReplicationWorker

    on_facts, done = _counting(facts)

    lines = _rdata_lines(facts)
    common = dict(name="bench", server_name=SERVER_NAME, catchup_url="http://127.0.0.1:9", on_facts=on_facts,
                  streams=["receipts"])
    worker: Any
    if transport == "tcp":
        worker = ReplicationWorker(host="127.0.0.1", port=9, **common)
        data = b"".join(line + b"\n" for line in lines)
    else:
        worker = RedisReplicationWorker(redis_url="redis://127.0.0.1:9", **common)
        data = _redis_messages(lines)
    chunks = _chunks(data)
    worker._loop = asyncio.get_running_loop()
    worker._dispatch_many([PositionCommand("receipts", "w1", 0, 1)])  # connected at 1
    conn = ReplicationConnection("client", now=0)
    c0 = _cpu()
    for chunk in chunks:
        if transport == "tcp":
            conn.receive_data(chunk)
            await worker._take(conn, None, conn.next_batch(0), True)  # type: ignore[arg-type]
        else:
            worker._on_chunk(chunk)
        await asyncio.sleep(0)  # the lane runs between reads, as it does between socket reads
    await asyncio.wait_for(done.wait(), 300)
    cpu = _cpu() - c0
    for lane in worker._lanes.values():
        lane.task.cancel()
    return 1e6 * cpu / facts


def _redis_messages(lines: list[bytes]) -> bytes:
    channel = SERVER_NAME.encode()
    return b"".join(b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(channel), channel, len(line), line)
                    for line in lines)


def _observer_run(facts: int) -> float:
    """CPU per fact of the observer of an attached Synapse (synapse_attach/redis_observer.py),
    fed the Redis worker's chunks: RESP messages taken apart, lines parsed, the figures kept."""
    from synapse_attach.observer import SynapseObserver
    from synapse_attach.redis_observer import RedisObserver

    observer = SynapseObserver()
    adapter = RedisObserver("redis://127.0.0.1:9", SERVER_NAME, observer)
    chunks = _chunks(_redis_messages(_rdata_lines(facts)))
    c0 = _cpu()
    for chunk in chunks:
        adapter._chunk(chunk)
    cpu = _cpu() - c0
    assert observer.writers[("receipts", "w1")].facts == facts
    return 1e6 * cpu / facts


def _floor_run(facts: int, library: str) -> float:
    """CPU per fact of the least a Python receiver of these lines does with ``library``'s
    decoder: the same 64 KiB chunks split into lines, each line split into its fields on
    bytes, the token made an int and the row's JSON decoded (the standard library's C scanner
    on the row decoded to text; msgspec on the bytes themselves), the pairs of a chunk handed
    on as a list and dropped (as the counting callback drops them). No checks, no follower,
    no callback: a floor for the in-process figures, not a receiver."""
    import msgspec

    from replication.protocol.wire_json import _scan_once

    stdlib = library == "stdlib"
    decode = msgspec.json.Decoder().decode
    chunks = _chunks(b"".join(line + b"\n" for line in _rdata_lines(facts)))
    seen = 0
    c0 = _cpu()
    partial = b""
    for chunk in chunks:
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()
        if stdlib:
            pairs = []
            for raw in lines:
                _, _, _, token, row_json = raw.split(b" ", 4)
                pairs.append((int(token), _scan_once(row_json.decode(), 0)[0]))
        else:
            pairs = []
            for raw in lines:
                _, _, _, token, row_json = raw.split(b" ", 4)
                pairs.append((int(token), decode(row_json)))
        seen += len(pairs)
    cpu = _cpu() - c0
    assert seen == facts, seen
    return 1e6 * cpu / facts


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main(argv: list[str] | None = None) -> int:
    import argparse

    from benchmarks._setup import run_size

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--per-write", type=int, default=0,
                       help="the sender writes this many lines at a time with a pause after each "
                            "(100: the cluster's batches, one read each); default: all in one go")
    extra.add_argument("--pause-ms", type=float, default=1.0,
                       help="with --per-write: the pause after each write (default 1; 10: a batch "
                            "every 10 ms, as at the cluster's ~10,000 facts/s)")
    extra.add_argument("--in-process", action="store_true",
                       help="only the in-process figures (no sender process, no socket)")
    known, rest = extra.parse_known_args(argv)
    per_write, pause = known.per_write, known.pause_ms / 1000
    facts, repeat = run_size(__doc__, rest, facts=200_000, quick_facts=50_000)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
    os.environ.pop("REDIS_URL", None)
    import logging

    import django

    django.setup()
    logging.getLogger("streams").setLevel(logging.WARNING)
    from benchmarks._machine import cpu_description, load_average

    print(f"machine: {cpu_description()}; load avg {load_average()}")
    how = f"{per_write} per write, {1000 * pause:g} ms apart" if per_write else "in one go"
    print(f"{facts:,} RDATA lines of {len(json.dumps(ROW, separators=(',', ':'))) + 25} bytes from a sender process "
          f"{how}; worker: ReplicationWorker with a counting coroutine callback; baseline: read and count newlines")
    best: dict[str, tuple[float, float]] = {}
    for rep in range(0 if known.in_process else repeat):
        for kind, run in (("worker", _worker_run), ("baseline", _baseline_run)):
            proc, port = _serve(facts, per_write, pause)
            elapsed, cpu = asyncio.run(run(port, facts))
            proc.terminate()
            proc.join(10)
            rate = facts / elapsed
            print(f"  run {rep + 1} {kind:<8} {rate:>10,.0f} facts/s; CPU {1e6 * cpu / facts:.2f} us/fact", flush=True)
            if kind not in best or rate > best[kind][0]:
                best[kind] = (rate, 1e6 * cpu / facts)
    if best:
        (w_rate, w_cpu), (b_rate, b_cpu) = best["worker"], best["baseline"]
        print(f"best: worker {w_rate:,.0f} facts/s at {w_cpu:.2f} us/fact; reading the bytes alone {b_rate:,.0f} "
              f"facts/s at {b_cpu:.2f} us/fact; the worker's own work {w_cpu - b_cpu:.2f} us/fact")
    from replication.protocol.wire_json import use_fast_paths

    print(f"in process, no socket, 64 KiB chunks (the receive path alone), median of {repeat} runs "
          f"(interleaved); load avg {load_average()}:")
    costs: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeat):
        for library in ("stdlib", "msgspec"):
            use_fast_paths(library == "msgspec")  # the workers' rows: the standard library alone, or msgspec
            costs.setdefault((library, "floor"), []).append(_floor_run(facts, library))
            for transport in ("tcp", "redis"):
                costs.setdefault((library, transport), []).append(asyncio.run(_in_process_run(transport, facts)))
    use_fast_paths(True)
    for library in ("stdlib", "msgspec"):
        floor = _median(costs[(library, "floor")])
        print(f"  rows decoded with {library}:")
        print(f"    floor: split, int(token), the row's JSON, nothing else: {floor:.2f} us/fact "
              f"(runs: {', '.join(f'{c:.2f}' for c in costs[(library, 'floor')])})")
        for transport in ("tcp", "redis"):
            runs = costs[(library, transport)]
            print(f"    {transport:<6} worker: {_median(runs):.2f} us/fact, {_median(runs) / floor:.2f}x the floor "
                  f"(runs: {', '.join(f'{c:.2f}' for c in runs)})", flush=True)
    for transport in ("tcp", "redis"):
        print(f"  {transport} worker, msgspec against the standard library: "
              f"{_median(costs[('msgspec', transport)]) / _median(costs[('stdlib', transport)]):.2f}x the CPU per fact")
    redis = _median(costs[("msgspec", "redis")])
    runs = [_observer_run(facts) for _ in range(repeat)]
    print(f"  Synapse observer (synapse_attach): {_median(runs):.2f} us/fact, {_median(runs) / redis:.2f}x the Redis "
          f"worker (runs: {', '.join(f'{c:.2f}' for c in runs)})", flush=True)
    print(f"load avg {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

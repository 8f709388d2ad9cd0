"""USER_IP sightings into ``user_ips``: the endpoint's batched upsert (one statement per
interval, sightings coalesced per key) against one upsert per command, on a throwaway
PostgreSQL (docs/benchmarks.md).

    .venv/bin/python benchmarks/bench_user_ips.py [--commands 20000] [--keys 2000] [--quick]
    .venv/bin/python benchmarks/bench_user_ips.py --memory [--seconds 60] [--ascii]

Prints commands/s for both ways, measured in the same run on the same database (emptied
between them), and how many statements each took.

``--memory``: what a ``USER_IP`` flood costs a real endpoint (``manage.py runreplication``)
in memory. Connections send ``USER_IP`` with a new key every line and every field at the
largest the endpoint keeps (user ID 255 bytes, access token 512 characters, address 64,
user agent 512, device 255), just under the per-connection command rate, so the pending
batch is full (``REPLICATION_MAX_USER_IPS``) at every write; the fields are non-ASCII
(4 bytes a character in Python) unless ``--ascii``. Prints the endpoint's RSS before, at its
peak and its plateau (the median of the last third), and the batch alone, measured in this
process with tracemalloc.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _setup import migrated_database


def sightings(n: int, keys: int, seed: int = 1) -> list:
    from replication.protocol.commands import UserIpCommand

    rng = random.Random(seed)
    return [UserIpCommand(f"@user{k % 500}:bench", f"token{k}", f"10.0.{k % 250}.{k % 7}", "Mozilla/5.0 bench",
                          f"DEV{k}", 1_700_000_000_000 + i)
            for i, k in enumerate(rng.randrange(keys) for _ in range(n))]


def batched(commands: list, flush_every: int) -> tuple[float, int]:
    from replication.endpoint.user_activity import UserIpBatch, write_user_ips

    batch, statements = UserIpBatch(), 0
    t0 = time.perf_counter()
    for i, cmd in enumerate(commands, 1):
        batch.add(cmd)
        if i % flush_every == 0 or i == len(commands):
            write_user_ips(batch.take())
            statements += 1
    return time.perf_counter() - t0, statements


def one_by_one(commands: list) -> tuple[float, int]:
    """The same upsert, one transaction per command, on one kept connection (the fair
    baseline: the endpoint's writer closes its pool thread's connection after each batch)."""
    from django.db import transaction

    from replication.models import UserIp

    t0 = time.perf_counter()
    for cmd in commands:
        with transaction.atomic():
            UserIp.objects.bulk_create(
                [UserIp(user_id=cmd.user_id, access_token=cmd.access_token, ip=cmd.ip, user_agent=cmd.user_agent,
                        device_id=cmd.device_id, last_seen=cmd.last_seen)],
                update_conflicts=True, unique_fields=["user_id", "access_token", "ip"],
                update_fields=["user_agent", "device_id", "last_seen"])
    return time.perf_counter() - t0, len(commands)


def worst_case_sighting(key: int, ascii_only: bool) -> tuple[str, str, str, str, str, int]:
    """A sighting with every field as long as the endpoint keeps it, unique by ``key``."""
    wide = "a" if ascii_only else "\U0001F600"  # 1 or 4 bytes a character in a Python str
    tag = f"{key:012d}"
    user_id = f"@{tag}{'u' * (255 - len(tag) - len(':bench.example') - 1)}:bench.example"
    return (user_id, tag + wide * (512 - len(tag)), tag + wide * (64 - len(tag)), wide * 512, wide * 255,
            1_700_000_000_000 + key)


def full_batch(keys: int, ascii_only: bool) -> tuple[int, int, int]:
    """A :class:`UserIpBatch` with the endpoint's caps offered ``keys`` worst-case keys: (keys
    it took, bytes it counts, bytes tracemalloc saw it hold), in this process."""
    import tracemalloc

    from replication.endpoint.user_activity import UserIpBatch
    from replication.protocol.commands import parse_line

    batch = UserIpBatch(max_pending=keys)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for key in range(keys):
        # from a wire line, as the endpoint gets them (each field its own string)
        batch.add(parse_line(_line(*worst_case_sighting(key, ascii_only))[:-1]))
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return len(batch), batch.size_bytes, held


def _line(user_id: str, token: str, ip: str, agent: str, device: str, seen: int) -> str:
    return f"USER_IP {user_id} {json.dumps([token, ip, agent, device, seen], ensure_ascii=False)}\n"


def flood(port: int, first_key: int, rate: float, stopping: threading.Event, sent: list[int], ascii_only: bool) -> None:
    """One connection: the handshake, then ``USER_IP`` lines at ``rate`` a second, new keys."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    threading.Thread(target=_drain, args=(sock,), daemon=True).start()
    sock.sendall(f"NAME flood{first_key}\nREPLICATE\n".encode())
    key, start = first_key, time.monotonic()
    try:
        while not stopping.is_set():
            due = int((time.monotonic() - start) * rate) - (key - first_key)
            if due <= 0:
                time.sleep(0.01)
                continue
            chunk = "".join(_line(*worst_case_sighting(k, ascii_only)) for k in range(key, key + min(due, 200)))
            sock.sendall(chunk.encode())
            key += min(due, 200)
            sent[0] += min(due, 200)
    except OSError as e:
        print(f"flood{first_key}: {e!r}", flush=True)
    finally:
        sock.close()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


def endpoint_memory(args: argparse.Namespace) -> None:
    from testing.accounting import rss_kib
    from testing.processes import ProcessGroup
    from testing.services import free_port

    with migrated_database("bench_user_ips_memory", fast=True), tempfile.TemporaryDirectory() as tmp:
        from django.conf import settings

        from replication.models import UserIp

        cap = settings.SYNAPSE_REPL["REPLICATION_MAX_USER_IPS"]
        rate = settings.SYNAPSE_REPL["REPLICATION_COMMAND_RATE"] * 0.9
        kept, counted, held = full_batch(cap, args.ascii)
        print(f"a full batch ({'ASCII' if args.ascii else 'non-ASCII'} fields at their largest, "
              f"{cap:,} keys offered): {kept:,} kept, {counted / 2**20:.1f} MiB counted, "
              f"{held / 2**20:.1f} MiB held (tracemalloc)", flush=True)
        group = ProcessGroup(Path(tmp))
        group.env = {k: v for k, v in os.environ.items() if k != "INSTANCE_NAME"}
        port = free_port()
        try:
            endpoint = group.start("endpoint", "manage.py", "runreplication", "--listen", f"127.0.0.1:{port}")
            deadline = time.monotonic() + 60
            while group.log_count("endpoint", "listening on") < 1:
                if endpoint.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((Path(tmp) / "endpoint.log").read_text()[-3000:])
                time.sleep(0.1)
            time.sleep(2)
            baseline = rss_kib(endpoint.pid) or 0
            stopping, sent = threading.Event(), [0]
            threads = [threading.Thread(target=flood, args=(port, i * 10**9, rate, stopping, sent, args.ascii),
                                        daemon=True) for i in range(args.connections)]
            for t in threads:
                t.start()
            samples: list[int] = []
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.seconds:
                time.sleep(0.5)
                samples.append(rss_kib(endpoint.pid) or 0)
            stopping.set()
            for t in threads:
                t.join(timeout=30)
            time.sleep(6)  # the last write
            rows = UserIp.objects.count()
            plateau = statistics.median(samples[len(samples) * 2 // 3:])
            print(f"endpoint RSS: {baseline / 1024:.0f} MiB before; during {args.seconds:.0f} s of "
                  f"{args.connections} x {rate:.0f} USER_IP/s ({sent[0]:,} sent, {rows:,} rows written): "
                  f"peak +{(max(samples) - baseline) / 1024:.0f} MiB, plateau +{(plateau - baseline) / 1024:.0f} MiB",
                  flush=True)
            print("RSS by 5 s (MiB over before): " + " ".join(
                f"{(max(samples[i:i + 10]) - baseline) / 1024:.0f}" for i in range(0, len(samples), 10)))
        finally:
            group.stop()
            if args.show_log:
                print((Path(tmp) / "endpoint.log").read_text(errors="replace")[-4000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=2_000, help="distinct (user, token, address) keys")
    parser.add_argument("--flush-every", type=int, default=5_000,
                        help="commands per write (what one 5 s interval collects)")
    parser.add_argument("--quick", action="store_true", help="2,000 commands")
    parser.add_argument("--memory", action="store_true", help="a real endpoint's RSS under a USER_IP flood")
    parser.add_argument("--seconds", type=float, default=60, help="--memory: how long the flood lasts")
    parser.add_argument("--connections", type=int, default=4, help="--memory: flooding connections")
    parser.add_argument("--ascii", action="store_true", help="--memory: ASCII fields (1 byte a character)")
    parser.add_argument("--show-log", action="store_true", help="--memory: print the end of the endpoint's log")
    args = parser.parse_args()
    if args.memory:
        return endpoint_memory(args)
    n = 2_000 if args.quick else args.commands
    with migrated_database("bench_user_ips", fast=False):
        from replication.models import UserIp

        commands = sightings(n, args.keys)
        results = {}
        for name, run in (("one upsert per command", lambda: one_by_one(commands)),
                          ("batched (endpoint)", lambda: batched(commands, args.flush_every))):
            UserIp.objects.all().delete()
            elapsed, statements = run()
            results[name] = elapsed
            print(f"{name:24s} {n / elapsed:10.0f} commands/s  ({statements} upsert statements, "
                  f"{UserIp.objects.count()} rows)")
        print(f"batched / one by one: {results['one upsert per command'] / results['batched (endpoint)']:.1f}x")


if __name__ == "__main__":
    main()

"""USER_IP sightings into ``user_ips``: the endpoint's batched upsert (one statement per
interval, sightings coalesced per key) against one upsert per command, on a throwaway
PostgreSQL (docs/benchmarks.md).

    .venv/bin/python benchmarks/bench_user_ips.py [--commands 20000] [--keys 2000] [--quick]

Prints commands/s for both ways, measured in the same run on the same database (emptied
between them), and how many statements each took.
"""
from __future__ import annotations

import argparse
import random
import time

from _setup import migrated_database


def sightings(n: int, keys: int, seed: int = 1) -> list:
    from streams.replication.protocol.commands import UserIpCommand

    rng = random.Random(seed)
    return [UserIpCommand(f"@user{k % 500}:bench", f"token{k}", f"10.0.{k % 250}.{k % 7}", "Mozilla/5.0 bench",
                          f"DEV{k}", 1_700_000_000_000 + i)
            for i, k in enumerate(rng.randrange(keys) for _ in range(n))]


def batched(commands: list, flush_every: int) -> tuple[float, int]:
    from streams.replication.endpoint.user_activity import UserIpBatch, write_user_ips

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

    from streams.models import UserIp

    t0 = time.perf_counter()
    for cmd in commands:
        with transaction.atomic():
            UserIp.objects.bulk_create(
                [UserIp(user_id=cmd.user_id, access_token=cmd.access_token, ip=cmd.ip, user_agent=cmd.user_agent,
                        device_id=cmd.device_id, last_seen=cmd.last_seen)],
                update_conflicts=True, unique_fields=["user_id", "access_token", "ip"],
                update_fields=["user_agent", "device_id", "last_seen"])
    return time.perf_counter() - t0, len(commands)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=2_000, help="distinct (user, token, address) keys")
    parser.add_argument("--flush-every", type=int, default=5_000,
                        help="commands per write (what one 5 s interval collects)")
    parser.add_argument("--quick", action="store_true", help="2,000 commands")
    args = parser.parse_args()
    n = 2_000 if args.quick else args.commands
    with migrated_database("bench_user_ips", fast=False):
        from streams.models import UserIp

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

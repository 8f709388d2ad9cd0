"""CPU of the legacy rewrite (``legacy_rewrite.to_legacy``): relayed lines turned into the older
generation's form for a ``REPLICATE <stream> <token>`` subscriber, once per batch and legacy
connection.

    .venv/bin/python benchmarks/bench_legacy_rewrite.py [--quick]

Batches of one writer's RDATA on ``receipts`` (``build_lines``: 100 facts of a ~300-byte
row, the cluster benchmark's size, every tenth fact of 3 rows), as the relay hands them to a
connection. Three cases: the stream subscribed and the batch above the subscriber's token
(the usual one), the token inside the batch, and a stream not subscribed.

Baseline, same run: the rewrite as it was before it read the batch's structure -- every line
parsed back with ``parse_line`` (JSON decoded and encoded again). Printed: microseconds per
line of each, best of several runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ROW = ["!room1:bench.example", "m.read", "@user123:bench.example", "$0123456789abcdef0123456789abcdef", None,
       {"ts": 1_700_000_000_000, "pad": "x" * 190}]


def parsing_every_line(data: bytes, subscribed: dict[str, str]):
    """The rewrite before this change (the baseline)."""
    from replication.protocol.line_batch import LineBatch
    from testing.legacy_reference import rewrite_by_parsing

    return LineBatch.of(rewrite_by_parsing(data, subscribed))


def best(fn, repeat: int, number: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
    import django

    django.setup()
    from replication.protocol.legacy_rewrite import to_legacy
    from replication.protocol.line_batch import WriterRun, build_counts, build_lines

    facts = [(t, [ROW] * (3 if t % 10 == 0 else 1)) for t in range(101, 201)]
    lines = build_lines("receipts", "w1", 100, 205, facts)
    data = ("\n".join(lines) + "\n").encode()
    run = WriterRun("receipts", "w1", 100, 205, data, build_counts(lines))
    cases = {"above the token": {"receipts": "50"}, "straddling the token": {"receipts": "150"},
             "stream not subscribed": {"events": "0"}}
    repeat, number = (3, 20) if args.quick else (7, 100)
    print(f"{len(lines)} lines a batch; microseconds per line, best of {repeat} x {number}")
    for name, subscribed in cases.items():
        new = to_legacy([run], subscribed)
        old = parsing_every_line(data, subscribed)
        assert new.data == old.data, name
        t_new = best(lambda s=subscribed: to_legacy([run], s), repeat, number)
        t_old = best(lambda s=subscribed: parsing_every_line(data, s), repeat, number)
        print(f"  {name:24s} structured {t_new / len(lines) * 1e6:7.3f}   parsing every line (baseline) "
              f"{t_old / len(lines) * 1e6:7.3f}   x{t_old / t_new:.0f}")


if __name__ == "__main__":
    main()

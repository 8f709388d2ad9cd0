"""The Synapse observer's memory over a long run: flat, or not.

    .venv/bin/python benchmarks/bench_observer.py [--lines N] [--rate FACTS_PER_S] [--every K]

Feeds the observer's pure core (``synapse_attach/observer.py``, what ``synapse_observer`` runs)
N synthetic lines of a Synapse cluster's Redis channel, in reads of 100 lines, on a simulated
clock advancing at ``--rate`` lines per second (default 2,000/s, so the default 7.2 M lines are
an hour of it). The mix: RDATA on events from a main
process and two persisters, receipts, presence, caches from four synchrotrons, POSITION echoes,
USER_SYNC from 20 process runs, USER_IP, FEDERATION_ACK. As ``synapse_observer`` does, the
view is taken (``as_dict``, JSON-encoded) every 2 simulated seconds, and an unreported-ID
tracker (``unreported.py``) is fed every 5 simulated seconds. The lines are generated per
read, never kept.

Printed every ``--every`` lines: the process's resident memory (``/proc/self/statm``) beside
the baseline, taken after the first 100,000 lines (modules imported, every writer and
process seen once); and the growth from the baseline at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PAGE = os.sysconf("SC_PAGE_SIZE")
READ = 100
RECEIPT = json.dumps(["!room1:bench.example", "m.read", "@user123:bench.example", "$0123456789abcdef", None,
                      {"ts": 1_700_000_000_000}], separators=(",", ":"))
EVENT = json.dumps(["ev", ["$abcdef0123456789", "!room1:bench.example", "m.room.message", None, None, None,
                           "@u:bench.example", False]], separators=(",", ":"))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def lines_of_read(i: int, tokens: dict[str, int]) -> list[str]:
    """Read ``i``'s lines: mostly RDATA, with the commands a cluster's Redis carries."""
    out = []
    for j in range(READ):
        k = (i * READ + j) % 20
        if k < 8:
            writer = ("master", "persister1", "persister2")[k % 3]
            tokens["events"] += 1
            out.append(f"RDATA events {writer} {tokens['events']} {EVENT}")
        elif k < 12:
            tokens["receipts"] += 1
            out.append(f"RDATA receipts master {tokens['receipts']} {RECEIPT}")
        elif k < 14:
            tokens["presence"] += 1
            out.append(f'RDATA presence master {tokens["presence"]} ["@u{j}:bench.example","online",0,0,0,null,true]')
        elif k == 14:
            tokens["caches"] += 1
            out.append(f'RDATA caches synchrotron{i % 4} {tokens["caches"]} ["get_user_by_id",["@u:bench.example"],0]')
            out.append(f"POSITION caches synchrotron{i % 4} {tokens['caches'] - 1} {tokens['caches']}")
        elif k == 15:
            w = ("master", "persister1", "persister2")[j % 3]
            out.append(f"POSITION events {w} {tokens['events'] - 1} {tokens['events']}")
        elif k == 16:
            out.append(f"USER_SYNC run{i % 20} @u{j}:bench.example DEVICE{j} start 1700000000000")
        elif k == 17:
            out.append(f'USER_IP @u{j}:bench.example ["token{j}","10.0.0.{j % 250}","Mozilla","DEVICE{j}",1700000000000]')
        elif k == 18:
            out.append(f"FEDERATION_ACK federation_sender{i % 2} {tokens['events']}")
        else:
            tokens["receipts"] += 1
            out.append(f"RDATA receipts master {tokens['receipts']} {RECEIPT}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=7_200_000)
    parser.add_argument("--rate", type=float, default=2000.0, help="lines per simulated second")
    parser.add_argument("--every", type=int, default=1_000_000)
    args = parser.parse_args(argv)

    from synapse_attach.observer import SynapseObserver
    from synapse_attach.unreported import UnreportedTracker

    observer = SynapseObserver(started=0.0)
    tracker = UnreportedTracker()
    tokens = {"events": 1, "receipts": 1, "presence": 1, "caches": 1}
    reads = args.lines // READ
    next_view = next_read = 0.0
    baseline = None
    print(f"{args.lines:,} lines at {args.rate:,.0f}/s simulated ({args.lines / args.rate / 3600:.2f} h)")
    for i in range(reads):
        now = i * READ / args.rate
        observer.observe_lines(lines_of_read(i, tokens), now)
        if now >= next_view:
            view = observer.as_dict(now)
            json.dumps(view)
            next_view = now + 2.0
        if now >= next_read:
            for stream, allocated in tokens.items():
                tracker.observe(stream, allocated + 2, allocated, now)
            next_read = now + 5.0
        done = (i + 1) * READ
        if baseline is None and done >= 100_000:
            baseline = rss_mib()
            print(f"  baseline after {done:>11,} lines: RSS {baseline:7.1f} MiB")
        elif baseline is not None and done % args.every == 0:
            print(f"  {done:>11,} lines ({now / 60:6.1f} min): RSS {rss_mib():7.1f} MiB "
                  f"({rss_mib() - baseline:+.1f} from the baseline); {len(observer.writers)} writers, "
                  f"{len(observer.instances)} processes, {observer.lines:,} lines, {observer.bad_lines} bad")
    end = rss_mib()
    print(f"  end: RSS {end:.1f} MiB, {end - (baseline or end):+.1f} MiB from the baseline")
    assert observer.bad_lines == 0, observer.bad_lines
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

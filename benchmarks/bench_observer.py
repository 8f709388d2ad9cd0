"""The Synapse observer's memory over a long run: flat, or not.

    .venv/bin/python benchmarks/bench_observer.py [--lines N] [--rate FACTS_PER_S] [--every K]
    .venv/bin/python benchmarks/bench_observer.py --live SECONDS [--sample-every S] [--threads T]

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

``--live SECONDS``: the real thing instead. A throwaway Synapse cluster (the suite's fixture,
``testing/synapse_homeserver.py``: a main process and an event persister, on a PostgreSQL and a
Redis of its own), the read-only role and Redis user created as README.md says, and the real
``manage.py synapse_observer`` process (Redis and database, this project's own database an
SQLite file in a temporary ``STATE_DIR``). ``--threads`` client loops drive Synapse as fast as
it answers (the fixture's top rate: messages to rooms of both event writers, receipts, typing,
account data) for SECONDS, and the observer process's resident memory
(``/proc/<pid>/statm``) is sampled every ``--sample-every`` seconds (60). Printed: the series,
the drift (last sample less the first, taken once the observer has published its first view
during traffic), the largest and smallest sample, the requests answered per second, and the
lines the observer heard (from its published view).
"""
from __future__ import annotations

import argparse
import contextlib
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


def process_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def published_view(state_dir: Path) -> dict | None:
    """The observer's last published view, read from this project's SQLite database."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(state_dir / "db.sqlite3", timeout=5)) as db:
            row = db.execute("SELECT view FROM synapse_attach_observer_status").fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else json.loads(row[0])


def live(seconds: float, sample_every: float, threads: int) -> int:
    """``--live``: the observer process beside a real Synapse at the fixture's top rate."""
    import signal
    import subprocess
    import tempfile
    import time

    from benchmarks._machine import cpu_description, load_average
    from benchmarks._synapse_cluster import (
        Traffic,
        create_acl_user_as_the_readme_says,
        create_role_as_the_readme_says,
        readme_acl_line,
        readme_role_sql,
        rooms_of_each_writer,
        throwaway_synapse,
    )

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through every finally: the servers stop

    signal.signal(signal.SIGTERM, on_term)
    readme = ROOT / "README.md"
    server_name = "bench-observer.test"
    print(f"machine: {cpu_description()}; load {load_average()}", flush=True)
    state = Path(tempfile.mkdtemp(prefix="bench_observer_"))
    observer: subprocess.Popen | None = None
    samples: list[tuple[float, float]] = []
    try:
        with throwaway_synapse(server_name) as cluster:
            synapse = cluster.synapse
            password = "pw-" + os.urandom(6).hex()
            env = {**os.environ, "STATE_DIR": str(state), "DEMO": "0",
                   "SYNAPSE_DATABASE_URL": create_role_as_the_readme_says(cluster, readme_role_sql(readme), password),
                   "SYNAPSE_REDIS_URL": create_acl_user_as_the_readme_says(cluster, readme_acl_line(readme), password),
                   "SYNAPSE_SERVER_NAME": server_name}
            for name in ("DATABASE_URL", "REDIS_URL"):
                env.pop(name, None)
            subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, check=True,
                           stdout=subprocess.DEVNULL)
            alice, bob = synapse.register("alice"), synapse.register("bob")
            rooms = rooms_of_each_writer(synapse, alice, bob)
            log = open(state / "observer.log", "w")
            observer = subprocess.Popen([sys.executable, "manage.py", "synapse_observer"], cwd=ROOT, env=env,
                                        stdout=log, stderr=subprocess.STDOUT)
            log.close()
            traffic = Traffic(synapse, alice, bob, rooms, threads).start()
            try:
                deadline = time.monotonic() + 120
                while not (published_view(state) or {}).get("lines"):
                    if observer.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"the observer did not publish:\n{(state / 'observer.log').read_text()}")
                    time.sleep(0.5)
                start = time.monotonic()
                sent_at_start = traffic.sent
                print(f"{server_name}: main process + persister1, {threads} client loops; observer pid "
                      f"{observer.pid}; sampling its RSS every {sample_every:g} s for {seconds:g} s", flush=True)
                next_sample = start
                while True:
                    now = time.monotonic()
                    if now >= next_sample:
                        if observer.poll() is not None:
                            raise SystemExit(f"the observer exited:\n{(state / 'observer.log').read_text()[-3000:]}")
                        rss = process_rss_mib(observer.pid)
                        samples.append((now - start, rss))
                        view = published_view(state) or {}
                        print(f"  {(now - start) / 60:6.1f} min: RSS {rss:6.1f} MiB "
                              f"({rss - samples[0][1]:+.1f}); {view.get('lines', 0):,} lines heard, "
                              f"{traffic.sent - sent_at_start:,} requests ({traffic.errors} failed); "
                              f"load {load_average()}", flush=True)
                        next_sample += sample_every
                    if now - start >= seconds:
                        break
                    time.sleep(min(1.0, max(0.0, next_sample - now)))
                elapsed = time.monotonic() - start
                sent = traffic.sent - sent_at_start
            finally:
                traffic.stop()
            view = published_view(state) or {}
            rss_values = [r for _, r in samples]
            print("series (min, MiB): " + ", ".join(f"{t / 60:.1f}:{r:.1f}" for t, r in samples))
            print(f"drift: {rss_values[-1] - rss_values[0]:+.1f} MiB over {elapsed / 60:.1f} min "
                  f"(first {rss_values[0]:.1f}, last {rss_values[-1]:.1f}, min {min(rss_values):.1f}, "
                  f"max {max(rss_values):.1f} MiB)")
            print(f"traffic: {sent:,} requests answered, {sent / elapsed:.1f}/s; observer heard "
                  f"{view.get('lines', 0):,} lines, {view.get('bad_lines', 0)} unparsable; "
                  f"events persisted: {synapse.query('SELECT COUNT(*) FROM events')[0][0]:,}; load {load_average()}")
    finally:
        if observer is not None and observer.poll() is None:
            observer.terminate()
            try:
                observer.wait(30)
            except subprocess.TimeoutExpired:
                observer.kill()
                observer.wait()
        import shutil

        shutil.rmtree(state, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=7_200_000)
    parser.add_argument("--rate", type=float, default=2000.0, help="lines per simulated second")
    parser.add_argument("--every", type=int, default=1_000_000)
    parser.add_argument("--live", type=float, default=0.0, metavar="SECONDS",
                        help="a real Synapse at the fixture's top rate and the observer process for SECONDS")
    parser.add_argument("--sample-every", type=float, default=60.0, metavar="S")
    parser.add_argument("--threads", type=int, default=4, help="client loops driving Synapse (--live)")
    args = parser.parse_args(argv)
    if args.live:
        return live(args.live, args.sample_every, args.threads)

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

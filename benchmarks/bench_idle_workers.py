"""200 connected workers of which 50 never read: the endpoint's memory and the readers' latency.

    .venv/bin/python benchmarks/bench_idle_workers.py [--quick]

The goal: "Memory stays bounded with 200 connected workers of which 50 never read
(they are disconnected; the rest keep their latency)". Starts a throwaway PostgreSQL and Redis,
a real endpoint process (``manage.py runreplication``, default REPLICATION_MAX_PENDING_COMMANDS
of 10,000 unless ``--max-pending``), and a writer process (``manage.py write_facts receipts
--rate R --stamps``) writing at a steady rate through Redis. The workers are raw sockets, read
in one thread (testing/line_workers.py): 150 that read everything, then 50 that never read.
In the same run:

* **baseline**: the 150 readers alone, for ``--baseline-seconds``;
* **idle 1** to **idle 3** (``--waves``): 50 non-readers connect; from then until the last of
  them is dropped (more waves: does memory keep growing from one to the next?);
* **after**: ``--after-seconds`` more once all are gone.

Per phase: commit -> line received latency of every fact at every reader (the writer's commit
stamp to the reader's ``recv``; p50/p99/max), the endpoint's VmRSS (sampled every 0.25 s:
start, peak, end) and CPU share. At the end: whether every reader got every fact exactly once
and in order, and when and why each non-reader was disconnected (the endpoint's log).
Exit status 0 whether or not the goals are met: every non-reader dropped for failing to keep
up, 0 readers dropped, exactly once, the endpoint's RSS over the baseline's within what the cap
allows, each idle phase's p99 within 2x of the baseline's (or 10 ms of it).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._machine import cpu_description, load_average, server_versions  # noqa: E402
from benchmarks._setup import migrated_database  # noqa: E402
from testing.accounting import cpu_seconds, peak_rss_kib, rss_kib  # noqa: E402
from testing.line_workers import LineWorkers  # noqa: E402
from testing.processes import ProcessGroup  # noqa: E402
from testing.services import free_port  # noqa: E402

SERVER_NAME = "bench.example"
STREAM = "receipts"
TRANSPORT_HIGH_WATER = 64 * 1024  # asyncio's default: the endpoint queues commands above it
DISCONNECT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+ replication (\S+) \(\S+\) disconnected: (.*)$",
                        re.MULTILINE)


@dataclass
class Phase:
    name: str
    start: float  # time.time()
    end: float = 0.0
    cpu_start: float = 0.0
    cpu_end: float = 0.0
    client_cpu: float = 0.0  # this process (the reading thread) during the phase
    latencies_ms: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)  # KiB, sampled within the phase
    tcp: list[int] = field(default_factory=list)  # KiB of kernel TCP buffers, machine-wide
    facts: int = 0

    def pct(self, q: float) -> float:
        return pct(self.latencies_ms, q)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def read_stamps(path: Path) -> dict[int, float]:
    stamps = {}
    for line in path.read_text().splitlines():
        token, at = line.split()
        stamps[int(token)] = float(at)
    return stamps


def timeline(phases: list[Phase], stamps: dict[int, float], readers, drops, window: float = 2.0) -> str:
    """p50/p99 latency per ``window`` seconds of commit time: where in a phase it was lost."""
    start = phases[0].start
    buckets: dict[int, list[float]] = {}
    for w in readers:
        for t, arrived in zip(w.tokens, w.arrivals):
            committed = stamps[t]
            if start <= committed < phases[-1].end:
                buckets.setdefault(int((committed - start) // window), []).append((arrived - committed) * 1000)
    marks: dict[int, list[str]] = {}
    for p in phases:
        marks.setdefault(int((p.start - start) // window), []).append(p.name)
    for k, n in Counter(int((at - start) // window) for at, _, _ in drops).items():
        marks.setdefault(k, []).append(f"{n} dropped")
    cells = [f"{k * window:>4.0f}s {pct(v, 50):.0f}/{pct(v, 99):.0f}" + (f" <{', '.join(marks[k])}>" if k in marks else "")
             for k, v in sorted(buckets.items())]
    return f"latency p50/p99 ms per {window:.0f} s of commit time:\n  " + "\n  ".join(
        "  ".join(cells[i:i + 6]) for i in range(0, len(cells), 6))


def log_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def tcp_kernel_kib() -> int:
    """Memory the kernel holds for TCP buffers, machine-wide (``/proc/net/sockstat``), in KiB."""
    try:
        with open("/proc/net/sockstat") as f:
            for line in f:
                if line.startswith("TCP:"):
                    fields = line.split()
                    return int(fields[fields.index("mem") + 1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class RssSampler(threading.Thread):
    """VmRSS of one process every ``interval`` seconds: [(time.time(), KiB)]; and the kernel's
    TCP buffer memory: [(time.time(), KiB)]."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, int]] = []
        self.tcp: list[tuple[float, int]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            kib = rss_kib(self.pid)
            if kib is not None:
                self.samples.append((time.time(), kib))
            self.tcp.append((time.time(), tcp_kernel_kib()))
            self.stopping.wait(self.interval)


def wait_log(group: ProcessGroup, name: str, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while group.log_count(name, text) < 1:
        proc = group.by_name[name]
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name}: no {text!r}:\n{(group.tmp / f'{name}.log').read_text()[-3000:]}")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=200, help="connected workers in all (default 200)")
    parser.add_argument("--idle", type=int, default=50, help="of which never read (default 50)")
    parser.add_argument("--rate", type=float, default=500.0, help="facts/s written (default 500)")
    parser.add_argument("--per-txn", type=int, default=5, help="facts per transaction (default 5)")
    parser.add_argument("--baseline-seconds", type=float, default=None, help="default 30 (--quick 10)")
    parser.add_argument("--after-seconds", type=float, default=None, help="default 20 (--quick 5)")
    parser.add_argument("--waves", type=int, default=3,
                        help="times --idle non-readers connect, each after the last were dropped (default 3)")
    parser.add_argument("--max-idle-seconds", type=float, default=300.0,
                        help="give up waiting for the non-readers' drop after this long (default 300)")
    parser.add_argument("--max-pending", type=int, default=None,
                        help="REPLICATION_MAX_PENDING_COMMANDS of the endpoint (default: the setting's "
                             "default, 10,000; --quick 2,000)")
    parser.add_argument("--send-buffer", type=int, default=0,
                        help="REPLICATION_SEND_BUFFER_BYTES of the endpoint (default 0: the kernel's autotuning)")
    parser.add_argument("--quick", action="store_true", help="shorter phases, a lower cap: ~1 min")
    args = parser.parse_args(argv)
    if not 0 < args.idle < args.workers or args.rate <= 0 or args.per_txn < 1 or args.waves < 1:
        parser.error("need 0 < --idle < --workers, --rate > 0, --per-txn >= 1, --waves >= 1")
    baseline_s = args.baseline_seconds or (10.0 if args.quick else 30.0)
    after_s = args.after_seconds or (5.0 if args.quick else 20.0)
    max_pending = args.max_pending or (2000 if args.quick else None)
    readers_n, idle_n = args.workers - args.idle, args.idle

    t_begin = time.monotonic()
    load_before = load_average()
    tmp = Path(tempfile.mkdtemp(prefix="bench_idle_workers_"))
    with migrated_database("bench_idle_workers", fast=True, redis=True,
                           env={"SERVER_NAME": SERVER_NAME, "STREAM_WRITERS": f"{STREAM}=master",
                                "PYTHONUNBUFFERED": "1"}) as db:
        import redis

        r = redis.Redis.from_url(db.redis.url)
        r.config_set("client-output-buffer-limit", "pubsub 0 0 0")  # Redis never drops the endpoint
        r.close()
        v = server_versions(db.url, db.redis.url)
        print(f"machine: {cpu_description()}; load average at start {load_before}")
        print(f"servers: redis {v['redis']}; {v['postgres']} (fsync={v['fsync']})")
        group = ProcessGroup(tmp)
        group.env = {k: val for k, val in db.env.items() if k != "INSTANCE_NAME"}
        endpoint_env = {"REPLICATION_MAX_CONNECTIONS_PER_ADDRESS": str(args.workers + 50)}
        if max_pending:
            endpoint_env["REPLICATION_MAX_PENDING_COMMANDS"] = str(max_pending)
        if args.send_buffer:
            endpoint_env["REPLICATION_SEND_BUFFER_BYTES"] = str(args.send_buffer)
        port = free_port()
        workers = None
        try:
            endpoint = group.start("endpoint", "manage.py", "runreplication", "--listen", f"127.0.0.1:{port}",
                                   env=endpoint_env)
            wait_log(group, "endpoint", "listening on")
            sampler = RssSampler(endpoint.pid)
            sampler.start()
            from django.conf import settings

            cap = max_pending or settings.SYNAPSE_REPL["REPLICATION_MAX_PENDING_COMMANDS"]
            print(f"endpoint: runreplication, REPLICATION_MAX_PENDING_COMMANDS={cap}, "
                  f"REPLICATION_SEND_BUFFER_BYTES={args.send_buffer}; writer: write_facts "
                  f"{STREAM} at {args.rate:.0f} facts/s, {args.per_txn} per transaction, through Redis; "
                  f"{readers_n} readers + {idle_n} non-readers (raw sockets, one reading thread, PING every 5 s)",
                  flush=True)

            workers = LineWorkers(port, stream=STREAM)
            for i in range(readers_n):
                workers.connect(f"reader{i}")
            workers.wait_replicating()
            stamps_path = tmp / "stamps.txt"
            group.start("writer", "manage.py", "write_facts", STREAM, "--count", "1000000000", "--rate",
                        str(args.rate), "--per-txn", str(args.per_txn), "--no-progress", "--seed", "1",
                        "--stamps", str(stamps_path), env={"INSTANCE_NAME": "master"})
            while not stamps_path.exists() or stamps_path.stat().st_size == 0:
                time.sleep(0.05)
            time.sleep(2.0)  # warm-up: not measured

            phases = [Phase("baseline", time.time(), cpu_start=cpu_seconds(endpoint.pid),
                            client_cpu=-time.process_time())]
            time.sleep(baseline_s)

            def end_phase() -> None:
                phases[-1].end, phases[-1].cpu_end = time.time(), cpu_seconds(endpoint.pid)
                phases[-1].client_cpu += time.process_time()

            def next_phase(name: str) -> Phase:
                end_phase()
                phases.append(Phase(name, phases[-1].end, cpu_start=phases[-1].cpu_end,
                                    client_cpu=-time.process_time()))
                return phases[-1]

            for wave in range(1, args.waves + 1):
                phase = next_phase(f"idle {wave}")
                for i in range(idle_n):
                    workers.connect(f"idle{wave}.{i}", reads=False)
                print(f"{phases[-2].name} done ({phases[-2].end - phases[-2].start:.0f} s); {idle_n} non-readers "
                      f"connected in {time.time() - phase.start:.2f} s", flush=True)
                deadline = time.monotonic() + args.max_idle_seconds
                while group.log_count("endpoint", "disconnected: failed to keep up") < idle_n * wave:
                    if time.monotonic() > deadline:
                        print(f"NOT all dropped within {args.max_idle_seconds:.0f} s", flush=True)
                        break
                    time.sleep(0.1)
            next_phase("after")
            time.sleep(after_s)
            end_phase()

            group.by_name["writer"].send_signal(signal.SIGTERM)
            group.by_name["writer"].wait(30)
            stamps = read_stamps(stamps_path)
            last = max(stamps)
            try:
                workers.wait_for_token(last, timeout=60)
            except (TimeoutError, ConnectionError) as e:
                print(f"drain: {e}")
            sampler.stopping.set()
            sampler.join()
            hwm = peak_rss_kib(endpoint.pid)
            log = (tmp / "endpoint.log").read_text(errors="replace")
            load_end = load_average()
        finally:
            if workers is not None:
                workers.stop()
            group.stop()

    # -- analysis -------------------------------------------------------------------------------
    ordered = sorted(stamps)
    for phase in phases:
        phase.rss = [kib for at, kib in sampler.samples if phase.start <= at <= phase.end]
        phase.tcp = [kib for at, kib in sampler.tcp if phase.start <= at <= phase.end]
        in_phase = {t for t, at in stamps.items() if phase.start <= at < phase.end}
        phase.facts = len(in_phase)
        for w in workers.reading:
            phase.latencies_ms += [(arrived - stamps[t]) * 1000 for t, arrived in zip(w.tokens, w.arrivals)
                                   if t in in_phase]
    exact = sum(1 for w in workers.reading if list(w.tokens) == ordered)
    duplicates = sum(len(w.tokens) - len(set(w.tokens)) for w in workers.reading)
    missing = sum(len(set(ordered) - set(w.tokens)) for w in workers.reading)
    disconnects = [(log_time(at), name, reason) for at, name, reason in DISCONNECT.findall(log)]
    idle_drops = [(at, name, reason) for at, name, reason in disconnects if name.startswith("idle")]
    reader_drops = [(at, name, reason) for at, name, reason in disconnects if name.startswith("reader")
                    and at < phases[-1].end]
    reasons = Counter(reason for _, _, reason in idle_drops)

    print()
    print(f"facts written: {len(stamps):,} ({ordered[0]}..{ordered[-1]}); each of the {readers_n} readers got "
          f"every one exactly once and in order: {exact} of {readers_n} (duplicates {duplicates}, missing "
          f"{missing})")
    if idle_drops:
        print(f"non-readers disconnected: {len(idle_drops)} of {idle_n * args.waves} "
              f"({', '.join(f'{n} {r}' for r, n in reasons.items())})")
        for wave, phase in enumerate(phases[1:-1], 1):
            times = sorted(at - phase.start for at, name, _ in idle_drops if name.startswith(f"idle{wave}."))
            if times:
                print(f"  wave {wave}: {len(times)} dropped {times[0]:.1f} s to {times[-1]:.1f} s after they connected")
    print(f"readers disconnected: {len(reader_drops)}")
    line_bytes = sum(w.rdata_bytes for w in workers.reading) / max(1, sum(len(w.tokens) for w in workers.reading))
    queue_bytes = cap * line_bytes
    print(f"what the cap lets the endpoint hold per non-reader: {cap:,} commands x {line_bytes:.0f} bytes = "
          f"{queue_bytes / 2**20:.1f} MiB queued + {TRANSPORT_HIGH_WATER // 1024} KiB in its transport; the queues "
          f"hold the relay's batch objects, shared by all connections, so {idle_n} non-readers: about "
          f"{(queue_bytes + idle_n * TRANSPORT_HIGH_WATER) / 2**20:.1f} MiB, at most "
          f"{idle_n * (queue_bytes + TRANSPORT_HIGH_WATER) / 2**20:.1f} MiB (kernel socket buffers: outside the RSS)")
    print()
    header = (f"{'phase':<10}{'seconds':>8}{'facts':>8}{'deliveries':>12}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
              f"{'RSS start':>11}{'peak':>9}{'end':>9}{'endpoint CPU':>14}{'readers CPU':>13}{'kernel TCP peak':>17}{'end':>9}")
    print(header)
    print("-" * len(header))
    for p in phases:
        seconds = p.end - p.start
        rss = p.rss or [0]
        print(f"{p.name:<10}{seconds:>8.1f}{p.facts:>8,}{len(p.latencies_ms):>12,}{p.pct(50):>9.2f}{p.pct(99):>9.2f}"
              f"{max(p.latencies_ms, default=float('nan')):>9.2f}{rss[0] / 1024:>9.1f}Mi{max(rss) / 1024:>7.1f}Mi"
              f"{rss[-1] / 1024:>7.1f}Mi{100 * (p.cpu_end - p.cpu_start) / seconds:>13.0f}%"
              f"{100 * p.client_cpu / seconds:>12.0f}%{max(p.tcp or [0]) / 1024:>15.1f}Mi{(p.tcp or [0])[-1] / 1024:>7.1f}Mi")
    base, after = phases[0], phases[-1]
    print(timeline(phases, stamps, workers.reading, idle_drops))
    print(f"(RSS: the endpoint's VmRSS sampled every {sampler.interval} s; its VmHWM at the end "
          f"{(hwm or 0) / 1024:.1f} MiB; latency: commit stamp -> recv at the reader, every fact x reader "
          f"committed in the phase; CPU: share of one core, of the endpoint and of this process, whose "
          f"one thread reads the {readers_n} readers; kernel TCP: buffers of all sockets, machine-wide, "
          f"/proc/net/sockstat; a dropped worker's are freed when the endpoint resets it, 5 s after its ERROR)")
    print()
    for p in phases[1:]:
        print(f"{p.name} / baseline: p50 x{p.pct(50) / base.pct(50):.2f}, p99 x{p.pct(99) / base.pct(99):.2f}, "
              f"peak RSS {(max(p.rss or [0]) - max(base.rss or [0])) / 1024:+.1f} MiB")
    peaks = [max(p.rss or [0]) / 1024 for p in phases[1:-1]]
    print(f"peak RSS of each wave: {', '.join(f'{x:.1f}' for x in peaks)} MiB (wave to wave: "
          f"{', '.join(f'{b - a:+.1f}' for a, b in zip(peaks, peaks[1:])) or '-'}); RSS at the end "
          f"{((after.rss or [0])[-1] - (base.rss or [0])[-1]) / 1024:+.1f} MiB over the baseline's end")
    goals = {
        f"all {idle_n * args.waves} non-readers dropped for failing to keep up":
            reasons.get("failed to keep up", 0) == len(idle_drops) == idle_n * args.waves,
        "memory bounded: the endpoint's peak RSS over the baseline's within what the cap allows":
            max(rss for p in phases for rss in p.rss) - max(base.rss or [0])
            <= idle_n * (queue_bytes + TRANSPORT_HIGH_WATER) / 1024,
        "no reader dropped": not reader_drops,
        "every reader got every fact exactly once": exact == readers_n,
        "idle-phase p99 <= max(2x baseline, baseline + 10 ms)":
            all(p.pct(99) <= max(2 * base.pct(99), base.pct(99) + 10) for p in phases[1:-1]),
    }
    for goal, ok in goals.items():
        print(f"goal: {goal}: {'met' if ok else 'NOT met'}")
    print(f"load average at start {load_before}, at the end {load_end}; total time "
          f"{time.monotonic() - t_begin:.0f} s")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak test under faults: a whole cluster runs for a while as its parts are killed and fuzzed.

    .venv/bin/python benchmarks/soak.py [--duration SECONDS] [--workers N] [--rate R] [--keep]
                                        [--attack] [--no-faults]

Starts a throwaway PostgreSQL and Redis (testing/services.py), migrates a fresh database
and runs, as separate OS processes (testing/processes.py, as the cluster tests do):

* 2 writers (``manage.py write_facts events --rate R``, ``STREAM_WRITERS=events=w1,w2``),
  each stamping when its facts were committed (``--stamps``);
* the catch-up endpoint (daphne) and 2 TCP endpoints (``manage.py runreplication``);
* N workers (``manage.py replication_worker --jsonl --jsonl-timestamps``): about one in six
  straight from Redis (``--redis``), the rest over TCP, alternating between the endpoints.

For ``--duration`` seconds (default 600) a fault injector takes turns, pausing between faults:
SIGKILL a worker, a writer, an endpoint, Redis, each restarted after a second (the writer with
the same ``INSTANCE_NAME``, which clears the reservation it left stuck; the endpoint and Redis
on the same port), and it waits until the restarted part is back before the next fault. A
fuzzer meanwhile connects to the TCP endpoints and sends random bytes; each connection must be
answered ``ERROR`` and closed. Then the writers are stopped (SIGTERM: after their transaction),
and every worker must end with every fact in the database exactly once.

Printed at the end: facts written (from the database), facts delivered per worker, duplicates
and missing (both must be 0), disconnects by reason until the shutdown (the endpoints' logs,
which survive their restarts; ``shut down`` (closed in order) includes ``wait_port``'s start-up probes,
the fuzzer's connections are the ``bad line`` ones), fuzzer outcomes, faults injected, peak
RSS (VmHWM, sampled every second and just before each kill) of each process, and delivery
latency (the worker's delivery time minus the writer's commit stamp; p50/p99/max over all
workers, facts delivered through catch-up after a restart included, and over the facts
committed outside fault windows). Exit status 1 if anything was duplicated or missing, a
process died on its own, a fuzzed connection was not closed with ERROR, or a fault did not
recover.

``--attack`` adds attackers against both endpoints (:class:`Attackers`: a legacy
REPLICATE storm, a USER_IP flood with long IDs, idle squatters beyond the per-address cap,
NAMEs with a NUL byte), a long-typing room against the typing writer (the web process)
and a prober connecting as a new worker four times a second; printed:
what the attackers got, the prober's time to its first POSITION (p50/p99/max), and each
endpoint's (and the web process's) RSS before the attack, at its highest and at the end. With ``--no-faults`` nothing
is killed, so the endpoints live through the whole attack (the fuzzer still runs). Exit
status 1 also if a 16 KB USER_IP, a NUL NAME or a typer past the long-typing room's full row
was not refused.

``--attack`` also floods the web process with anonymous ``GET /health/ready`` (:class:`HealthFlood`:
40 clients for 15 s every minute); printed: the probes' answers, and the web process's threads,
PostgreSQL connections and RSS before, at their highest during a flood and 10 s after one.
Exit status 1 also if threads or connections 10 s after a flood are more than 5 above before.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from testing.accounting import cpu_seconds, machine_busy, peak_rss_kib, rss_kib, status_field  # noqa: E402
from testing.processes import ProcessGroup, wait_port  # noqa: E402
from testing.services import RedisServer, free_port  # noqa: E402

SERVER_NAME = "soak.example"
STREAM = "events"
WRITERS = ("w1", "w2")
#: What a worker logs once it follows (TCP: the server accepted; Redis: SUBSCRIBE confirmed).
CONNECTED = {"tcp": "replication connected to", "redis": "replication subscribed to"}
FAULT_KINDS = ("worker", "writer", "endpoint", "redis")
DISCONNECTED = re.compile(rb"replication (\S+) \((.*?)\) disconnected: (.*)$", re.M)


@dataclass
class SoakConfig:
    duration: float = 600.0
    workers: int = 20
    redis_workers: int | None = None  #: default: one in six, at least one
    rate: float = 50.0  #: facts per second per writer
    per_txn: int = 5
    fault_pause: float = 5.0  #: seconds between one fault's recovery and the next fault
    down_seconds: float = 1.0  #: how long a killed part stays down
    min_rounds: int = 1  #: complete rounds of the four faults, even if that outlasts the duration
    fuzz_interval: float = 0.2
    startup_timeout: float = 300.0
    recover_timeout: float = 180.0
    drain_timeout: float = 300.0
    seed: int = 1
    progress: bool = True
    faults: bool = True  #: False: no fault injector (the attackers alone beside the workers)
    attack: bool = False  #: the attackers (:class:`Attackers`) against the endpoints
    squatters: int = 250  #: idle connections per endpoint, with --attack

    @property
    def n_redis_workers(self) -> int:
        if self.redis_workers is not None:
            return self.redis_workers
        return max(1, self.workers // 6)


class JsonlTail:
    """A worker's ``--jsonl`` file read as it grows: facts seen, duplicates, delivery times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.seen: dict[tuple[str, int], float | None] = {}
        self.duplicates = 0
        self.torn = 0
        self._lock = threading.Lock()

    def poll(self) -> None:
        with self._lock:
            self._poll()

    def _poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                fact = json.loads(line)
                key = (fact["writer"], int(fact["token"]))
            except (ValueError, KeyError, TypeError):
                self.torn += 1  # ended by a SIGKILL; the restarted worker fetches it again
                continue
            if key in self.seen:
                self.duplicates += 1
            else:
                self.seen[key] = fact.get("at")


@dataclass
class Fault:
    kind: str
    victim: str
    killed_at: float
    killed_wall: float  #: time.time(), to compare with the writers' commit stamps
    recovered_after: float | None = None  #: seconds from the kill until it was back


@dataclass
class SoakResult:
    written: int = 0
    written_per_writer: dict[str, int] = field(default_factory=dict)
    delivered: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    unexpected: dict[str, int] = field(default_factory=dict)  #: delivered, yet not in the database
    disconnects: dict[str, int] = field(default_factory=dict)
    fuzz: dict[str, int] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    writer_exits: dict[str, int | None] = field(default_factory=dict)
    peak_rss_kib: dict[str, int] = field(default_factory=dict)
    #: Per process name, its longest-lived run: (seconds it ran, VmRSS KiB 20 s into it, at
    #: half its life, at its end); memory growth shows as the last above the first.
    rss_over_time_kib: dict[str, tuple[float, int, int, int]] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    #: Facts committed outside every fault window (from a kill until 2 s after its recovery).
    steady_latency_ms: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: with --attack: what the attackers saw, a new worker's time to its first POSITION, and
    #: each endpoint's VmRSS (KiB) just before the attack, at its highest and at the end
    attack: dict[str, int] = field(default_factory=dict)
    first_position_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    endpoint_rss_kib: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: with --attack: the web process under the health-probe flood (:class:`HealthFlood`), per
    #: figure (before, highest during, highest 10 s after a flood)
    health_flood: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: CPU seconds per kind of process (endpoints, workers, writers, ...), summed over every
    #: run of each; and the whole machine's busy CPU seconds over the run, of ``cores`` x wall
    cpu_by_kind: dict[str, float] = field(default_factory=dict)
    machine_busy_s: float = 0.0
    #: the endpoints' event-loop wake-ups later than LOOP_LAG_MS (logged at most every 10 s
    #: each, with the worst: the count is a lower bound), and the worst
    loop_late: int = 0
    loop_worst_ms: int = 0
    cores: int = 1

    @property
    def total_duplicates(self) -> int:
        return sum(self.duplicates.values())

    @property
    def total_missing(self) -> int:
        return sum(self.missing.values())

    def faults_by_kind(self) -> Counter:
        return Counter(f.kind for f in self.faults if f.recovered_after is not None)

    @property
    def ok(self) -> bool:
        return (self.total_duplicates == 0 and self.total_missing == 0 and not any(self.unexpected.values())
                and not self.crashes
                and self.fuzz.get("not closed with ERROR", 0) == 0
                and all(f.recovered_after is not None for f in self.faults)
                and all(code == 0 for code in self.writer_exits.values())
                and not any(n for what, n in self.attack.items() if "not refused" in what)
                and self.health_flood_flat)

    @property
    def health_flood_flat(self) -> bool:
        """The issue's goal: threads and PostgreSQL connections within +5 of before, 10 s after."""
        return all(after <= before + 5 for what, (before, _high, after) in self.health_flood.items()
                   if what in ("threads", "PostgreSQL connections"))

    def report(self) -> str:
        lines = [f"soak: {self.seconds:.0f} s, load average at the end {self.load[0]:.2f} {self.load[1]:.2f} "
                 f"{self.load[2]:.2f}",
                 f"facts written (database): {self.written} "
                 f"({', '.join(f'{w} {n}' for w, n in sorted(self.written_per_writer.items()))})",
                 f"duplicates: {self.total_duplicates}   missing: {self.total_missing}",
                 "facts delivered per worker:"]
        for name in sorted(self.delivered):
            lines.append(f"  {name:<10} {self.delivered[name]:>8}  dup {self.duplicates[name]}  "
                         f"missing {self.missing[name]}  not in the database {self.unexpected[name]}")
        lines.append("faults injected (recovered): " + ", ".join(
            f"{k} {self.faults_by_kind()[k]}" for k in FAULT_KINDS))
        slow = [f for f in self.faults if f.recovered_after is not None]
        if slow:
            lines.append(f"  back after (kill -> following/listening again): max "
                         f"{max(f.recovered_after for f in slow):.1f} s")
        lines.append("disconnects by reason (endpoints): " + (", ".join(
            f"{r} {n}" for r, n in sorted(self.disconnects.items(), key=lambda i: -i[1])) or "none"))
        lines.append("fuzzer connections: " + ", ".join(f"{k} {n}" for k, n in sorted(self.fuzz.items())))
        lines.append("processes that died on their own: " + (", ".join(self.crashes) or "none"))
        lines.append("writer exits: " + ", ".join(f"{w} {c}" for w, c in sorted(self.writer_exits.items())))
        if self.cpu_by_kind:
            mine = sum(self.cpu_by_kind.values())
            lines.append("CPU (s): " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.cpu_by_kind.items()))
                         + f"; the soak's processes {mine:.0f} s, the machine {self.machine_busy_s:.0f} s busy "
                         f"of {self.cores} cores x {self.seconds:.0f} s = {self.cores * self.seconds:.0f} s")
        lines.append(f"endpoint event loops: {self.loop_late} wake-ups over {LOOP_LAG_MS} ms late, "
                     f"worst {self.loop_worst_ms} ms")
        lines.append("peak RSS (VmHWM, MiB):")
        for name, kib in sorted(self.peak_rss_kib.items()):
            lines.append(f"  {name:<10} {kib / 1024:7.1f}")
        if self.rss_over_time_kib:
            lines.append("RSS over time (VmRSS, MiB; each name's longest-lived run, from 20 s into it):")
            lines.append(f"  {'process':<10} {'lived':>7} {'at 20 s':>8} {'half':>8} {'end':>8} {'growth':>8}")
            for name, (lived, first, mid, last) in sorted(self.rss_over_time_kib.items()):
                lines.append(f"  {name:<10} {lived:6.0f}s {first / 1024:8.1f} {mid / 1024:8.1f} "
                             f"{last / 1024:8.1f} {(last - first) / 1024:+8.1f}")
        for what, lat in (("all", self.latency_ms), ("committed outside fault windows", self.steady_latency_ms)):
            if lat:
                lines.append(f"delivery latency (commit -> worker's sink), {what}, {lat['n']:.0f} deliveries: "
                             f"p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms, max {lat['max']:.0f} ms")
        if self.attack:
            lines.append("attackers: " + ", ".join(f"{k} {n}" for k, n in sorted(self.attack.items())))
            for phase, fp in self.first_position_ms.items():
                if fp:
                    lines.append(f"a new worker's first POSITION {phase} the attack, {fp['n']:.0f} probes: "
                                 f"p50 {fp['p50']:.1f} ms, p99 {fp['p99']:.1f} ms, max {fp['max']:.1f} ms"
                                 + (" (goal: p99 < 50 ms)" if phase == "during" else ""))
            lines.append("endpoint (and typing writer: web) RSS during the attack (VmRSS, MiB; goal: within +50 MB of before):")
            for name, (before, high, end) in sorted(self.endpoint_rss_kib.items()):
                lines.append(f"  {name:<10} before {before / 1024:7.1f}  highest {high / 1024:7.1f} "
                             f"({(high - before) / 1024:+.1f})  end {end / 1024:7.1f} ({(end - before) / 1024:+.1f})")
        if self.health_flood:
            lines.append("web process under the health-probe flood (before, highest during, highest 10 s after; "
                         "goal: threads and PostgreSQL connections within +5): " + ", ".join(
                             f"{what} {b} {h} {a}" for what, (b, h, a) in self.health_flood.items())
                         + ("" if self.health_flood_flat else " NOT FLAT"))
        lines.append("RESULT: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)

    def percentile(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {"n": len(values), "p50": percentile(0.5), "p99": percentile(0.99), "max": values[-1]}


class SoakCluster(ProcessGroup):
    """The processes of a soak run, each restartable by name."""

    def __init__(self, pg_url: str, redis: RedisServer, tmp: Path, cfg: SoakConfig) -> None:
        super().__init__(tmp)
        self.cfg = cfg
        self.redis = redis
        self.env = dict(os.environ, DATABASE_URL=pg_url, REDIS_URL=redis.url, SERVER_NAME=SERVER_NAME,
                        STREAM_WRITERS=f"{STREAM}={','.join(WRITERS)}", POSITION_POLL_SECONDS="0.2",
                        PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="synapse_repl.settings")
        self.env.pop("INSTANCE_NAME", None)
        # A full-mode web process refuses to start without a replication secret.
        self.env.setdefault("REPLICATION_SECRET", secrets.token_urlsafe(32))
        self.peaks: dict[str, int] = {}
        #: (name, pid) -> its CPU seconds at the last sample (user + system, all threads)
        self.cpu: dict[tuple[str, int], float] = {}
        #: (name, pid) -> [(seconds since the first sample of that pid, VmRSS KiB)]
        self.rss_samples: dict[tuple[str, int], list[tuple[float, int]]] = {}
        self.expected_exit: set[int] = set()  # pids we killed or stopped
        self.lock = threading.Lock()
        #: Held by the fuzzer for each connection and by the injector while it kills an
        #: endpoint: a fuzzed connection never straddles a kill, so it must end in ERROR.
        self.endpoint_lock = threading.Lock()
        self.web_port = free_port()
        self.endpoint_ports = [free_port() for _ in range(2)]
        self.workers: dict[str, str] = {}  # name -> "tcp" | "redis"
        self.tails: dict[str, JsonlTail] = {}

    # -- starting ------------------------------------------------------------------------------

    def start_web(self) -> None:
        proc = self.start("web", "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port),
                          "synapse_repl.asgi:application")
        wait_port(self.web_port, proc, self.tmp / "web.log", timeout=self.cfg.startup_timeout)

    def start_endpoint(self, i: int) -> None:
        name = f"endpoint{i}"
        proc = self.start(name, "manage.py", "runreplication", "--listen", f"127.0.0.1:{self.endpoint_ports[i]}",
                          env={"REPLICATION_LOOP_LAG_WARN_MS": str(LOOP_LAG_MS)})
        wait_port(self.endpoint_ports[i], proc, self.tmp / f"{name}.log", timeout=self.cfg.recover_timeout)

    def start_worker(self, name: str) -> None:
        if self.workers[name] == "redis":
            transport: tuple[str, ...] = ("--redis",)
        else:
            port = self.endpoint_ports[int(name[-2:]) % len(self.endpoint_ports)]
            transport = ("--connect", f"127.0.0.1:{port}")
        self.start(name, "manage.py", "replication_worker", "--name", name, *transport,
                   "--catchup-url", f"http://127.0.0.1:{self.web_port}", "--server-name", SERVER_NAME,
                   "--streams", STREAM, "--jsonl", str(self.tmp / f"{name}.jsonl"), "--jsonl-timestamps")

    def start_writer(self, instance: str) -> None:
        self.start(f"writer-{instance}", "manage.py", "write_facts", STREAM, "--count", "1000000000",
                   "--per-txn", str(self.cfg.per_txn), "--rate", str(self.cfg.rate), "--no-progress",
                   "--seed", str(random.randrange(1 << 30)), "--stamps", str(self.stamps_path(instance)),
                   env={"INSTANCE_NAME": instance})

    def stamps_path(self, instance: str) -> Path:
        return self.tmp / f"stamps-{instance}.txt"

    def connected_count(self, name: str) -> int:
        return self.log_count(name, CONNECTED[self.workers[name]])

    # -- watching --------------------------------------------------------------------------------

    def sample_rss(self) -> None:
        procs = [(n, p.pid) for n, p in list(self.by_name.items()) if p.poll() is None]
        if self.redis.proc is not None and self.redis.proc.poll() is None:
            procs.append(("redis", self.redis.proc.pid))
        with self.lock:
            now = time.monotonic()
            for name, pid in procs:
                kib = peak_rss_kib(pid)
                if kib is not None and kib > self.peaks.get(name, 0):
                    self.peaks[name] = kib
                cpu = cpu_seconds(pid)
                if cpu == cpu:  # not NaN: still there
                    self.cpu[(name, pid)] = cpu
                current = rss_kib(pid)
                if current is not None:
                    self.rss_samples.setdefault((name, pid), []).append((now, current))

    def rss_over_time(self) -> dict[str, tuple[float, int, int, int]]:
        """Per name, its longest-lived run (at least 40 s; the injector kills each writer and
        endpoint every minute or two): RSS 20 s into it, at half, at the end."""
        best: dict[str, tuple[float, int, int, int]] = {}
        with self.lock:
            for (name, _pid), samples in self.rss_samples.items():
                lived = samples[-1][0] - samples[0][0]
                if lived < 40 or (name in best and best[name][0] >= lived):
                    continue
                settled = [kib for t, kib in samples if t - samples[0][0] >= 20]
                best[name] = (lived, settled[0], settled[len(settled) // 2], settled[-1])
        return best

    def kill(self, name: str) -> None:
        """SIGKILL process ``name``, its peak RSS sampled first."""
        proc = self.by_name[name]
        self.sample_rss()
        with self.lock:
            self.expected_exit.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def unexpected_exits(self) -> list[str]:
        with self.lock:
            return [f"{n} (pid {p.pid}, status {p.returncode})" for n, p in self.by_name.items()
                    if p.poll() is not None and p.pid not in self.expected_exit]

    def stop_all(self) -> None:
        with self.lock:
            self.expected_exit.update(p.pid for p in self.procs)
        self.stop()


def _wait(condition, what: str, timeout: float, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class FaultInjector(threading.Thread):
    """Takes turns at killing a worker, a writer, an endpoint and Redis; each is restarted after
    ``down_seconds`` and waited for before the next fault."""

    def __init__(self, cluster: SoakCluster, deadline: float, log) -> None:
        super().__init__(name="fault-injector", daemon=True)
        self.cluster, self.deadline, self.log = cluster, deadline, log
        self.faults: list[Fault] = []
        self.error: str | None = None
        self.turns: Counter = Counter()  # faults of each kind so far: victims are taken in turn

    def _victim(self, kind: str, candidates: list):
        victim = candidates[self.turns[kind] % len(candidates)]
        self.turns[kind] += 1
        return victim

    def run(self) -> None:
        cfg = self.cluster.cfg
        rounds = 0
        try:
            while rounds < cfg.min_rounds or time.monotonic() < self.deadline:
                for kind in FAULT_KINDS:
                    getattr(self, f"_{kind}")()
                    time.sleep(cfg.fault_pause)  # pacing only: recovery was waited for
                rounds += 1
        except Exception as e:  # a part that did not come back: reported, the run goes on to its check
            self.error = f"{type(e).__name__}: {e}"
            if self.faults and self.faults[-1].recovered_after is None:
                self.log(f"fault {self.faults[-1].kind} {self.faults[-1].victim} did not recover: {e}")

    def _record(self, kind: str, victim: str) -> Fault:
        fault = Fault(kind, victim, time.monotonic(), time.time())
        self.faults.append(fault)
        return fault

    def _recovered(self, fault: Fault) -> None:
        fault.recovered_after = time.monotonic() - fault.killed_at
        self.log(f"fault: {fault.kind} {fault.victim} killed, back after {fault.recovered_after:.1f} s")

    def _worker(self) -> None:
        c = self.cluster
        # TCP and Redis workers alternately.
        tcp = [n for n in sorted(c.workers) if c.workers[n] == "tcp"]
        red = [n for n in sorted(c.workers) if c.workers[n] == "redis"]
        order = [n for pair in zip(tcp, red * len(tcp)) for n in pair] if red else tcp
        name = self._victim("worker", order)
        before = c.connected_count(name)
        fault = self._record("worker", name)
        c.kill(name)
        time.sleep(c.cfg.down_seconds)
        c.start_worker(name)
        _wait(lambda: c.connected_count(name) > before, f"{name} to follow again", c.cfg.recover_timeout)
        self._recovered(fault)

    def _writer(self) -> None:
        c = self.cluster
        instance = self._victim("writer", list(WRITERS))
        fault = self._record("writer", f"writer-{instance}")
        c.kill(f"writer-{instance}")
        time.sleep(c.cfg.down_seconds)
        size = c.stamps_path(instance).stat().st_size
        c.start_writer(instance)
        # Back once it has committed again (with its position recovered from the database).
        _wait(lambda: c.stamps_path(instance).stat().st_size > size, f"writer {instance} to write again",
              c.cfg.recover_timeout)
        self._recovered(fault)

    def _endpoint(self) -> None:
        c = self.cluster
        i = self._victim("endpoint", list(range(len(c.endpoint_ports))))
        followers = [n for n in c.workers if c.workers[n] == "tcp" and int(n[-2:]) % len(c.endpoint_ports) == i]
        before = {n: c.connected_count(n) for n in followers}
        fault = self._record("endpoint", f"endpoint{i}")
        with c.endpoint_lock:
            c.kill(f"endpoint{i}")
        time.sleep(c.cfg.down_seconds)
        c.start_endpoint(i)
        # Back once its workers follow it again (they reconnect with back-off).
        _wait(lambda: all(c.connected_count(n) > before[n] for n in followers),
              f"endpoint{i}'s workers to reconnect", c.cfg.recover_timeout)
        self._recovered(fault)

    def _redis(self) -> None:
        c = self.cluster
        followers = [n for n in c.workers if c.workers[n] == "redis"]
        before = {n: c.connected_count(n) for n in followers}
        fault = self._record("redis", "redis")
        c.sample_rss()
        c.redis.kill()
        time.sleep(c.cfg.down_seconds)
        c.redis.start(port=c.redis.port)
        _wait(lambda: all(c.connected_count(n) > before[n] for n in followers),
              "the Redis workers to subscribe again", c.cfg.recover_timeout)
        self._recovered(fault)


class Fuzzer(threading.Thread):
    """Connects to the TCP endpoints and sends random bytes; each connection must be answered
    ``ERROR`` and closed by the endpoint."""

    def __init__(self, ports: list[int], interval: float, seed: int, lock: threading.Lock) -> None:
        super().__init__(name="fuzzer", daemon=True)
        self.ports, self.interval, self.lock = ports, interval, lock
        self.rng = random.Random(seed)
        self.outcomes: Counter = Counter()
        self.examples: list[str] = []
        self.stopping = threading.Event()

    def payload(self) -> bytes:
        kind = self.rng.randrange(3)
        n = self.rng.randrange(1, 512)
        if kind == 0:  # any bytes
            data = bytes(self.rng.randrange(256) for _ in range(n))
        elif kind == 1:  # printable junk
            data = bytes(self.rng.randrange(32, 127) for _ in range(n))
        else:  # a known command's name, then bytes that are not UTF-8
            data = self.rng.choice([b"RDATA ", b"POSITION ", b"REPLICATE ", b"NAME ", b"USER_SYNC "]) + \
                b"\xff" + bytes(self.rng.randrange(256) for _ in range(n))
        # The first line must be junk, not empty (an empty line is no command at all).
        if not data.split(b"\n", 1)[0].strip():
            data = b"\x00\xff junk " + data
        return data + b"\n"

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            with self.lock:
                self.outcomes[self.once(self.rng.choice(self.ports))] += 1

    def once(self, port: int) -> str:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            return "refused (endpoint down)"
        payload = self.payload()
        received = b""
        closed = False
        try:
            sock.settimeout(30)
            sock.sendall(payload)
            while chunk := sock.recv(65536):
                received += chunk
            closed = True
        except socket.timeout:
            pass  # not closed
        except OSError:  # reset: closed too
            closed = True
        finally:
            sock.close()
        if closed and b"\nERROR " in b"\n" + received:
            return "ERROR then closed"
        self._example(payload, received)
        return "not closed with ERROR"

    def _example(self, payload: bytes, received: bytes) -> None:
        if len(self.examples) < 5:
            self.examples.append(f"sent {payload[:80]!r}, got {received[-200:]!r}")


class Attackers:
    """Attackers beside the healthy workers (``--attack``), each a thread against
    both TCP endpoints, and a prober that times a new worker's first POSITION:

    * a legacy ``REPLICATE`` storm: every ``storm_every`` s, 4 connections that never read send
      25 ``REPLICATE events 0`` each, and go 3 s later;
    * a ``USER_IP`` flood: connections sending 200 ``USER_IP`` lines with distinct 255-byte
      user IDs (kept, up to REPLICATION_MAX_USER_IPS), then one with a 16 KB ID (refused);
    * idle squatters: ``squatters`` connections per endpoint from the workers' own address
      (more than REPLICATION_MAX_CONNECTIONS_PER_ADDRESS), reopened as the endpoint closes them;
    * ``NAME`` lines with a NUL byte (refused);
    * a long-typing room (with ``typing_url``): every 2 s, 100 users with 255-character IDs
      start typing in one room (the typing writer takes them while the room's row fits one
      line, then answers 429), then stop.
    """

    def __init__(self, ports: list[int], *, squatters: int = 250, storm_every: float = 5.0,
                 probe_every: float = 0.25, typing_url: str | None = None, secret: str = "") -> None:
        self.ports, self.squatters, self.storm_every, self.probe_every = ports, squatters, storm_every, probe_every
        self.typing_url, self.secret = typing_url, secret
        self.stopping = threading.Event()
        self.outcomes: Counter = Counter()
        #: the prober's times to the first POSITION: "before" the attack (the baseline of the
        #: same run) and "during" it
        self.first_position_ms: dict[str, list[float]] = {"before": [], "during": []}
        self.lock = threading.Lock()
        # The prober is a process of its own: the attackers' threads here must not hold its GIL.
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.probe_stop, self.probe_during, self.probe_out = ctx.Event(), ctx.Event(), ctx.Queue()
        self.prober = ctx.Process(target=probe_loop, name="probe", daemon=True,
                                  args=(ports, probe_every, self.probe_stop, self.probe_during, self.probe_out))
        self.threads = [threading.Thread(target=f, name=f.__name__, daemon=True)
                        for f in (self._storm, self._user_ip_flood, self._squat, self._nul_names,
                                  *([self._long_typing_room] if typing_url else []))]

    def start_probe(self) -> None:
        self.prober.start()

    def start(self) -> None:
        self.probe_during.set()
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stopping.set()
        self.probe_stop.set()
        for t in self.threads:
            if t.is_alive():
                t.join(timeout=30)
        if self.prober.is_alive() or self.prober.exitcode is not None:
            import queue

            while True:
                try:
                    item = self.probe_out.get(timeout=30)
                except queue.Empty:
                    break  # the prober died: what it measured so far
                if item is None:
                    break
                phase, ms = item
                if ms is None:
                    self._count("probe without POSITION")
                else:
                    self.first_position_ms[phase].append(ms)
            self.prober.join(timeout=30)

    def _count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.outcomes[what] += n

    @staticmethod
    def _connect(port: int, rcvbuf: int | None = None) -> socket.socket | None:
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(5)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            sock.close()
            return None
        return sock

    @staticmethod
    def _read_to_close(sock: socket.socket, timeout: float = 10) -> bytes:
        sock.settimeout(timeout)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except OSError:
            pass
        sock.close()
        return received

    def _storm(self) -> None:
        while not self.stopping.wait(self.storm_every - 3.0):
            socks = [s for port in self.ports for s in (self._connect(port, rcvbuf=4096) for _ in range(4)) if s]
            for s in socks:
                try:
                    s.sendall(b"NAME storm\n" + b"REPLICATE events 0\n" * 25)
                except OSError:
                    pass
            self._count("storm connections", len(socks))
            self.stopping.wait(3.0)
            for s in socks:
                s.close()

    def _user_ip_flood(self) -> None:
        # Distinct 255-byte user IDs, made cheaply: this process also times the prober.
        prefix, n = "@" + "u" * 229, 0
        while not self.stopping.wait(1.0):
            for port in self.ports:
                sock = self._connect(port)
                if sock is None:
                    continue
                lines = [b"NAME flood\nPING 1\nREPLICATE \n"]
                for _ in range(200):
                    n += 1
                    lines.append(f'USER_IP {prefix}{n:012d}:soak.example ["tok","10.0.0.1","UA",null,1]\n'.encode())
                lines.append(b'USER_IP @' + b"u" * 16_000 + b':soak.example ["tok","10.0.0.1","UA",null,1]\n')
                try:
                    sock.sendall(b"".join(lines))
                except OSError:
                    pass
                received = self._read_to_close(sock)
                self._count("USER_IP 16 KB ID refused" if b"ERROR invalid USER_IP" in received
                            else "USER_IP 16 KB ID not refused")

    def _long_typing_room(self) -> None:
        from replication.http.typing_changes import send_typing

        assert self.typing_url is not None
        room = "!long-typing:soak.example"
        users = [f"@{n:03d}{'t' * 237}:soak.example" for n in range(100)]  # 255 characters
        while not self.stopping.wait(2.0):
            try:
                send_typing(self.typing_url, [{"room_id": room, "user_id": u, "typing": True} for u in users],
                            secret=self.secret)
                self._count("long typing row not refused")
            except RuntimeError as e:
                self._count("long typing row refused" if "answered 429" in str(e) and "typing row" in str(e)
                            else "long typing request failed")
            except OSError:
                self._count("long typing request failed")
            try:
                send_typing(self.typing_url, [{"room_id": room, "user_id": u, "typing": False} for u in users],
                            secret=self.secret)
            except (RuntimeError, OSError):
                self._count("long typing request failed")

    def _nul_names(self) -> None:
        while not self.stopping.wait(2.0):
            for port in self.ports:
                sock = self._connect(port)
                if sock is None:
                    continue
                try:
                    sock.sendall(b"NAME evil\x00name\nPING 1\nREPLICATE \n")
                except OSError:
                    pass
                received = self._read_to_close(sock)
                self._count("NUL NAME refused" if b"ERROR invalid NAME" in received else "NUL NAME not refused")

    def _squat(self) -> None:
        open_: dict[int, list[socket.socket]] = {port: [] for port in self.ports}
        while not self.stopping.wait(0.5):
            for port, socks in open_.items():
                alive = []
                for s in socks:
                    try:
                        data = s.recv(65536, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        alive.append(s)
                        continue
                    except OSError:
                        data = b""
                    if data and b"ERROR" not in data:
                        alive.append(s)  # SERVER, PING: still open
                        continue
                    self._count("squatters closed by the endpoint")
                    s.close()
                while len(alive) < self.squatters and not self.stopping.is_set():
                    s = self._connect(port)
                    if s is None:
                        break
                    alive.append(s)
                    self._count("squatter connections")
                open_[port] = alive
        for socks in open_.values():
            for s in socks:
                s.close()


def probe_loop(ports: list[int], every: float, stop, during, out) -> None:
    """A new worker every ``every`` s (in a process of its own): NAME, PING, REPLICATE; puts
    (phase, ms until its first POSITION line, or None) on ``out``, then None when stopped."""
    i = 0
    while not stop.wait(every):
        phase = "during" if during.is_set() else "before"
        port = ports[i % len(ports)]
        i += 1
        started = time.perf_counter()
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            out.put((phase, None))
            continue
        try:
            sock.sendall(f"NAME probe\nPING {int(time.time() * 1000)}\nREPLICATE \n".encode())
            buf = b""
            while b"\nPOSITION " not in b"\n" + buf:
                chunk = sock.recv(65536)
                if not chunk:
                    raise OSError(f"closed: {buf[-100:]!r}")
                buf += chunk
            out.put((phase, (time.perf_counter() - started) * 1000))
        except OSError:
            out.put((phase, None))
        finally:
            sock.close()
    out.put(None)


class HealthFlood:
    """``--attack``'s health-probe flood against the web process: every ``every``
    s, ``clients`` anonymous clients send ``GET /health/ready`` back to back for ``seconds``
    s (each giving up after 2 s and asking again); the web process's threads, PostgreSQL
    connections and VmRSS are sampled each second. Figures (before the first flood, highest
    during any, highest 10 s after each, the goal being within +5 of before):
    :attr:`figures`; the probes' answers: :attr:`outcomes`."""

    SETTLE = 10.0  #: seconds after a flood when its "after" sample is taken

    def __init__(self, web_port: int, web_pid: int, pg_port: int, *, clients: int = 40, seconds: float = 15.0,
                 every: float = 60.0) -> None:
        self.url = f"http://127.0.0.1:{web_port}/health/ready"
        self.pid, self.pg_port = web_pid, pg_port
        self.clients, self.seconds, self.every = clients, seconds, every
        self.stopping, self.flooding = threading.Event(), threading.Event()
        self.outcomes: Counter = Counter()
        self.lock = threading.Lock()
        self.before: dict[str, int] = {}
        self.during: dict[str, int] = {}
        self.after: dict[str, int] = {}
        self.threads = [threading.Thread(target=self._client, daemon=True, name=f"health-flood-{i}")
                        for i in range(clients)]
        self.threads.append(threading.Thread(target=self._schedule, daemon=True, name="health-flood"))

    def start(self) -> None:
        """The baseline ("before") once the web process has answered a second of probes from
        8 clients (concurrent requests start the thread pools it keeps, at their bounded
        size: the process's working state, not what a flood leaves), then the flood."""
        warm = [threading.Thread(target=lambda: [self._probe() for _ in range(3)], daemon=True) for _ in range(8)]
        for t in warm:
            t.start()
        for t in warm:
            t.join(timeout=30)
        time.sleep(2)
        self.before = self.sample()
        self.during, self.after = dict(self.before), {k: 0 for k in self.before}
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        """Stop flooding; the last "after" sample is taken :attr:`SETTLE` s later."""
        self.stopping.set()
        self.flooding.clear()
        for t in self.threads:
            t.join(timeout=30)
        time.sleep(self.SETTLE)
        self._record(self.after)

    @property
    def figures(self) -> dict[str, tuple[int, int, int]]:
        return {k: (self.before[k], self.during[k], self.after[k]) for k in self.before}

    def sample(self) -> dict[str, int]:
        return {"threads": (status_field(self.pid, "Threads:") or 0), "PostgreSQL connections": self._pg_connections(),
                "RSS MiB": (rss_kib(self.pid) or 0) // 1024}

    def _pg_connections(self) -> int:
        """The web process's established TCP connections to PostgreSQL (its sockets' inodes
        in /proc/<pid>/net/tcp)."""
        inodes = set()
        try:
            for fd in os.listdir(f"/proc/{self.pid}/fd"):
                link = os.readlink(f"/proc/{self.pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            return 0
        count = 0
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{self.pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if (fields[3] == "01" and fields[9] in inodes
                        and int(fields[2].rsplit(":", 1)[1], 16) == self.pg_port):
                    count += 1
        return count

    def _probe(self) -> str:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url, timeout=2) as response:
                return str(response.status)
        except urllib.error.HTTPError as e:
            return str(e.code)
        except OSError as e:
            return type(e).__name__

    def _client(self) -> None:
        while not self.stopping.is_set():
            if self.flooding.wait(0.5):
                outcome = self._probe()
                with self.lock:
                    self.outcomes[f"health probes {outcome}"] += 1

    def _schedule(self) -> None:
        while not self.stopping.is_set():
            self.flooding.set()
            ends = time.monotonic() + self.seconds
            while time.monotonic() < ends and not self.stopping.wait(1.0):
                self._record(self.during)
            self.flooding.clear()
            if self.stopping.wait(self.SETTLE):
                return
            self._record(self.after)
            self.stopping.wait(max(0.0, self.every - self.seconds - self.SETTLE))

    def _record(self, into: dict[str, int]) -> None:
        for k, v in self.sample().items():
            into[k] = max(into[k], v)




#: The endpoints log every loop wake-up later than this (their own stalls, beside the probes' times).
LOOP_LAG_MS = 20
LOOP_LAG = re.compile(rb"event loop ran late: (\d+) wake-up\(s\) over \d+ ms, worst (\d+) ms")


def loop_lag(tmp: Path) -> tuple[int, int]:
    """(late wake-ups, the worst in ms) over every endpoint log."""
    late = worst = 0
    for log in tmp.glob("endpoint*.log"):
        for n, ms in LOOP_LAG.findall(log.read_bytes()):
            late, worst = late + int(n), max(worst, int(ms))
    return late, worst


def disconnect_reasons(tmp: Path) -> Counter:
    """``disconnected: <reason>`` lines of every endpoint log, by reason (the dashboard's names)."""
    from replication.endpoint.connection_records import disconnect_reason

    counts: Counter = Counter()
    for log in tmp.glob("endpoint*.log"):
        for _name, _peer, reason in DISCONNECTED.findall(log.read_bytes()):
            counts[disconnect_reason(reason.decode(errors="replace").strip())] += 1
    return counts


def database_facts(pg_url: str) -> set[tuple[str, int]]:
    import psycopg

    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT instance_name, stream_ordering FROM events WHERE stream_ordering > 0").fetchall()
    return {(w, int(t)) for w, t in rows}


def read_stamps(path: Path) -> dict[int, float]:
    stamps: dict[int, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:
                    stamps[int(parts[0])] = float(parts[1])
                except ValueError:
                    pass  # torn by a SIGKILL
    return stamps


def run(cfg: SoakConfig, pg_url: str, redis: RedisServer, tmp: Path) -> SoakResult:
    """One soak run on a migrated database and a running Redis; everything it starts is stopped."""
    random.seed(cfg.seed)
    t0 = time.monotonic()
    busy0 = machine_busy()

    def log(msg: str) -> None:
        if cfg.progress:
            print(f"[{time.monotonic() - t0:6.1f} s] {msg}", flush=True)

    cluster = SoakCluster(pg_url, redis, tmp, cfg)
    n_redis = min(cfg.n_redis_workers, cfg.workers)
    for i in range(cfg.workers):
        cluster.workers[f"wk{i:02d}"] = "redis" if i >= cfg.workers - n_redis else "tcp"
    result = SoakResult()
    injector = fuzzer = attackers = None
    health_flood: HealthFlood | None = None
    stop_watch = threading.Event()
    try:
        cluster.start_web()
        for i in range(len(cluster.endpoint_ports)):
            cluster.start_endpoint(i)
        for name in cluster.workers:
            cluster.start_worker(name)
            cluster.tails[name] = JsonlTail(tmp / f"{name}.jsonl")
        _wait(lambda: all(cluster.connected_count(n) >= 1 for n in cluster.workers), "every worker to follow",
              cfg.startup_timeout)
        log(f"{cfg.workers} workers ({n_redis} on Redis) follow 2 endpoints; writers start")

        def watch() -> None:
            last_print = time.monotonic()
            while not stop_watch.wait(1.0):
                cluster.sample_rss()
                if cfg.progress and time.monotonic() - last_print >= 30:
                    last_print = time.monotonic()
                    for tail in cluster.tails.values():
                        tail.poll()
                    counts = [len(t.seen) for t in cluster.tails.values()]
                    written = sum(cluster.stamps_path(w).read_bytes().count(b"\n") for w in WRITERS
                                  if cluster.stamps_path(w).exists())
                    log(f"{written} written, workers have {min(counts)}..{max(counts)}")

        threading.Thread(target=watch, name="watch", daemon=True).start()
        for w in WRITERS:
            cluster.start_writer(w)
        # Faults start once every writer has committed: a writer killed before its first commit
        # (a slow start on a loaded machine) has no stamps to be compared with after its restart.
        _wait(lambda: all(cluster.stamps_path(w).exists() and cluster.stamps_path(w).stat().st_size
                          for w in WRITERS), "every writer to commit", cfg.startup_timeout)
        start = time.monotonic()
        injector = FaultInjector(cluster, start + cfg.duration, log)
        fuzzer = Fuzzer(cluster.endpoint_ports, cfg.fuzz_interval, cfg.seed, cluster.endpoint_lock)
        if cfg.attack:
            attackers = Attackers(cluster.endpoint_ports, squatters=cfg.squatters,
                                  typing_url=f"http://127.0.0.1:{cluster.web_port}", secret=cluster.env["REPLICATION_SECRET"])
            attackers.start_probe()
            time.sleep(10)  # the endpoints settled under the writers' load, probed: the baseline
            endpoints = {f"endpoint{i}": cluster.by_name[f"endpoint{i}"].pid for i in range(len(cluster.endpoint_ports))}
            endpoints["web"] = cluster.by_name["web"].pid  # the typing writer, under the long-typing room
            baseline = {name: rss_kib(pid) or 0 for name, pid in endpoints.items()}
            attackers.start()
            health_flood = HealthFlood(cluster.web_port, cluster.by_name["web"].pid, urlsplit(pg_url).port or 5432)
            health_flood.start()
            log("attackers start; endpoint RSS before: "
                + ", ".join(f"{n} {kib / 1024:.1f} MiB" for n, kib in sorted(baseline.items())))
        if cfg.faults:
            injector.start()
        fuzzer.start()
        while time.monotonic() < start + cfg.duration or injector.is_alive():
            time.sleep(0.5)
            if not injector.is_alive() and injector.error:
                break
        fuzzer.stopping.set()
        fuzzer.join()
        if cfg.faults:
            injector.join()
        if injector.error:
            log(f"fault injector stopped: {injector.error}")
        if attackers is not None:
            attackers.stop()
            cluster.sample_rss()
            with cluster.lock:
                for name, pid in endpoints.items():
                    samples = [kib for _, kib in cluster.rss_samples.get((name, pid), [])]
                    if samples:
                        result.endpoint_rss_kib[name] = (baseline[name], max(samples), samples[-1])
            health_flood.stop()
            result.health_flood = health_flood.figures
            result.attack = dict(attackers.outcomes + health_flood.outcomes)
            result.first_position_ms = {phase: _summary(ms) for phase, ms in attackers.first_position_ms.items()}

        # Stop writing (SIGTERM: after the transaction in progress), then let workers drain.
        for w in WRITERS:
            proc = cluster.by_name[f"writer-{w}"]
            with cluster.lock:
                cluster.expected_exit.add(proc.pid)
            proc.send_signal(signal.SIGTERM)
        for w in WRITERS:
            proc = cluster.by_name[f"writer-{w}"]
            try:
                result.writer_exits[w] = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                result.writer_exits[w] = None
        expected = database_facts(pg_url)
        log(f"writers stopped: {len(expected)} facts in the database; waiting for workers to have them all")

        def drained() -> bool:
            for tail in cluster.tails.values():
                tail.poll()
            return all(expected <= tail.seen.keys() for tail in cluster.tails.values())

        try:
            _wait(drained, "every worker to have every fact", cfg.drain_timeout, interval=0.5)
        except TimeoutError as e:
            log(str(e))
        cluster.sample_rss()
        result.crashes = cluster.unexpected_exits()
        result.disconnects = dict(disconnect_reasons(tmp))  # before the shutdown adds its own
        result.loop_late, result.loop_worst_ms = loop_lag(tmp)
    finally:
        stop_watch.set()
        if fuzzer is not None:
            fuzzer.stopping.set()
        if attackers is not None:
            attackers.stopping.set()
            attackers.probe_stop.set()
        if health_flood is not None:
            health_flood.stopping.set()
        cluster.stop_all()
        if redis.proc is None or redis.proc.poll() is not None:
            redis.start(port=redis.port)

    for tail in cluster.tails.values():
        tail.poll()
    result.seconds = time.monotonic() - t0
    result.written = len(expected)
    result.written_per_writer = dict(Counter(w for w, _ in expected))
    for name, tail in sorted(cluster.tails.items()):
        result.delivered[name] = len(tail.seen)
        result.duplicates[name] = tail.duplicates
        result.unexpected[name] = len(tail.seen.keys() - expected)
        result.missing[name] = len(expected - tail.seen.keys())
    result.fuzz = dict(fuzzer.outcomes)
    result.faults = injector.faults
    if injector.error:
        result.crashes.append(f"fault injector: {injector.error}")
    result.peak_rss_kib = dict(cluster.peaks)
    result.rss_over_time_kib = cluster.rss_over_time()
    stamps = {w: read_stamps(cluster.stamps_path(w)) for w in WRITERS}
    windows = [(f.killed_wall, f.killed_wall + (f.recovered_after or 1e9) + 2) for f in injector.faults]
    latencies, steady = [], []
    for tail in cluster.tails.values():
        for (w, t), at in tail.seen.items():
            committed = stamps[w].get(t)
            if at is None or committed is None:
                continue
            latencies.append((at - committed) * 1000)
            if not any(a <= committed <= b for a, b in windows):
                steady.append(latencies[-1])
    result.latency_ms, result.steady_latency_ms = _summary(latencies), _summary(steady)
    result.load = os.getloadavg()
    result.machine_busy_s, result.cores = machine_busy() - busy0, os.cpu_count() or 1
    for (name, _pid), cpu in cluster.cpu.items():
        kind = "workers" if name.startswith("wk") else name.rstrip("0123456789").rstrip("-")
        result.cpu_by_kind[kind] = result.cpu_by_kind.get(kind, 0.0) + cpu
    if fuzzer.examples:
        print("fuzzer: connections not closed with ERROR, e.g.:\n  " + "\n  ".join(fuzzer.examples))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults (default 600)")
    parser.add_argument("--workers", type=int, default=20, help="worker processes (default 20)")
    parser.add_argument("--redis-workers", type=int, default=None,
                        help="how many of them follow Redis directly (default: one in six)")
    parser.add_argument("--rate", type=float, default=50.0, help="facts per second per writer (default 50)")
    parser.add_argument("--fault-pause", type=float, default=5.0,
                        help="seconds between a fault's recovery and the next fault (default 5)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--attack", action="store_true",
                        help="attackers beside the workers: legacy REPLICATE storm, USER_IP flood "
                             "with long IDs, idle squatters, NUL names, and a /health/ready flood against the web "
                             "process; reports endpoint RSS, a new worker's time to its first POSITION, and the "
                             "web process's threads and PostgreSQL connections")
    parser.add_argument("--no-faults", action="store_true", help="no fault injector (the fuzzer still runs)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, jsonl files)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.duration < 0 or args.rate <= 0:
        parser.error("--workers >= 1, --duration >= 0, --rate > 0")
    cfg = SoakConfig(duration=args.duration, workers=args.workers, redis_workers=args.redis_workers,
                     rate=args.rate, fault_pause=args.fault_pause, seed=args.seed,
                     attack=args.attack, faults=not args.no_faults)

    from benchmarks._setup import migrated_database

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="soak_"))
    try:
        with migrated_database("soak", redis=True) as db:
            result = run(cfg, db.url, db.redis, tmp)
            print(result.report(), flush=True)
            return 0 if result.ok else 1
    finally:
        if args.keep:
            print(f"work directory kept: {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

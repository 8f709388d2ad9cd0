"""Commit-to-worker latency on the embedded default, for a writer in a second shell.

    .venv/bin/python benchmarks/bench_embedded.py [--rate 50] [--seconds 20] [--quick]

What ``make run`` starts (``manage.py runservice``: SQLite, no Redis, ``DEMO=0``) in a
throwaway ``STATE_DIR``, a modern TCP worker (``replication_worker --jsonl
--jsonl-timestamps``) and a legacy subscriber (``REPLICATE receipts 0`` on a plain socket, read
by this process), then ``write_facts receipts --rate R --stamps`` from another process, as a
second shell does. Latency per fact: when the worker delivered it (or this process read its
legacy RDATA line) minus when ``write_facts`` saw its transaction complete. Printed: p50, p99
and max per receiver, facts missing or doubled, the worker's catch-up requests, and the
service's CPU per second while the writer runs.

Baseline, same run: the service's CPU per second while idle, for as long (what the scan of
the database costs when nothing happens), and the same measurement with the scan period
set to 1 s (``LOCAL_SCAN_SECONDS=1``, the period of the old position poll) to show what the
period buys. ``--quick``: 8 s per case, the default period only.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from testing.accounting import cpu_seconds  # noqa: E402
from testing.processes import jsonl_records, wait_port  # noqa: E402
from testing.services import free_port  # noqa: E402


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * len(values)) - 1))] if values else float("nan")


def run_case(tmp: Path, rate: float, seconds: float, scan: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "STREAM_WRITERS",
                                                            "INSTANCE_NAME")}
    web, repl = free_port(), free_port()
    env.update(STATE_DIR=str(tmp / "state"), WEB_LISTEN=f"127.0.0.1:{web}", REPLICATION_LISTEN=f"127.0.0.1:{repl}",
               DEMO="0", PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING")
    if scan is not None:
        env["LOCAL_SCAN_SECONDS"] = scan
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput"], cwd=ROOT, env=env, check=True, capture_output=True)
    procs = []
    try:
        with open(tmp / "service.log", "wb") as out:
            service = subprocess.Popen([*manage, "runservice"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        procs.append(service)
        wait_port(repl, service, tmp / "service.log", timeout=60)
        wait_port(web, service, tmp / "service.log", timeout=60)
        legacy = socket.create_connection(("127.0.0.1", repl))
        legacy.sendall(b"REPLICATE receipts 0\n")
        jsonl = tmp / "worker.jsonl"
        with open(tmp / "worker.log", "wb") as out:
            worker = subprocess.Popen([*manage, "replication_worker", "--name", "bench", "--streams", "receipts",
                                       "--jsonl", str(jsonl), "--jsonl-timestamps"],
                                      cwd=ROOT, env={**env, "LOG_LEVEL": "INFO"}, stdout=out, stderr=subprocess.STDOUT)
        procs.append(worker)
        time.sleep(1.0)
        idle_cpu0, idle_t0 = cpu_seconds(service.pid), time.monotonic()
        time.sleep(min(seconds, 5.0))
        idle_cpu = (cpu_seconds(service.pid) - idle_cpu0) / (time.monotonic() - idle_t0)
        stamps = tmp / "stamps.txt"
        count = int(rate * seconds)
        busy_cpu0, busy_t0 = cpu_seconds(service.pid), time.monotonic()
        writer = subprocess.Popen([*manage, "write_facts", "receipts", "--count", str(count), "--rate", str(rate),
                                   "--stamps", str(stamps), "--no-progress"], cwd=ROOT, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        legacy_at: dict[int, float] = {}
        buf = b""
        deadline = time.monotonic() + seconds + 30
        legacy.settimeout(0.05)
        while time.monotonic() < deadline:
            try:
                chunk = legacy.recv(65536)
            except socket.timeout:
                chunk = b""
            now = time.time()
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                m = re.match(rb"RDATA receipts (\d+) ", line)
                if m:
                    legacy_at.setdefault(int(m.group(1)), now)
            if writer.poll() is not None and len(legacy_at) >= count and len(jsonl_records(jsonl)) >= count:
                break
        busy_cpu = (cpu_seconds(service.pid) - busy_cpu0) / (time.monotonic() - busy_t0)
        writer.wait(timeout=30)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        legacy.close()
        committed = {int(i): float(t) for i, t in (line.split() for line in stamps.read_text().splitlines())}
        records = [r for r in jsonl_records(jsonl) if r["stream"] == "receipts"]
        worker_at: dict[int, float] = {}
        doubled = 0
        for r in records:
            doubled += r["token"] in worker_at
            worker_at.setdefault(r["token"], r["at"])
        catch_ups = re.findall(r"(\d+) catch-up requests", (tmp / "worker.log").read_text())
        result = {"facts": len(committed), "idle_cpu": idle_cpu, "busy_cpu": busy_cpu,
                  "catch_ups": int(catch_ups[-1]) if catch_ups else None}
        for name, at in (("worker", worker_at), ("legacy", legacy_at)):
            lat = [(at[i] - t) * 1000 for i, t in committed.items() if i in at]
            result[name] = {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "max": max(lat, default=float("nan")),
                            "missing": len(set(committed) - set(at)), "extra": len(set(at) - set(committed))}
        result["worker"]["doubled"] = doubled
        return result
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=50.0, help="facts/s of the second-shell writer")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long it writes, per case")
    parser.add_argument("--quick", action="store_true", help="8 s, the default scan period only")
    args = parser.parse_args()
    seconds = 8.0 if args.quick else args.seconds
    cases = [("default (LOCAL_SCAN_SECONDS=0.2)", None)] + ([] if args.quick else [("LOCAL_SCAN_SECONDS=1", "1")])
    print(f"write_facts receipts --rate {args.rate:g} for {seconds:g} s from another process; "
          "latency = delivered - committed (ms)")
    print(f"{'case':36} {'receiver':8} {'facts':>6} {'p50':>7} {'p99':>7} {'max':>7} {'missing':>8} "
          f"{'extra':>6} {'catch-ups':>9} {'CPU idle':>9} {'CPU busy':>9}")
    failed = False
    for label, scan in cases:
        with tempfile.TemporaryDirectory(prefix="bench_embedded_") as tmp:
            r = run_case(Path(tmp), args.rate, seconds, scan)
        for receiver in ("worker", "legacy"):
            x = r[receiver]
            extra = x["extra"] + x.get("doubled", 0)
            failed |= bool(x["missing"] or extra)
            catch = r["catch_ups"] if receiver == "worker" else "-"
            print(f"{label:36} {receiver:8} {r['facts']:>6} {x['p50']:>7.1f} {x['p99']:>7.1f} {x['max']:>7.1f} "
                  f"{x['missing']:>8} {extra:>6} {catch!s:>9} {r['idle_cpu']:>8.1%} {r['busy_cpu']:>8.1%}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

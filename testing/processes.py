"""Running a cluster's processes (``manage.py`` commands, daphne) from a test or a benchmark.

Each process logs to ``<tmp>/<name>.log`` (appended to, so a process restarted under the same
name keeps one log). Used by the multi-process tests (tests/replication/test_cluster.py
and its neighbours) and by ``benchmarks/soak.py``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def jsonl_records(path: Path) -> list:
    """The JSON records of a file another process is appending to: complete lines only (the
    writer may be half way through the last one); [] while the file does not exist."""
    if not path.exists():
        return []
    *complete, _partial = path.read_text().split("\n")
    return [json.loads(line) for line in complete if line.strip()]


def tail(path: Path, n: int = 30) -> str:
    """The last ``n`` lines of a log, '' if it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen, timeout: float = 10, *, group: bool = False) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds; reaped either way.
    ``group``: the signals go to its whole process group (a service and the children it
    started; it must have been started with ``start_new_session=True``)."""
    send = (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    if proc.poll() is None:
        send(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()


def wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    """Until something listens on loopback ``port``; raises if ``proc`` exits or time runs out,
    and then stops ``proc`` first: a fixture that raises before its ``yield`` never reaches
    its own clean-up, and a process left running would load the rest of the run."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc)
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise RuntimeError(f"{proc.args} did not start:\n{tail}") from None
            time.sleep(0.1)


class ProcessGroup:
    """Processes of one test or run, each logging to ``tmp/<name>.log``.

    ``by_name`` holds the latest process started under each name (after a restart, the new one).
    """

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env: dict[str, str] = {}
        self.procs: list[subprocess.Popen] = []
        self.by_name: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        with open(self.tmp / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**self.env, **(env or {})},
                                    stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self.by_name[name] = proc
        return proc

    def log_count(self, name: str, text: str) -> int:
        """How many times ``text`` occurs in process ``name``'s log so far."""
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace").count(text) if path.exists() else 0

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def database_url(alias: str = "default") -> str:
    """The URL of the PostgreSQL database Django's ``alias`` connection points at (the test
    database in a test), for the processes a test or a module fixture starts."""
    from django.db import connections

    d = connections[alias].settings_dict
    return f"postgres://{d['USER']}@{d['HOST']}:{d['PORT']}/{d['NAME']}"


def web_answers(base: str) -> bool:
    """Whether the web process at ``base`` answers HTTP at all (any status: it is up)."""
    try:
        urllib.request.urlopen(f"{base}/admin/login/", timeout=2)
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False

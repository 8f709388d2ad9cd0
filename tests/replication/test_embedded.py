"""The embedded default as ``make run`` starts it (``manage.py runservice``: SQLite, no Redis),
with facts written by ``write_facts`` from other processes, as a second shell does: a modern
worker (``replication_worker --jsonl``) and a legacy netcat-style subscriber (``REPLICATE
receipts 0``) receive every fact as RDATA, none missing, none twice, without HTTP catch-up.
And the service is never half-alive: a port in use stops it in one line; a child that dies is
restarted."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testing.processes import jsonl_records, wait_port
from testing.services import free_port

ROOT = Path(__file__).resolve().parents[2]
STREAMS = ("receipts", "caches", "events")


def embedded_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "STREAM_WRITERS",
                                                            "INSTANCE_NAME")}
    env.update({"STATE_DIR": str(tmp_path / "state"), "WEB_LISTEN": f"127.0.0.1:{free_port()}",
                "REPLICATION_LISTEN": f"127.0.0.1:{free_port()}", "DEMO": "0", "PYTHONUNBUFFERED": "1",
                **extra})
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


class Service:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "runservice"], cwd=ROOT, env=env,
                                         stdout=out, stderr=subprocess.STDOUT)
        wait_port(port_of(env["WEB_LISTEN"]), self.proc, log, timeout=60)
        wait_port(port_of(env["REPLICATION_LISTEN"]), self.proc, log, timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def migrated_state(tmp_path_factory) -> Path:
    """A STATE_DIR that ``manage.py migrate`` made, once per module: each test starts from a
    copy of its database (what a migrate would make there, for a fraction of its cost)."""
    tmp = tmp_path_factory.mktemp("embedded")
    env = embedded_env(tmp)
    migrated = manage(env, "migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    return Path(env["STATE_DIR"])


def migrated_env(tmp_path: Path, template: Path, **extra: str) -> dict[str, str]:
    """:func:`embedded_env` with the migrated database copied into its STATE_DIR."""
    env = embedded_env(tmp_path, **extra)
    state = Path(env["STATE_DIR"])
    state.mkdir(mode=0o700)
    for f in template.glob("db.sqlite3*"):
        shutil.copy2(f, state / f.name)
    return env


@pytest.fixture
def embedded(tmp_path, migrated_state):
    env = migrated_env(tmp_path, migrated_state)
    service = Service(env, tmp_path / "service.log")
    yield service
    service.stop()


def legacy_subscribe(port: int, stream: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"REPLICATE {stream} 0\n".encode())
    return sock


def read_available(sock: socket.socket, buf: bytearray, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return
        if not chunk:
            return
        buf += chunk


def wait_until(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def database_facts(state_dir: Path) -> dict[str, dict[int, str]]:
    """Per stream: stream ID -> writer, from the SQLite file (what every worker must get)."""
    tables = {"receipts": "receipts_linearized", "caches": "cache_invalidation_stream_by_instance",
              "events": "events"}
    db = sqlite3.connect(state_dir / "db.sqlite3")
    try:
        id_columns = {"events": "stream_ordering"}
        return {s: dict(db.execute(f"SELECT {id_columns.get(s, 'stream_id')}, instance_name FROM {t}"))
                for s, t in tables.items()}
    finally:
        db.close()


def test_other_processes_facts_reach_modern_and_legacy_workers_as_rdata(embedded, tmp_path):
    env = embedded.env
    rport = port_of(env["REPLICATION_LISTEN"])
    legacy = {stream: legacy_subscribe(rport, stream) for stream in ("receipts", "caches")}
    jsonl = tmp_path / "worker.jsonl"
    with open(tmp_path / "worker.log", "wb") as out:
        worker = subprocess.Popen([sys.executable, "manage.py", "replication_worker", "--name", "w1",
                                   "--jsonl", str(jsonl), "--streams", ",".join(STREAMS)],
                                  cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    legacy_bufs = {stream: bytearray() for stream in legacy}
    try:
        # Subscribed before anything is written (so there is no position to catch up to).
        wait_until(lambda: "replication connected to" in (tmp_path / "worker.log").read_text(), "the worker")
        for stream, sock in legacy.items():
            wait_until(lambda: read_available(sock, legacy_bufs[stream], 0.1) or
                       f"POSITION {stream} ".encode() in legacy_bufs[stream], f"legacy {stream}")
        time.sleep(0.5)  # the worker's REPLICATE answered
        # Three writers in other processes at once, as from other shells.
        writers = [subprocess.Popen([sys.executable, "manage.py", "write_facts", stream, "--count", str(count),
                                     "--rate", "400", "--no-progress"], cwd=ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for stream, count in (("receipts", 300), ("caches", 200), ("events", 150))]
        for w in writers:
            out, err = w.communicate(timeout=120)
            assert w.returncode == 0, err
        expected = database_facts(Path(env["STATE_DIR"]))
        assert {s: len(f) for s, f in expected.items()} == {"receipts": 300, "caches": 200, "events": 150}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = jsonl_records(jsonl)
            if len(got) >= sum(len(f) for f in expected.values()):
                break
            time.sleep(0.2)
        for stream, sock in legacy.items():
            read_available(sock, legacy_bufs[stream], 1.0)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=20)
        for sock in legacy.values():
            sock.close()

    # The modern worker: every fact once, from RDATA (its summary counts catch-up requests and
    # the updates they brought: REPLICATE announced the streams nobody had written to yet at
    # their start, which a new worker asks about and gets nothing).
    got = jsonl_records(jsonl)
    delivered = {s: [(r["token"], r["writer"]) for r in got if r["stream"] == s] for s in STREAMS}
    for stream in STREAMS:
        assert sorted(delivered[stream]) == sorted(expected[stream].items()), stream
        assert len(delivered[stream]) == len(set(delivered[stream])), f"{stream}: a fact twice"
    log = (tmp_path / "worker.log").read_text()
    assert re.search(r" \d+ catch-up requests \(0 failed, 0 updates\)", log), log[-2000:]

    # The legacy subscribers: every fact as RDATA once, and no POSITION above a missing fact.
    for stream, buf in legacy_bufs.items():
        tokens, positions = [], []
        for line in buf.decode().splitlines():
            parts = line.split(" ", 3)
            if parts[0] == "RDATA" and parts[1] == stream:
                tokens.append(int(parts[2]))
            elif parts[0] == "POSITION":
                positions.append((int(parts[2]), len(tokens)))
        assert sorted(tokens) == sorted(expected[stream]), stream
        assert len(tokens) == len(set(tokens)), f"{stream}: a fact twice"
        for token, seen in positions:
            # "POSITION s t" says "you have everything up to t": it must be true when sent.
            assert {t for t in expected[stream] if t <= token} <= set(tokens[:seen]), (stream, token)


@pytest.mark.parametrize("taken", ["REPLICATION_LISTEN", "WEB_LISTEN"])
def test_a_port_in_use_stops_the_service_in_one_line(tmp_path, migrated_state, taken):
    env = migrated_env(tmp_path, migrated_state)
    holder = socket.socket()
    holder.bind(("127.0.0.1", port_of(env[taken])))
    holder.listen()
    try:
        result = manage(env, "runservice", timeout=60)
    finally:
        holder.close()
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert f"{env[taken]} ({taken})" in lines[0] and "in use" in lines[0] and f"set {taken}" in lines[0]
    # ... and nothing was left serving (the web UI without an endpoint, or the reverse).
    other = "WEB_LISTEN" if taken == "REPLICATION_LISTEN" else "REPLICATION_LISTEN"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port_of(env[other])), timeout=1).close()


def test_a_killed_child_is_restarted(tmp_path, migrated_state):
    env = migrated_env(tmp_path, migrated_state, DEMO="1")
    service = Service(env, tmp_path / "service.log")
    try:
        first = wait_for_child(service.proc.pid, "demo")
        os.kill(first, signal.SIGKILL)
        second = wait_for_child(service.proc.pid, "demo", other_than=first)
        assert second != first
        assert "demo (pid %d) exited (killed by SIGKILL); restarting" % first in service.log.read_text()
        assert service.proc.poll() is None
    finally:
        service.stop()
    assert service.proc.returncode == 0 or service.proc.returncode == -signal.SIGTERM
    time.sleep(0.5)
    assert not children_of(service.proc.pid), "children left behind"


def children_of(pid: int) -> dict[int, str]:
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(line.split(None, 1)[0]): line.split(None, 1)[1] for line in out.splitlines() if line.strip()}


def wait_for_child(pid: int, command: str, other_than: int | None = None, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child, args in children_of(pid).items():
            if args.endswith(f"manage.py {command}") and child != other_than:
                return child
        time.sleep(0.1)
    raise AssertionError(f"no child `{command}` of {pid} within {timeout} s: {children_of(pid)}")

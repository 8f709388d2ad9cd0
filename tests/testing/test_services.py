"""The suite's throwaway servers die with the test process that started them, however it ends
(a test killed by its timeout ends its process without teardown)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STARTER = """
import sys, time
from testing.services import PostgresServer, RedisServer
pg = PostgresServer().start()
redis = RedisServer().start()
print(pg.proc.pid, redis.proc.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return status != "Z"


def test_a_killed_test_process_leaves_no_server_behind():
    starter = subprocess.Popen([sys.executable, "-c", STARTER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = starter.stdout.readline()
        assert line, "the starter printed nothing"
        pids = [int(p) for p in line.split()]
        assert all(alive(p) for p in pids)
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if alive(p)] == []
    finally:
        starter.kill()
        starter.wait()

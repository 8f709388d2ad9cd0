"""One demo and one Celery beat per STATE_DIR (common/state_lock.py): the lock is held
by a live process only, and a second one is refused in one line naming the first's pid."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.state_lock import StateLockHeld, check_free, hold

ROOT = Path(__file__).resolve().parents[2]


def holder(path: Path) -> subprocess.Popen:
    code = ("import sys, time\nfrom pathlib import Path\nfrom common.state_lock import hold\n"
            f"lock = hold(Path({str(path)!r}), 'the thing')\nprint('held', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_second_holder_is_refused_naming_the_first_and_a_killed_one_frees_it(tmp_path):
    path = tmp_path / "thing.lock"
    first = holder(path)
    try:
        with pytest.raises(StateLockHeld) as refused:
            hold(path, "the thing")
        assert refused.value.pid == first.pid
        assert str(refused.value) == (f"the thing is already running (pid {first.pid} holds {path}): "
                                      "stop that one first, or use another STATE_DIR")
        with pytest.raises(StateLockHeld):
            check_free(path, "the thing")
        assert path.read_text() == f"{first.pid}\n"  # the refused ones left it as it was
    finally:
        first.kill()
        first.wait()
    # killed, not let go: the kernel released the lock all the same
    check_free(path, "the thing")
    with hold(path, "the thing"):
        assert path.read_text() == f"{os.getpid()}\n"


def test_never_two_beats_on_one_schedule_file(tmp_path, redis_server):
    """Two ``celery beat`` on one schedule file: the second exits with one line naming the
    first, which goes on."""
    schedule = tmp_path / "celerybeat-schedule"
    env = {**os.environ, "REDIS_URL": redis_server.url, "STATE_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    beat = [sys.executable, "-m", "celery", "-A", "synapse_repl", "beat", "--schedule", str(schedule)]
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(beat, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        lock = Path(f"{schedule}.lock")
        deadline = time.monotonic() + 60
        while not (lock.exists() and lock.read_text() == f"{first.pid}\n"):
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
            time.sleep(0.1)
        second = subprocess.run(beat, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stderr
        refusals = [line for line in second.stderr.splitlines() if "error:" in line]
        assert len(refusals) == 1 and "Traceback" not in second.stderr, second.stderr
        assert refusals[0].endswith(f"error: a celery beat on this schedule file is already running "
                                    f"(pid {first.pid} holds {lock}): stop that one first, or use another "
                                    "STATE_DIR")
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            first.wait(timeout=30)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()

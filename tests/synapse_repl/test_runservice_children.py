"""``runservice``'s children do not outlive it, and run once per ``STATE_DIR``: a ``kill -9``
of the service leaves none of its processes (the demo; the Celery worker, its pool process and
its beat), and a second runservice on the same ``STATE_DIR`` while the first one's demo or beat
runs is refused in one line naming that process (common/lifeline.py, state_lock.py).

Real processes: runservice as ``make run`` starts it, killed with SIGKILL; /proc tells what is
left (testing/process_tree.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.state_lock import check_free
from testing.process_tree import descendants, kill_all, wait_all_gone
from testing.processes import wait_port
from testing.services import free_port

ROOT = Path(__file__).resolve().parents[2]


def service_env(state_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "STREAM_WRITERS", "INSTANCE_NAME", "SPARK_MASTER")}
    env.update({"STATE_DIR": str(state_dir), "WEB_LISTEN": f"127.0.0.1:{free_port()}",
                "REPLICATION_LISTEN": f"127.0.0.1:{free_port()}", "PYTHONUNBUFFERED": "1", **extra})
    return env


def other_ports(env: dict[str, str]) -> dict[str, str]:
    """The same service's environment, on ports of its own (so only STATE_DIR is shared)."""
    return {**env, "WEB_LISTEN": f"127.0.0.1:{free_port()}", "REPLICATION_LISTEN": f"127.0.0.1:{free_port()}"}


class Service:
    """A runservice in a session of its own; :meth:`clean_up` kills whatever of it is left,
    whatever the test found."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log, self.seen = env, log, {}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "runservice"], cwd=ROOT, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(int(env["WEB_LISTEN"].rpartition(":")[2]), self.proc, log, timeout=120)

    def tree(self) -> dict:
        found = descendants(self.proc.pid)
        self.seen.update(found)
        return found

    def wait_tree(self, predicate, what: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while not predicate(tree := self.tree()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {what}: {tree}\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        return tree

    def clean_up(self) -> None:
        if self.proc.poll() is None:
            self.tree()
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        kill_all(self.seen)


def refusal(env: dict[str, str]) -> str:
    """A second runservice's one line (it must exit at once, nothing started)."""
    done = subprocess.run([sys.executable, "manage.py", "runservice"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, (done.returncode, done.stdout, done.stderr)
    return lines[0]


def pid_in(lock: Path) -> int:
    text = lock.read_text().strip() if lock.exists() else ""
    return int(text) if text.isdigit() else 0


def test_embedded_kill_9_leaves_no_demo_and_a_second_start_is_refused(tmp_path):
    state = tmp_path / "state"
    env = service_env(state, DEMO="1")
    migrated = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    assert migrated.returncode == 0, migrated.stderr
    lock = state / "demo.lock"
    services = [Service(env, tmp_path / "first.log")]
    try:
        first = services[0]
        tree = first.wait_tree(lambda t: any(cmd.endswith("manage.py demo") and pid == pid_in(lock)
                                             for (pid, _), cmd in t.items()), "demo holding its lock")
        demo = pid_in(lock)
        assert refusal(other_ports(env)) == (
            f"CommandError: a demo of this STATE_DIR is already running (pid {demo} holds {lock}): "
            "stop that one first, or use another STATE_DIR")
        assert first.tree() == tree  # the refused start touched nothing of the first one

        killed = time.monotonic()
        os.kill(first.proc.pid, signal.SIGKILL)
        assert wait_all_gone(tree) == {}
        print(f"runservice's {len(tree)} processes gone {time.monotonic() - killed:.2f} s after its kill -9")
        check_free(lock, "the demo")  # released with it

        # Started again on the same STATE_DIR: it runs, with one demo (its own).
        services.append(second := Service(other_ports(env), tmp_path / "second.log"))
        again = second.wait_tree(lambda t: any(cmd.endswith("manage.py demo") and pid == pid_in(lock)
                                               for (pid, _), cmd in t.items()), "the new demo")
        assert [cmd for cmd in again.values() if cmd.endswith("manage.py demo")] == [f"{sys.executable} manage.py demo"]
        assert second.proc.poll() is None
    finally:
        for service in services:
            service.clean_up()


@pytest.mark.slow
def test_full_mode_kill_9_leaves_no_celery_worker_pool_or_beat(tmp_path, pg_url, redis_server):
    state = tmp_path / "state"
    env = service_env(state, DATABASE_URL=pg_url, REDIS_URL=redis_server.url, ADMIN_USER="ops",
                      ADMIN_PASSWORD="operator-password-0123456789", REPLICATION_SECRET="s" * 40,
                      API_TOKEN="t" * 40)
    lock = state / "celerybeat-schedule.lock"
    service = Service(env, tmp_path / "service.log")
    try:
        # The worker (runservice's child), its pool process and its beat (the worker's
        # children), the beat holding the schedule's lock.
        tree = service.wait_tree(lambda t: len(t) >= 3 and any(pid == pid_in(lock) for pid, _ in t),
                                 "Celery worker with its beat and pool")
        beat = pid_in(lock)
        assert refusal(other_ports(env)) == (
            f"CommandError: a celery beat on this schedule file is already running (pid {beat} holds {lock}): "
            "stop that one first, or use another STATE_DIR")

        killed = time.monotonic()
        os.kill(service.proc.pid, signal.SIGKILL)
        assert wait_all_gone(tree) == {}
        print(f"runservice's {len(tree)} processes gone {time.monotonic() - killed:.2f} s after its kill -9: "
              f"{sorted(tree.values())}")
        check_free(lock, "beat")
    finally:
        service.clean_up()

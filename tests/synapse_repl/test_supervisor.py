"""runservice's supervision of its children (synapse_repl/supervisor.py): restart with
back-off, give up (and stop the service, with the reason in one line) when a child cannot
start. The policy is pure; the supervisor runs real processes."""
from __future__ import annotations

import sys
import threading

from synapse_repl.supervisor import GiveUp, Restart, RestartPolicy, Supervisor


def test_back_off_doubles_and_starts_over_after_a_healthy_run():
    p = RestartPolicy(first_delay=1, max_delay=4, healthy_after=60, quick_exit=5, max_quick_exits=3)
    assert p.exited("demo", -9, 100.0) == Restart(1)
    assert p.exited("demo", -9, 10.0) == Restart(2)
    assert p.exited("demo", -9, 10.0) == Restart(4)
    assert p.exited("demo", -9, 10.0) == Restart(4)  # capped
    assert p.exited("demo", -9, 61.0) == Restart(1)  # it ran: start over


def test_gives_up_on_a_child_that_keeps_dying_at_start():
    p = RestartPolicy(quick_exit=5, max_quick_exits=3)
    assert isinstance(p.exited("celery worker", 1, 0.5), Restart)
    assert isinstance(p.exited("celery worker", 1, 0.5), Restart)
    decision = p.exited("celery worker", 1, 0.5, "Error: cannot reach Redis")
    assert isinstance(decision, GiveUp)
    assert decision.reason == ("celery worker could not start (3 exits in a row within 5 s, last status 1): "
                               "Error: cannot reach Redis")
    assert "\n" not in decision.reason


def test_a_child_that_cannot_start_stops_the_service_with_its_last_line():
    fatal: list[str] = []
    stopped = threading.Event()
    out: list[str] = []
    sup = Supervisor(on_fatal=lambda reason: (fatal.append(reason), stopped.set()), poll=0.05,
                     out=out.append)
    code = "import sys; print('Traceback...', file=sys.stderr); sys.exit('port 9 is in use')"
    sup.add("broken", [sys.executable, "-c", code],
            policy=RestartPolicy(first_delay=0.05, quick_exit=5, max_quick_exits=2))
    sup.start()
    try:
        assert stopped.wait(30)
    finally:
        sup.stop()
    assert fatal == ["broken could not start (2 exits in a row within 5 s, last status 1): port 9 is in use"]
    assert any("broken (pid" in line and "restarting in 0.05 s" in line for line in out)


def test_a_killed_child_is_restarted_and_what_it_started_goes_with_it():
    """A child whose own children keep its stderr open (Celery's pool and beat): its death is
    still seen, it is restarted, and what it left behind is killed."""
    import os
    import signal
    import time

    out: list[str] = []
    sup = Supervisor(on_fatal=lambda reason: None, poll=0.05, out=out.append)
    code = ("import subprocess, sys, time; "
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('grandchild', g.pid, file=sys.stderr, flush=True); time.sleep(60)")
    child = sup.add("pool", [sys.executable, "-c", code], policy=RestartPolicy(first_delay=0.05))
    sup.start()
    try:
        deadline = time.monotonic() + 30
        while not any(line.startswith("grandchild") for line in out) and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = int(next(line for line in out if line.startswith("grandchild")).split()[1])
        first = child.process.pid
        os.kill(first, signal.SIGKILL)
        while child.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.restarts == 1 and child.process.pid != first
        assert any(f"pool (pid {first}) exited (killed by SIGKILL)" in line for line in out)
        while time.monotonic() < deadline:
            try:
                os.kill(grandchild, 0)
            except ProcessLookupError:
                break
            try:
                if open(f"/proc/{grandchild}/stat").read().split(") ")[1].startswith("Z"):
                    break  # killed; waiting for its parent (init) to reap it
            except FileNotFoundError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the killed child's own child was left running")
    finally:
        sup.stop()

"""The children ``runservice`` starts beside itself (the demo trickle, the Celery worker):
never half-alive. A child that dies is restarted with back-off; a child that cannot start
(it dies again and again within seconds of starting) stops the whole service, with the reason
in one line. Nor do they outlive the service: each is started on the supervisor's lifeline
(common/lifeline.py), so a ``kill -9`` of the service takes each child's whole process
group with it.

:class:`RestartPolicy` holds the decisions (no I/O, no clock of its own); :class:`Supervisor`
runs the processes.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from common.lifeline import Lifeline, kill_group

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restart:
    delay: float


@dataclass(frozen=True)
class GiveUp:
    reason: str


@dataclass
class RestartPolicy:
    """Restart after ``first_delay`` s, doubling to ``max_delay`` while a child keeps dying;
    a child that ran ``healthy_after`` s counts as started and starts the back-off over. A
    child that died ``max_quick_exits`` times in a row each within ``quick_exit`` s of
    starting cannot start: give up."""

    first_delay: float = 1.0
    max_delay: float = 30.0
    healthy_after: float = 60.0
    quick_exit: float = 5.0
    max_quick_exits: int = 3
    failures: int = 0
    quick_exits: int = 0

    def exited(self, name: str, status: int | None, ran_for: float, last_line: str = "") -> Restart | GiveUp:
        if ran_for >= self.healthy_after:
            self.failures = 0
        self.quick_exits = self.quick_exits + 1 if ran_for < self.quick_exit else 0
        if self.quick_exits >= self.max_quick_exits:
            why = f": {last_line}" if last_line else ""
            return GiveUp(f"{name} could not start ({self.quick_exits} exits in a row within "
                          f"{self.quick_exit:g} s, last status {describe_status(status)}){why}")
        delay = min(self.first_delay * 2 ** self.failures, self.max_delay)
        self.failures += 1
        return Restart(delay)


def describe_status(status: int | None) -> str:
    if status is None:
        return "unknown"
    if status < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return str(status)


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    cwd: str | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    last_line: str = ""


class Supervisor:
    """Starts the children, watches them from a thread of its own, restarts the ones that die,
    and calls ``on_fatal(reason)`` (once) when one cannot start. Children's stderr goes on to
    ours, line by line; the last line is kept for the reason."""

    def __init__(self, on_fatal: Callable[[str], None], *, poll: float = 0.2,
                 out: Callable[[str], None] | None = None) -> None:
        self.on_fatal = on_fatal
        self.poll = poll
        self.out = out or (lambda line: (sys.stderr.write(line + "\n"), sys.stderr.flush()))
        self.children: list[Child] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._lifeline: Lifeline | None = None

    def add(self, name: str, argv: Sequence[str], *, cwd: str | None = None,
            policy: RestartPolicy | None = None) -> Child:
        child = Child(name, list(argv), cwd, policy or RestartPolicy())
        self.children.append(child)
        return child

    def start(self) -> None:
        self._lifeline = Lifeline()
        for child in self.children:
            self._spawn(child)
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def _spawn(self, child: Child) -> None:
        with self._lock:
            if self._stopping.is_set() or self._lifeline is None:
                return
            # Its own process group (the lifeline's options): when it dies, whatever it started
            # (Celery's pool and beat processes) goes too, and none of them keeps its stderr
            # pipe open; and when this process dies, the child kills that group itself.
            child.process = subprocess.Popen(child.argv, cwd=child.cwd, stderr=subprocess.PIPE,
                                             text=True, errors="replace", bufsize=1,
                                             **self._lifeline.popen_options())
            child.started_at = time.monotonic()
        threading.Thread(target=self._forward, args=(child, child.process), daemon=True,
                         name=f"supervisor-{child.name}").start()

    def _forward(self, child: Child, process: subprocess.Popen) -> None:
        with process.stderr:  # closed here, by its reader (closing it elsewhere would block)
            for line in process.stderr:
                line = line.rstrip("\n")
                if line.strip():
                    child.last_line = line.strip()
                self.out(line)

    def _watch(self) -> None:
        due: dict[str, float] = {}  # child name -> when to restart it
        while not self._stopping.wait(self.poll):
            now = time.monotonic()
            for child in self.children:
                if child.name in due:
                    if now >= due[child.name]:
                        del due[child.name]
                        self._spawn(child)
                        child.restarts += 1
                        self.out(f"runservice: {child.name} restarted (pid {child.process.pid})")
                    continue
                process = child.process
                if process is None or not exited(process):
                    continue
                kill_group(process.pid)  # what it left behind (its pid not yet free for reuse)
                process.wait()
                ran_for = now - child.started_at
                decision = child.policy.exited(child.name, process.returncode, ran_for, child.last_line)
                if isinstance(decision, GiveUp):
                    self._stopping.set()
                    self.on_fatal(decision.reason)
                    return
                self.out(f"runservice: {child.name} (pid {process.pid}) exited "
                         f"({describe_status(process.returncode)}); restarting in {decision.delay:g} s")
                due[child.name] = now + decision.delay

    def terminate(self) -> None:
        """SIGTERM every child and stop watching (none is restarted); :meth:`stop` waits."""
        with self._lock:
            self._stopping.set()
        for child in self.children:
            if child.process is not None and not exited(child.process):
                child.process.terminate()

    def kill(self) -> None:
        """SIGKILL every child's process group now and stop watching: the last resort of a
        shutdown out of time (no child may outlive this process)."""
        with self._lock:
            self._stopping.set()
        for child in self.children:
            if child.process is not None:
                kill_group(child.process.pid)

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate every child (SIGTERM, then SIGKILL after ``timeout``) and stop watching."""
        self.terminate()
        deadline = time.monotonic() + timeout
        for child in self.children:
            if child.process is None:
                continue
            while not exited(child.process) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not exited(child.process):
                child.process.kill()
                exited(child.process, block=True)
            kill_group(child.process.pid)
            child.process.wait()
        if self._lifeline is not None:
            self._lifeline.cut()


def exited(process: subprocess.Popen, block: bool = False) -> bool:
    """Whether ``process`` has exited, without reaping it: until it is reaped its pid (its
    process group's id) cannot go to another process, so :func:`kill_group` after this hits
    only what the child left behind."""
    if process.returncode is not None:
        return True
    flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
    try:
        return os.waitid(os.P_PID, process.pid, flags) is not None
    except ChildProcessError:  # reaped already (by Popen's own bookkeeping)
        return True

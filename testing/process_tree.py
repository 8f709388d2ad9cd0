"""A process and everything under it, from /proc: for tests that kill a parent and check that
nothing it started is left running.

A process is named by (pid, start time) so that a pid the kernel gives to a new process after
the old one is gone does not count as the old one still alive.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat; None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def alive(proc: Proc) -> bool:
    """Running (a zombie waiting for its reaper is dead) and still the same process."""
    pid, started = proc
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] not in ("Z", "X") and int(fields[19]) == started


def descendants(pid: int) -> dict[Proc, str]:
    """Every process under ``pid`` (children, their children...), with its command line."""
    found: dict[Proc, str] = {}
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except FileNotFoundError:
                continue
            for child in map(int, children):
                started = start_time(child)
                if started is None:
                    continue
                try:
                    cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                except FileNotFoundError:
                    continue
                found[(child, started)] = cmdline
                todo.append(child)
    return found


def wait_all_gone(procs: dict[Proc, str], timeout: float = 30) -> dict[Proc, str]:
    """Poll until none of ``procs`` is alive or ``timeout`` passes; returns those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        left = {proc: cmd for proc, cmd in procs.items() if alive(proc)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def kill_all(procs: dict[Proc, str] | list[Proc]) -> None:
    """SIGKILL whichever of ``procs`` is still the same live process (a test's clean-up)."""
    for proc in procs:
        if alive(proc):
            try:
                os.kill(proc[0], signal.SIGKILL)
            except ProcessLookupError:
                pass

"""One process at a time for what must run once per ``STATE_DIR``: the demo trickle
(``demo.lock``) and Celery beat on its schedule file (``celerybeat-schedule.lock``).

The holder takes an exclusive ``flock`` on the lock file, keeps the file open for its whole
life and writes its pid into it; the kernel releases the lock when the process ends, however it
ends, so a lock is never stale: a held lock is a live process. A second one is refused with one
line naming the holder's pid.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class StateLockHeld(Exception):
    """Another live process holds the lock."""

    def __init__(self, what: str, path: Path, pid: int | None) -> None:
        self.what, self.path, self.pid = what, path, pid
        holder = f"pid {pid}" if pid else "a process that has not yet written its pid"
        super().__init__(f"{what} is already running ({holder} holds {path}): stop that one first, "
                         "or use another STATE_DIR")


def hold(path: Path, what: str) -> IO[str]:
    """Take the lock for this process's life: keep the returned file open (closing it, or the
    process ending, releases the lock). Raises :class:`StateLockHeld`."""
    lock = _take(path, what)
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def check_free(path: Path, what: str) -> None:
    """Raise :class:`StateLockHeld` if a live process holds the lock (taken and let go at once,
    the file left as it was)."""
    _take(path, what).close()


def _take(path: Path, what: str) -> IO[str]:
    lock = open(path, "a+")  # not truncated before it is ours: the holder's pid stays readable
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise StateLockHeld(what, path, holder_pid(path)) from None
    return lock


def holder_pid(path: Path) -> int | None:
    """The pid the holder wrote, None if it has not (yet) or the file is gone."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None

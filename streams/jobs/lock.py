"""One run of a job at a time, across every process of the cluster.

PostgreSQL: a session advisory lock on a connection of its own, so it is released by the
server the moment its holder dies (a crashed job never blocks the next one). SQLite (one
machine): an exclusive ``flock`` on a file in the state directory, released by the kernel the
same way.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from django.conf import settings
from django.db import connections

from ..pg import dedicated_connection


class JobLock:
    """``with JobLock("visibility") as held:`` — ``held`` is False if another run has it."""

    def __init__(self, job: str, using: str = "default") -> None:
        self.job = job
        self.using = using
        self.held = False
        self._conn = None
        self._file = None

    @property
    def key(self) -> int:
        digest = hashlib.blake2b(f"synapse_repl job {self.job}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)

    def acquire(self) -> bool:
        vendor = connections[self.using].vendor
        if vendor == "postgresql":
            self._conn = dedicated_connection(f"synapse_repl job lock {self.job}", self.using)
            self.held = bool(self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0])
            if not self.held:
                self._conn.close()
                self._conn = None
        else:
            path = Path(settings.STATE_DIR) / "locks" / f"job-{self.job}.lock"
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a+")
            try:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
                self._file.seek(0)
                self._file.truncate()
                self._file.write(f"{os.getpid()}\n")
                self._file.flush()
            except BlockingIOError:
                self._file.close()
                self._file = None
        return self.held

    def release(self) -> None:
        if self._conn is not None:
            self._conn.close()  # ends the session: the advisory lock goes with it
            self._conn = None
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        self.held = False

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

"""One run of a job at a time, across every process of the cluster.

PostgreSQL: a session advisory lock on a connection of its own, so it is released by the
server the moment its holder dies (a crashed job never blocks the next one). SQLite (one
machine): an exclusive ``flock`` on a file in the state directory, released by the kernel the
same way. Both are taken in ``dialect.py``.
"""
from __future__ import annotations

import hashlib

from jobs.job_dialect import Closable, for_database


class JobLock:
    """``with JobLock("visibility") as held:`` — ``held`` is False if another run has it."""

    def __init__(self, job: str, using: str = "default") -> None:
        self.job = job
        self.using = using
        self.held = False
        self._handle: Closable | None = None

    @property
    def key(self) -> int:
        digest = hashlib.blake2b(f"synapse_repl job {self.job}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)

    def acquire(self) -> bool:
        self._handle = for_database(self.using).try_lock(self.job, self.key, self.using)
        self.held = self._handle is not None
        return self.held

    @classmethod
    def taken(cls, job: str, using: str = "default") -> bool:
        """Whether another run of ``job`` holds its lock now (tried, and let go at once)."""
        lock = cls(job, using)
        try:
            return not lock.acquire()
        finally:
            lock.release()

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self.held = False

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

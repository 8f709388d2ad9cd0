"""Answers kept under the caller's transaction ID, as Synapse's replication endpoints keep
them (docs/replication.md, "Catch-up").

A Synapse worker adds a fresh random ``<txn_id>`` to the path of each replication request it
makes; the serving process remembers each answer under that ID for 30 minutes, so a request
retried after a lost reply gets the same answer instead of being run twice. The key is the ID
alone: Synapse ignores the rest of the path and the query, so a repeated ID gets the first
answer whatever the stream or tokens asked for (checked against a real Synapse in
tests/interop/). That is why a client must never reuse an ID: it would take a stale answer
for the current one.

Per process, bounded (the oldest entries go first), and with an injectable clock.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Generic, TypeVar

V = TypeVar("V")

#: How long an answer is kept: Synapse's 30 minutes.
DEFAULT_TIMEOUT = 30 * 60.0
#: At most this many answers are kept; beyond, the oldest are dropped. A catch-up answer is
#: at most ~1,000 rows, and a worker asks again only after a gap, so this is far more than a
#: cluster's workers ask for in 30 minutes in normal operation.
DEFAULT_MAX_ENTRIES = 10_000


class TxnResponseCache(Generic[V]):
    """Answers by transaction ID, for ``timeout`` seconds, at most ``max_entries`` of them."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, max_entries: int = DEFAULT_MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, txn_id: str) -> V | None:
        """The answer kept under ``txn_id``, or ``None`` (never kept, or expired)."""
        with self._lock:
            self._expire(self._clock())
            entry = self._entries.get(txn_id)
            return None if entry is None else entry[1]

    def add(self, txn_id: str, answer: V) -> V:
        """Keep ``answer`` under ``txn_id``, unless one is kept already (two requests with the
        same ID running at once): returns the answer that is kept, the first one."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            entry = self._entries.get(txn_id)
            if entry is not None:
                return entry[1]
            self._entries[txn_id] = (now, answer)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return answer

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            txn_id, (stored, _answer) = next(iter(entries.items()))
            if now - stored < self.timeout:
                return
            del entries[txn_id]

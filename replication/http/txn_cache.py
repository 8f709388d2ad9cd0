"""Answers kept under the caller's transaction ID, as Synapse's replication endpoints keep
them (docs/replication.md, "Catch-up").

A Synapse worker adds a fresh random ``<txn_id>`` to the path of each replication request it
makes; the serving process remembers each answer under that ID for 30 minutes, so a request
retried after a lost reply gets the same answer instead of being run twice. The key is the ID
alone: Synapse ignores the rest of the path and the query, so a repeated ID gets the first
answer whatever the stream or tokens asked for (checked against a real Synapse in
tests/interop/). That is why a client must never reuse an ID: it would take a stale answer
for the current one.

Per process, bounded in count and in bytes (the oldest answers go first; one answer larger
than the whole byte budget is served but not kept), with an injectable clock. The bytes are
everything an entry holds: the answer, the ID and the entry's own bookkeeping; and the ID
itself is bounded (:func:`txn_id_problem`), as it comes from the caller.
"""
from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from typing import Callable

#: How long an answer is kept: Synapse's 30 minutes.
DEFAULT_TIMEOUT = 30 * 60.0
#: At most this many answers are kept; beyond, the oldest are dropped. A worker asks only
#: after a gap, so this is far more than a cluster's workers ask for in 30 minutes in normal
#: operation.
DEFAULT_MAX_ENTRIES = 10_000
#: And at most this many bytes of them: a full page (1,000 rows) is ~100-300 KB of JSON, so
#: the count alone could pin gigabytes.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: What an entry costs beyond its answer's and its ID's characters: the ordered dict's node,
#: the (time, answer) tuple and float, the str and bytes headers (measured ~205 bytes with
#: tracemalloc and sys.getsizeof on CPython 3.12).
ENTRY_OVERHEAD = 256
#: Synapse's workers send ``random_string(10)`` (letters; synapse/replication/http/_base.py),
#: ours ``secrets.token_urlsafe(12)`` (16 characters): 64 leaves room for other clients while
#: 10,000 kept IDs stay under a megabyte.
MAX_TXN_ID_LENGTH = 64
_TXN_ID = re.compile(r"[A-Za-z0-9._~-]{1,%d}" % MAX_TXN_ID_LENGTH)


def txn_id_problem(txn_id: str) -> str | None:
    """Why ``txn_id`` is not a transaction ID this endpoint keeps answers under, or ``None``:
    1 to :data:`MAX_TXN_ID_LENGTH` of URL-safe ASCII (letters, digits, ``-._~``)."""
    if _TXN_ID.fullmatch(txn_id):
        return None
    return (f"the transaction ID must be 1 to {MAX_TXN_ID_LENGTH} letters, digits or '-._~' "
            f"(it is {len(txn_id)} characters); Synapse's workers send 10 letters")


def entry_cost(txn_id: str, answer: bytes) -> int:
    """The bytes one kept answer counts for against ``max_bytes``."""
    return len(txn_id) + len(answer) + ENTRY_OVERHEAD


class TxnResponseCache:
    """Answers (JSON bytes) by transaction ID, for ``timeout`` seconds, at most
    ``max_entries`` of them and ``max_bytes`` in all (:func:`entry_cost`)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, txn_id: str) -> bytes | None:
        """The answer kept under ``txn_id``, or ``None`` (never kept, or expired)."""
        with self._lock:
            self._expire(self._clock())
            entry = self._entries.get(txn_id)
            return None if entry is None else entry[1]

    def add(self, txn_id: str, answer: bytes) -> bytes:
        """Keep ``answer`` under ``txn_id``, unless one is kept already (two requests with the
        same ID running at once): returns the answer to give, the first one. An ID that
        :func:`txn_id_problem` refuses is never kept."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            entry = self._entries.get(txn_id)
            if entry is not None:
                return entry[1]
            if entry_cost(txn_id, answer) > self.max_bytes or txn_id_problem(txn_id) is not None:
                return answer
            self._entries[txn_id] = (now, answer)
            self._bytes += entry_cost(txn_id, answer)
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop_oldest()
            return answer

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _drop_oldest(self) -> None:
        txn_id, (_stored, answer) = self._entries.popitem(last=False)
        self._bytes -= entry_cost(txn_id, answer)

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            _txn_id, (stored, _answer) = next(iter(entries.items()))
            if now - stored < self.timeout:
                return
            self._drop_oldest()

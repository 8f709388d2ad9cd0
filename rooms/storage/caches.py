"""The read-side caches of the room event store and their owner.

One :class:`StorageCaches` per stream runtime (that is, per process and database: group IDs
of two databases are unrelated), held by the runtime (``StreamRuntime.storage_caches``),
created on its first read or write and dropped with it. The runtime's persister records its writes in it; the reads given that
runtime (``reads.*(..., runtime=)``; the process runtime by default) read through it.
"""
from __future__ import annotations

import threading
from typing import Any

from rooms.storage.change_cache import StreamChangeCache
from rooms.storage.state_groups import _LRU, StateGroupStore
from streams.runtime import runtime as process_runtime


class ChangeCaches:
    """Per-room and per-user "last change" positions of one database, kept current from the
    tables (so events written by other processes are seen) and by this process's writes."""

    PREFILL = 100_000
    #: the rooms' cache starts from ``rooms.last_stream`` with up to this many rooms: below
    #: that many rooms it knows every room's latest change, so a sync from a token of any age
    #: is answered from memory (from the events of the last PREFILL positions, a token 385,000
    #: positions back at 10 M events asked the database about ~300 rooms: docs/benchmarks.md)
    ROOM_ENTRIES = 100_000

    def __init__(self, using: str) -> None:
        self.using = using
        self.rooms: StreamChangeCache | None = None
        self.members: StreamChangeCache | None = None
        self._fed_upto = 0
        self._lock = threading.Lock()

    def record(self, room_changes: list[tuple[str, int]], member_changes: list[tuple[str, int]]) -> None:
        if self.rooms is not None and self.members is not None:
            self.rooms.entities_have_changed(room_changes)
            self.members.entities_have_changed(member_changes)

    def refresh(self, cursor: Any, now: int) -> None:
        with self._lock:
            if self.rooms is None or self.members is None:
                start = max(0, now - self.PREFILL)
                self.rooms = self._rooms_from_table(cursor)
                self.members = StreamChangeCache("members", start)
                self._fed_upto = start
            if now <= self._fed_upto:
                return
            cursor.execute(
                "SELECT room_id, max(stream_ordering) FROM events WHERE stream_ordering > %s "
                "AND stream_ordering <= %s AND NOT outlier GROUP BY room_id", [self._fed_upto, now])
            self.rooms.entities_have_changed(cursor.fetchall())
            cursor.execute(
                "SELECT user_id, max(event_stream_ordering) FROM room_memberships WHERE event_stream_ordering > %s "
                "AND event_stream_ordering <= %s GROUP BY user_id", [self._fed_upto, now])
            self.members.entities_have_changed(cursor.fetchall())
            self._fed_upto = now

    def _rooms_from_table(self, cursor: Any) -> StreamChangeCache:
        """Each room's latest live event (``rooms.last_stream``, written with it), the newest
        ROOM_ENTRIES rooms; every room left out changed last at or before the position
        where the cache's knowledge starts. A room whose change committed after ``now`` is
        in it too: it did change after any token this cache is asked about."""
        cursor.execute("SELECT room_id, last_stream FROM rooms WHERE last_stream IS NOT NULL "
                       "ORDER BY last_stream DESC LIMIT %s", [self.ROOM_ENTRIES + 1])
        rows = cursor.fetchall()
        horizon = rows[-1][1] if len(rows) > self.ROOM_ENTRIES else 0
        return StreamChangeCache("rooms", horizon, max_size=self.ROOM_ENTRIES,
                                 prefilled={room_id: pos for room_id, pos in rows[:self.ROOM_ENTRIES]})


class StorageCaches:
    """Everything the reads of one database keep between calls: the change caches, group
    states and event -> group (they never change), and which rooms' events carry hashed IDs."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._lock = threading.Lock()
        self.forget()

    def forget(self) -> None:
        """Drop everything cached (tests that recreate the database: group IDs start again)."""
        with self._lock:
            self.change = ChangeCaches(self.using)
            self.state = StateGroupStore(cache_keys=2_000_000)
            self.event_group = _LRU(50_000)
            self.hashed_id_rooms = _LRU(200_000)

    def record_changes(self, room_changes: list[tuple[str, int]], member_changes: list[tuple[str, int]]) -> None:
        """A write of this process committed (the persister's ``on_commit``)."""
        self.change.record(room_changes, member_changes)


def storage_caches(runtime: Any = None) -> StorageCaches:
    """The caches of ``runtime`` (a ``StreamRuntime``, which holds them; None: the process
    runtime)."""
    if runtime is None:

        runtime = process_runtime()
    caches = runtime.storage_caches
    if caches is None:
        with _CREATE_LOCK:
            caches = runtime.storage_caches
            if caches is None:
                caches = runtime.storage_caches = StorageCaches(runtime.using)
    return caches


_CREATE_LOCK = threading.Lock()

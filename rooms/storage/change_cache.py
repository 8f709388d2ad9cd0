"""``StreamChangeCache``: for each entity (room, user), the stream position of its last change,
so a sync skips rooms with nothing new without touching the database (Synapse's
``synapse/util/caches/stream_change_cache.py``; the semantics, including "unknown entity = unchanged", are Synapse's)."""
from __future__ import annotations

import threading
from typing import Collection, Iterable

from sortedcontainers import SortedDict


class StreamChangeCache:
    """Position -> what changed there: the entity itself when it is the only one (nearly
    always: one stream position, one room), a set when several share it. A set per position
    is a container the garbage collector walks: a cache of 100,000 rooms made every full
    collection of a serving process ~15 ms longer."""

    def __init__(self, name: str, current_stream_pos: int, max_size: int = 10_000,
                 prefilled: dict[str, int] | None = None) -> None:
        self.name = name
        self.max_size = max_size
        self._entity_to_key: dict[str, int] = {}
        self._cache: SortedDict = SortedDict()  # position -> entity, or set of entities
        self._earliest_known_stream_pos = current_stream_pos
        self._lock = threading.Lock()
        # in bulk, as entity_has_changed one by one would (each entity is there once): a
        # prefill may hold every room of the server
        by_position: dict[int, str | set[str]] = {}
        for entity, pos in (prefilled or {}).items():
            if pos > current_stream_pos:
                _add(by_position, pos, entity)
                self._entity_to_key[entity] = pos
        self._cache.update(by_position)
        self._evict()

    @property
    def earliest_known_position(self) -> int:
        return self._earliest_known_stream_pos

    @property
    def max_position(self) -> int:
        with self._lock:
            return self._cache.peekitem(-1)[0] if self._cache else self._earliest_known_stream_pos

    def has_entity_changed(self, entity: str, stream_pos: int) -> bool:
        """True if ``entity`` may have changed after ``stream_pos`` (unknown past: True)."""
        with self._lock:
            if stream_pos < self._earliest_known_stream_pos:
                return True
            latest = self._entity_to_key.get(entity)
            if latest is None:
                return False
            return stream_pos < latest

    def get_entities_changed(self, entities: Collection[str], stream_pos: int) -> set[str]:
        with self._lock:
            if not self._cache or stream_pos < self._earliest_known_stream_pos:
                return set(entities)
            max_pos = self._cache.peekitem(-1)[0]
        if (max_pos - stream_pos) > len(entities):
            return {e for e in entities if self.has_entity_changed(e, stream_pos)}
        changed = self.get_all_entities_changed(stream_pos)
        assert changed is not None
        return set(entities).intersection(changed)

    def get_all_entities_changed(self, stream_pos: int) -> list[str] | None:
        """The entities changed after ``stream_pos`` in change order; None if unknowable."""
        with self._lock:
            if stream_pos < self._earliest_known_stream_pos:
                return None
            out: list[str] = []
            for pos in self._cache.irange(minimum=stream_pos, inclusive=(False, True)):
                out.extend(_entities(self._cache[pos]))
            return out

    def entity_has_changed(self, entity: str, stream_pos: int) -> None:
        with self._lock:
            if stream_pos <= self._earliest_known_stream_pos:
                return
            old = self._entity_to_key.get(entity)
            if old is not None:
                if old >= stream_pos:
                    return
                at = self._cache[old]
                if isinstance(at, set):
                    at.discard(entity)
                    if len(at) == 1:
                        self._cache[old] = next(iter(at))
                else:
                    del self._cache[old]
            _add(self._cache, stream_pos, entity)
            self._entity_to_key[entity] = stream_pos
            self._evict()

    def _evict(self) -> None:
        """The oldest positions beyond ``max_size``; what is known starts after them."""
        while len(self._cache) > self.max_size:
            pos, evicted = self._cache.popitem(0)
            self._earliest_known_stream_pos = max(pos, self._earliest_known_stream_pos)
            for e in _entities(evicted):
                self._entity_to_key.pop(e, None)

    def entities_have_changed(self, changes: Iterable[tuple[str, int]]) -> None:
        for entity, pos in changes:
            self.entity_has_changed(entity, pos)

    def get_max_pos_of_last_change(self, entity: str) -> int | None:
        with self._lock:
            return self._entity_to_key.get(entity)


def _entities(at: str | set[str]) -> Collection[str]:
    """What changed at a position, as a collection (a bare entity or a set of them)."""
    return at if isinstance(at, set) else (at,)


def _add(cache: "SortedDict | dict[int, str | set[str]]", pos: int, entity: str) -> None:
    """``entity`` changed at ``pos`` (it is not there yet)."""
    at = cache.get(pos)
    if at is None:
        cache[pos] = entity
    elif isinstance(at, set):
        at.add(entity)
    else:
        cache[pos] = {at, entity}

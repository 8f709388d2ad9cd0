"""The one hook through which every advance of a writer's position is published.

ID generators call :meth:`PositionNotifier.position_advanced` after a local write completes
and the writer's position moved; subscribers (tests and tools today, the replication layer
and the dashboard later) receive a :class:`PositionAdvanced`. Subscribers run synchronously
in the completing thread, so they must be quick: queue, don't wait (the replication streamer
formats its batch here, a few microseconds per fact, and leaves the I/O to its own thread).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from streams.direction import FORWARDS, IdDirection

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PositionAdvanced:
    """Writer ``instance_name`` of ``stream_name`` completed everything up to ``new_token``
    (stored sign); ``prev_token`` is what it published last. ``facts``: the wire rows of what
    this process wrote in ``(prev_token, new_token]``, as ``(stream ID, rows)`` in token order,
    when its writer keeps a :class:`WireJournal` (while a replication streamer listens); a
    rolled-back ID has no rows."""

    stream_name: str
    instance_name: str
    prev_token: int
    new_token: int
    facts: tuple[tuple[int, list[list[Any]]], ...] = ()


class WireJournal:
    """The wire rows of this writer's completed facts, until the replication streamer takes
    them: RDATA is built from what was written, without reading it back.

    Keyed by stream ID (external sign); a rolled-back fact is recorded with no rows.
    """

    def __init__(self) -> None:
        self._facts: dict[int, list[list[Any]]] = {}
        self._lock = threading.Lock()

    def record(self, ids: Sequence[int], rows: Mapping[int, list[list[Any]]]) -> None:
        with self._lock:
            for stream_id in ids:
                self._facts[stream_id] = rows.get(stream_id, [])

    def take(self, ids_after: int, ids_upto: int, signs: IdDirection = FORWARDS) -> list[tuple[int, list[list[Any]]]]:
        """Remove and return the facts whose wire token is in ``(ids_after, ids_upto]``, in order."""
        with self._lock:
            facts = self._facts
            return [(k, facts.pop(k)) for k in signs.select_in_order(facts, ids_after, ids_upto)]

    def __len__(self) -> int:
        return len(self._facts)


Subscriber = Callable[[PositionAdvanced], None]


class PositionNotifier:
    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns the function that removes it again."""
        with self._lock:
            self._subscribers = [*self._subscribers, callback]

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = [s for s in self._subscribers if s is not callback]

        return unsubscribe

    def position_advanced(self, advance: PositionAdvanced) -> None:
        for callback in self._subscribers:
            try:
                callback(advance)
            except Exception:  # one broken subscriber must not stop the writer
                logger.exception("position subscriber %r failed on %s", callback, advance)

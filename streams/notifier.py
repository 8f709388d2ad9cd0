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
from typing import Callable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PositionAdvanced:
    """Writer ``instance_name`` of ``stream_name`` completed everything up to ``new_token``
    (external sign); ``prev_token`` is what it published last."""

    stream_name: str
    instance_name: str
    prev_token: int
    new_token: int


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

"""Sequence IDs handed out that no writer has reported persisted, and for how long
(docs/attach.md, "Unreported sequence IDs"). Pure: figures and ``now`` in, a verdict out.

The rule, from Synapse's ``MultiWriterIdGenerator`` (``synapse/storage/util/id_generators.py``):

* an ID is handed out by ``nextval`` on the stream's sequence: ``allocated`` (``last_value``,
  less one while ``is_called`` is false) is the largest handed out;
* an ID is *reported* once any of these covers it: a writer's ``stream_positions`` row (written
  after each successful write, with the position the writer has reached then), the largest ID
  stored in the stream's tables (a row committed before its writer's row is updated), the
  persisted-upto position, or a position a writer announced live on Redis. The last one matters:
  a write that fails (rolled back) marks its IDs finished in the writer's memory and moves its
  position past them, which Synapse announces with a ``POSITION`` within a second, but it writes
  no ``stream_positions`` row on that path; without Redis such IDs stay unreported until the
  stream's next successful write;
* the *unreported* IDs are those above the highest cover, up to ``allocated``. Only the highest
  cover counts: a writer whose row is old because it is idle never makes IDs unreported (the
  others' rows and the stored IDs cover them), and an ID in flight below another writer's newer
  write is the stuck-writer rule's (``observer.py``), not this one's;
* an ID in flight for a moment is normal (a transaction takes milliseconds, a large event batch
  seconds), so an ID is *overdue* only once it has stayed unreported ``after`` seconds (60 by
  default, ``SYNAPSE_UNREPORTED_AFTER_SECONDS``). Its age is measured from the first read that
  showed it handed out: the tracker keeps, per stream, the allocated figure of each read that
  raised it, with the read's time, and drops those the cover has passed. The age is therefore
  at most one read interval short, never long.

A stream no writer has written yet (no ``stream_positions`` row, nothing stored) can hold IDs
its schema handed out: Synapse's schema deltas call ``nextval`` (``92/08_thread_subscriptions_
seq_fixup`` takes ID 2 of ``thread_subscriptions_sequence``, which no writer ever reports). For
such a stream the allocated figure of the tracker's first read counts as covered (as if
reported); IDs handed out after it count as any other, and once the stream is written its
own cover passes it.

Streams whose writers record no positions (``caches``) are covered by their stored IDs alone
(each is stored in the transaction that allocates it); in-memory streams have no sequence.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

#: An unreported ID this old is overdue (``SYNAPSE_UNREPORTED_AFTER_SECONDS``).
UNREPORTED_AFTER = 60.0
#: At most this many (allocated, first seen) checkpoints per stream; older ones are merged so
#: memory stays flat whatever the read rate (the oldest, which sets the age, is always kept).
MAX_CHECKPOINTS = 64


def covered(*figures: int | None) -> int:
    """The highest position that reports an ID persisted (0: none)."""
    return max((f for f in figures if f is not None), default=0)


@dataclass(frozen=True)
class Unreported:
    """One stream's unreported IDs: ``count`` IDs above ``covered`` up to ``allocated``, the
    oldest of them handed out at least ``age`` seconds ago; ``overdue`` once that is ``after``."""

    stream: str
    allocated: int
    covered: int
    count: int
    age: float
    overdue: bool

    def as_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "allocated": self.allocated, "covered": self.covered, "count": self.count,
                "age_seconds": round(self.age, 1), "overdue": self.overdue}


class UnreportedTracker:
    """Follows each stream's unreported IDs over successive reads of Synapse's database."""

    def __init__(self, after: float = UNREPORTED_AFTER) -> None:
        self.after = after
        self._checkpoints: dict[str, deque[tuple[int, float]]] = {}
        #: per stream never written when first read: the IDs its schema handed out
        self._schema_allocated: dict[str, int] = {}

    def observe(self, stream: str, allocated: int, cover: int, now: float, never_written: bool = False) -> Unreported:
        """One read of ``stream``: ``allocated`` handed out, ``cover`` the highest report of
        persistence; ``never_written``: no writer has recorded a position or stored an ID."""
        first = stream not in self._checkpoints
        if first and never_written:
            self._schema_allocated[stream] = allocated
        cover = max(cover, self._schema_allocated.get(stream, 0))
        points = self._checkpoints.setdefault(stream, deque())
        if allocated > cover and (not points or allocated > points[-1][0]):
            points.append((allocated, now))
        while points and points[0][0] <= cover:
            points.popleft()
        while len(points) > MAX_CHECKPOINTS:
            # keep the oldest (it sets the age); merge the second into the third
            del points[1]
        count = max(0, allocated - cover)
        age = now - points[0][1] if count and points else 0.0
        return Unreported(stream, allocated, cover, count, age, count > 0 and age >= self.after)


def observe_report(tracker: UnreportedTracker, streams: list[dict[str, Any]], live_streams: dict[str, Any],
                   now: float) -> list[Unreported]:
    """Every stream of a ``synapse_status`` report (its ``streams``, as ``as_dict`` gives them)
    with a sequence, covered by its rows, stored IDs, persisted-upto and the live positions
    ``live_streams`` (the observer's ``streams``) holds."""
    out = []
    for s in streams:
        if s["allocated"] is None:
            continue
        live = live_streams.get(s["stream"], {}) if s["replicated"] else {}
        cover = covered(*(w["position"] for w in s["writers"]), s["max_stored"], s["persisted_upto"],
                        live.get("highest"))
        never_written = not s["writers"] and not s["max_stored"]
        out.append(tracker.observe(s["stream"], s["allocated"], cover, now, never_written))
    return out

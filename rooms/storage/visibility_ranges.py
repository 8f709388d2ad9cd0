"""History visibility, computed once when an event is persisted and stored as ranges.

Who may see event E (key ``k = (topological_ordering, stream_ordering)``) is decided from the
state after E (the client-server spec's history visibility rules as Synapse's
``synapse/visibility.py`` applies them, boundary rules included; docs/storage.md, "Visibility"):

* ``world_readable``: anyone -> E is in the ranges of the pseudo-user ``*``;
* user u with membership ``join`` after E, or ``invite`` under ``invited``;
* ``shared`` (also an unknown or missing value, and ``world_readable`` for members): u if u
  joins at any point after E -> E is in the ``*shared`` eras, which the reads clip at u's
  latest join (nothing is copied into u's ranges: see below);
* u's own member event: Synapse's rule (a leave right after join/invite is seen; otherwise
  the more permissive of old and new membership decides);
* an ``m.room.history_visibility`` event: if the value before *or* after allows it.

A user's ranges are kept per room as sorted inclusive key ranges; the last one is open
(end ``None``) while the current state lets the user see each new event, so a new message
costs no visibility write at all. They hold only what u's own membership grants
(:func:`visible_to_member` with ``joins_later=False``): u sees E iff a range of u or of ``*``
covers E, or one of ``*shared`` does and E is before u's latest join. Copying the eras into
u's ranges on joining made a big room's rows grow as joins x eras (130 rows per member).
Everything here is pure; the planner applies it (``plan_visibility.py``), the persist path
loads and saves the ranges.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable, Optional

Key = tuple[int, int]
Range = tuple[Key, Optional[Key]]

ANYONE = "*"
SHARED_ERAS = "*shared"

WORLD_READABLE = "world_readable"
SHARED = "shared"
INVITED = "invited"
JOINED = "joined"
_KNOWN = (WORLD_READABLE, SHARED, INVITED, JOINED)
#: most permissive first (Synapse's MEMBERSHIP_PRIORITY)
_MEMBERSHIP_PRIORITY = ("join", "invite", "knock", "leave", "ban")


def normalise_visibility(value: object) -> str:
    """A missing or unknown history_visibility means ``shared``."""
    return value if isinstance(value, str) and value in _KNOWN else SHARED


def shared_era(vis: str) -> bool:
    return vis in (SHARED, WORLD_READABLE)


def grants(membership: str | None, vis: str) -> bool:
    """Whether state with this membership and visibility shows the user each new event."""
    return membership == "join" or (membership == "invite" and vis == INVITED)


def _more_permissive(a: str | None, b: str | None) -> str:
    def rank(m: str | None) -> int:
        return _MEMBERSHIP_PRIORITY.index(m) if m in _MEMBERSHIP_PRIORITY else len(_MEMBERSHIP_PRIORITY)

    return min((a or "leave", b or "leave"), key=rank)


def visible_to_member(
    *,
    vis_values: Iterable[str],
    membership_after: str | None,
    own_change: tuple[str | None, str | None] | None = None,
    joins_later: bool = False,
) -> bool:
    """Whether a user may see an event through their membership (``*`` aside).

    ``vis_values``: the visibility after the event, and also the one before it for a
    history_visibility event. ``own_change``: (new, previous) membership when the event is the
    user's own member event. ``joins_later``: the user joins after the event.
    """
    for vis in vis_values:
        if own_change is not None:
            new, prev = own_change
            if (new or "leave") == "leave" and prev in ("join", "invite"):
                return True
            membership = _more_permissive(new, prev)
        else:
            membership = membership_after
        if grants(membership, vis):
            return True
        if shared_era(vis) and joins_later:
            return True
    return False


def sees(ranges: dict[str, "RangeSet"], last_join: Key | None, user: str, k: Key) -> bool:
    """The reads' rule over one room's ranges: ``user`` (latest join ``last_join``) may see
    the event at ``k`` iff a range of theirs or of ``*`` covers it, or one of ``*shared``
    does and ``k`` is before their latest join."""
    def covered(holder: str) -> bool:
        rs = ranges.get(holder)
        return rs is not None and rs.covers(k)

    return (covered(user) or covered(ANYONE)
            or (last_join is not None and k < last_join and covered(SHARED_ERAS)))


def _succ(k: Key) -> Key:
    return (k[0], k[1] + 1)


def _pred(k: Key) -> Key:
    return (k[0], k[1] - 1)


@dataclass
class RangeSet:
    """Sorted, disjoint, inclusive key ranges; at most the last is open-ended.

    ``stored``: how many leading ranges are stored as they are (the loader sets it; every
    change lowers it to the first range it touched), so a write replaces only the ranges
    after them: a big room's ``*shared`` holds an era per visibility change, thousands, and
    rewriting them all at each change was ~10% of the persist path at 4 M events."""

    ranges: list[list] = field(default_factory=list)  # [start, end|None]
    stored: int = field(default=0, compare=False)

    def copy(self) -> "RangeSet":
        return RangeSet([list(r) for r in self.ranges])

    def as_tuples(self) -> list[Range]:
        return [(r[0], r[1]) for r in self.ranges]

    def covers(self, k: Key) -> bool:
        i = bisect.bisect_right(self.ranges, k, key=lambda r: r[0]) - 1
        if i < 0:
            return False
        end = self.ranges[i][1]
        return end is None or k <= end

    @property
    def is_open(self) -> bool:
        return bool(self.ranges) and self.ranges[-1][1] is None

    @property
    def last_bound(self) -> Key | None:
        """The latest start or finite end of any range (None: no range). For a key ``k`` later
        than it, ``covers(k)`` is ``is_open``."""
        if not self.ranges:
            return None
        start, end = self.ranges[-1]
        return start if end is None else end

    def add(self, start: Key, end: Key | None) -> None:
        """Union with [start, end]; touching ranges (same depth, next stream) are merged. Finds
        the ranges it meets by bisection (a backfilled room's members hold a point range per
        event, and each event adds one more)."""
        rs = self.ranges
        i = bisect.bisect_left(rs, start, key=lambda r: r[0])
        if i > 0 and (rs[i - 1][1] is None or _succ(rs[i - 1][1]) >= start):
            i -= 1  # the range before it meets it
        j = i
        while j < len(rs) and (end is None or rs[j][0] <= _succ(end)):
            r = rs[j]
            start = min(start, r[0])
            end = None if end is None or r[1] is None else max(end, r[1])
            j += 1
        rs[i:j] = [[start, end]]
        self.stored = min(self.stored, i)

    def remove_point(self, k: Key) -> None:
        i = bisect.bisect_right(self.ranges, k, key=lambda r: r[0]) - 1
        if i < 0:
            return
        start, end = self.ranges[i]
        if end is not None and k > end:
            return
        parts = []
        if start < k:
            parts.append([start, _pred(k)])
        if end is None or k < end:
            parts.append([_succ(k), end])
        self.ranges[i:i + 1] = parts
        self.stored = min(self.stored, i)

    def close_at(self, k: Key) -> None:
        """The user stops seeing new events after ``k`` (``k`` included)."""
        if self.is_open:
            self.stored = min(self.stored, len(self.ranges) - 1)
            if self.ranges[-1][0] <= k:
                self.ranges[-1][1] = k
            else:  # opened after k: nothing of it was visible
                self.ranges.pop()

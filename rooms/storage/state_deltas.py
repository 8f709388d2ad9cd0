"""Where room states differ, found from the groups' deltas instead of their whole maps.

A fork's branches start a few groups back from each other: their states differ only on the
keys changed since their common ancestor in the group tree. The persist path records, for
every group it plans, its *logical* parent and what changed (``GroupLineage``: also when the
group is stored as a full snapshot, and with removals, which stored deltas cannot express).
The keys on the paths from the groups up to their lowest common ancestor are then all the
keys where their states can differ; every other key has the ancestor's value in all of
them. So a fork costs what its branches changed, not the room's state size (a big room holds
~140,000 keys at 10 M events; docs/storage.md, "Forks from deltas").
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Iterable, NamedTuple

from rooms.storage.incoming_events import StateKey, StateMap

#: how far up the group tree a common ancestor is looked for (forks start a few groups back)
MAX_HOPS = 64


class Lineage(NamedTuple):
    """A planned group's state = ``parent``'s state with ``delta`` applied (None: removed)."""

    parent: int
    delta: Mapping[StateKey, str | None]


class StateRef(NamedTuple):
    """A state named by a group and the keys where it may differ from that group's state
    (none for the group's own state; a resolution's changes for a resolved current state)."""

    group: int | None
    keys: frozenset[StateKey] | set[StateKey] = frozenset()


class Resolution(NamedTuple):
    """A resolved state, and the keys where it may differ from group ``base``'s state (one of
    the groups it resolved)."""

    state: dict[StateKey, str]
    base: int | None
    keys: frozenset[StateKey] | set[StateKey]


class LineageReads:
    """The questions asked of a lineage (``get`` is the one read of its entries)."""

    unknown: int

    def get(self, group: int) -> Lineage | None:
        raise NotImplementedError

    def add(self, group: int, parent: int | None, delta: Mapping[StateKey, str | None]) -> None:
        raise NotImplementedError

    def _path(self, group: int) -> list[int]:
        """``group`` and its ancestors, nearest first (as far as known, at most MAX_HOPS up)."""
        path = [group]
        get = self.get
        for _ in range(MAX_HOPS):
            entry = get(path[-1])
            if entry is None:
                break
            path.append(entry.parent)
        return path

    def differing_keys(self, groups: Sequence[int | None]) -> set[StateKey] | None:
        """The keys where the states of ``groups`` may differ (a superset: a key changed and
        changed back is included), from the deltas up to their lowest common ancestor; None
        when no common ancestor is known (the caller compares the maps)."""
        distinct = list(dict.fromkeys(groups))
        if len(distinct) == 1:
            return set()
        if None in distinct:
            self.unknown += 1
            return None
        first = self._path(distinct[0])  # type: ignore[arg-type]
        where = {g: i for i, g in enumerate(first)}
        keys: set[StateKey] = set()
        top = 0  # the lowest common ancestor of all is first[top]
        get = self.get
        for group in distinct[1:]:
            g: int = group  # type: ignore[assignment]
            hops = 0
            own: list[Lineage] = []
            while g not in where:
                entry = get(g)
                if entry is None or hops >= MAX_HOPS:
                    self.unknown += 1
                    return None
                own.append(entry)
                g = entry.parent
                hops += 1
            top = max(top, where[g])
            for o in own:
                keys.update(o.delta)
        for g in first[:top]:
            entry = get(g)
            assert entry is not None  # on the path: known
            keys.update(entry.delta)
        return keys


class GroupLineage(LineageReads):
    """group -> :class:`Lineage` for the groups this persister planned and committed (least
    recently added go first). A batch plans through a :class:`LineageBatch` over it, whose
    entries are added with :meth:`apply` once the transaction commits."""

    def __init__(self, size: int = 400_000) -> None:
        self.size = size
        self._d: OrderedDict[int, Lineage] = OrderedDict()
        #: how many questions the lineage could not answer (the callers compared whole maps)
        self.unknown = 0

    def scale(self, factor: float) -> None:
        self.size = int(self.size * factor)

    def add(self, group: int, parent: int | None, delta: Mapping[StateKey, str | None]) -> None:
        if parent is None or parent == group:
            return
        self._d[group] = Lineage(parent, delta)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def get(self, group: int) -> Lineage | None:
        return self._d.get(group)

    def batch(self) -> LineageBatch:
        """A view for one batch: its entries kept apart until :meth:`apply`."""
        return LineageBatch(self)

    def apply(self, delta: LineageDelta) -> None:
        """A committed batch's entries (and its unanswered questions, counted)."""
        for group, entry in delta.entries.items():
            self.add(group, entry.parent, entry.delta)
        self.unknown += delta.unknown

    def entries(self) -> dict[int, Lineage]:
        """A copy of every entry (what tests compare)."""
        return dict(self._d)


class LineageDelta(NamedTuple):
    """What one batch learned about the lineage: its groups' entries, and how many of its
    questions went unanswered."""

    entries: dict[int, Lineage]
    unknown: int


class LineageBatch(LineageReads):
    """A batch's view of a :class:`GroupLineage`: its own groups first, the committed ones
    under them (never changed)."""

    def __init__(self, base: GroupLineage) -> None:
        self.base = base
        self.own: dict[int, Lineage] = {}
        self.unknown = 0

    def add(self, group: int, parent: int | None, delta: Mapping[StateKey, str | None]) -> None:
        if parent is None or parent == group:
            return
        self.own[group] = Lineage(parent, delta)

    def get(self, group: int) -> Lineage | None:
        entry = self.own.get(group)
        return entry if entry is not None else self.base.get(group)

    def delta(self) -> LineageDelta:
        return LineageDelta(dict(self.own), self.unknown)


def keys_differing(maps: Sequence[StateMap]) -> set[StateKey]:
    """The keys where whole maps differ (the fallback: C-speed set operations, but linear in
    the state size)."""
    out: set[StateKey] = set()
    first = maps[0]
    for other in maps[1:]:
        if other is not first:
            out.update(k for k, _ in first.items() ^ other.items())
    return out


def changes_between(old: StateMap, new: StateMap, keys: Iterable[StateKey]) -> dict[StateKey, str | None]:
    """``key -> new value`` (None: gone) for the ``keys`` where ``new`` differs from ``old``,
    sorted by key (the order the state stream rows take)."""
    out: dict[StateKey, str | None] = {}
    for k in sorted(keys):
        v = new.get(k)
        if old.get(k) != v:
            out[k] = v
    return out

"""What a plan asked for that its batch had not loaded: :class:`NeedsData`.

The planner reads the database only through the batch views of the persister's caches,
and those hold no cursor: a miss raises :class:`NeedsData` naming what is missing, the
persister has the loader read exactly that into the batch's loaded entries (on the open
transaction), and plans the batch again from the same snapshot (docs/storage.md, "The
planner: data in, rows out").
"""
from __future__ import annotations

from collections.abc import Iterable

#: what can be missing, and what names it
STATES = "states"  #: the full state of stored groups (group IDs)
CHAIN_LENGTHS = "chain_lengths"  #: the delta-chain lengths of stored groups (group IDs)
GROUP_CHAINS = "group_chains"  #: stored groups' delta chains, up to their snapshot (group IDs)
FACTS = "facts"  #: the membership / history visibility stored events set (event IDs)
EVENTS = "events"  #: stored events as the Matrix core reads them (event IDs)
AUTH_CHAINS = "auth_chains"  #: rooms' stored auth chain cover indexes (room IDs)

KINDS = (STATES, CHAIN_LENGTHS, GROUP_CHAINS, FACTS, EVENTS, AUTH_CHAINS)


class NeedsData(Exception):
    """A plan needs ``keys`` of ``kind`` (one of :data:`KINDS`), which the batch has not
    loaded. Raised by a batch view instead of reading the database; not an error of the
    batch (the persister loads them and plans again)."""

    def __init__(self, kind: str, keys: Iterable[object]) -> None:
        if kind not in KINDS:
            raise ValueError(f"no such data to load: {kind!r}")
        self.kind = kind
        self.keys = frozenset(keys)
        super().__init__(f"the plan needs {len(self.keys)} {kind} not loaded yet")

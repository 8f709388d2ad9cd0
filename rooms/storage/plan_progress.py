"""What one ``plan_batch`` call has decided so far: the working state the planner's steps
(``plan_orderings``, ``plan_room_state``, ``plan_visibility``, ``plan_rows``) read and
extend, beside the batch's :class:`~rooms.storage.plan_snapshot.Snapshot` and its reader.
It lives for one call; nothing in it outlives the plan but what the plan carries.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rooms.storage.incoming_events import ParsedEvent, StateMap
from rooms.storage.plan import CurrentStateRow, RedactionRow
from rooms.storage.plan_snapshot import KnownEvent, PlanReader, RoomContext, Snapshot
from rooms.storage.plan_visibility import Touched
from rooms.storage.state_deltas import GroupLineage, LineageReads
from rooms.storage.state_groups import NewGroup


class OutOfGroupIds(RuntimeError):
    """The batch needed more state group IDs than its snapshot reserved (two per event
    are reserved, the most an event takes)."""


@dataclass
class Progress:
    """The batch, what the planner was given, and what it has decided so far."""

    events: list[ParsedEvent]
    snapshot: Snapshot
    reader: PlanReader
    backfill: bool
    now_ms: int
    by_id: dict[str, ParsedEvent] = field(default_factory=dict)
    #: stored outliers of the batch, now with their place in the room
    ex_outliers: dict[str, KnownEvent] = field(default_factory=dict)
    stream_ids: dict[str, int] = field(default_factory=dict)
    #: the groups planned, in order (their IDs are the snapshot's first ``len(groups)``)
    groups: list[NewGroup] = field(default_factory=list)
    #: event_id -> its ``state`` stream rows (current state changes at it)
    deltas: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    current_rows: dict[tuple[str, str, str], CurrentStateRow] = field(default_factory=dict)
    touched: Touched = field(default_factory=set)
    fwd_changed: set[str] = field(default_factory=set)
    room_changes: dict[str, int] = field(default_factory=dict)
    member_changes: dict[str, int] = field(default_factory=dict)
    redaction_rows: list[RedactionRow] = field(default_factory=list)
    redacted_stored: list[str] = field(default_factory=list)
    #: recent groups' states rebuilt from current state in this batch (a fork asks twice)
    rebuilt: dict[int, StateMap] = field(default_factory=dict)
    lineage: LineageReads = field(default_factory=GroupLineage)

    @classmethod
    def start(cls, events: Sequence[ParsedEvent], snapshot: Snapshot, reader: PlanReader, *, backfill: bool,
              now_ms: int) -> Progress:
        lineage = getattr(reader, "lineage", None)
        return cls(list(events), snapshot, reader, backfill, now_ms, by_id={ev.event_id: ev for ev in events},
                   lineage=lineage if lineage is not None else GroupLineage())

    @property
    def rooms(self) -> dict[str, RoomContext]:
        return self.snapshot.rooms

    @property
    def known(self) -> dict[str, KnownEvent]:
        return self.snapshot.known

    def next_group_id(self) -> int:
        """The next reserved state group ID (taken by the group appended next)."""
        ids = self.snapshot.group_ids
        n = len(self.groups)
        if n >= len(ids):
            raise OutOfGroupIds(f"the batch's snapshot reserved {len(ids)} state group IDs, and it needs more")
        return ids[n]

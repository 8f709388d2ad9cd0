"""What one ``persist_events`` call writes: plain records of rows, table by table.

The planner (``planner.py``) computes a :class:`Plan` from the batch and what was loaded for
it; the writer (``plan_writer.py``) turns it into SQL and nothing else. A plan holds no
cursor and no SQL, so the decisions of the persist path are tested by comparing plans
(tests/rooms/storage/test_planner.py). Rows are tuples the writer passes to
``sql.insert_rows`` as they are: named tuples where a batch has few of them, plain tuples
(columns named by the ``*_COLUMNS`` constants) for the tables with several rows per event,
where building a named tuple per row would cost persist measurable time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from rooms.storage.chain_index_store import ChainEvent
from rooms.storage.state_groups import NewGroup

if TYPE_CHECKING:
    from rooms.storage.incoming_events import ParsedEvent
    from rooms.storage.plan_snapshot import CacheDelta, RoomContext


class EventRow(NamedTuple):
    """An ``events`` row, with the ``current_state_delta`` rows of its stream position."""

    values: dict[str, Any] | None  #: the ``events`` row; None for a de-outliered event (it has one)
    state_deltas: list[dict[str, Any]]  #: ``state`` rows of the events stream (live batches only)


class ExOutlierRow(NamedTuple):
    event_stream_ordering: int
    event_id: str
    state_group: int | None


class RedactionRow(NamedTuple):
    event_id: str
    redacts: str
    received_ts: int


class RejectionRow(NamedTuple):
    event_id: str
    reason: str
    last_check: str


EVENT_AUTH_COLUMNS = ("event_id", "auth_id", "room_id")
EventAuthRow = tuple[str, str, str]
EVENT_TO_STATE_GROUPS_COLUMNS = ("event_id", "state_group")
EventStateGroupRow = tuple[str, int]
EVENT_EDGES_COLUMNS = ("event_id", "prev_event_id", "room_id")
EventEdgeRow = tuple[str, str, str]
MEMBERSHIP_COLUMNS = ("event_id", "user_id", "sender", "room_id", "membership", "event_stream_ordering",
                      "topological_ordering")
MembershipRow = tuple[str, str, str, str, "str | None", int, int]


class CurrentStateRow(NamedTuple):
    """A ``current_state_events`` row; ``event_id`` None: the key left the current state."""

    room_id: str
    type: str
    state_key: str
    event_id: str | None
    membership: str | None
    event_stream_ordering: int


#: a cut before every range: all of a pair's rows are replaced
ALL_RANGES = (-2**63, -2**63)


class VisibilityCut(NamedTuple):
    """The rows of ``(room_id, user_id)`` that start after ``after`` are replaced (the ones
    before it are stored as they are); :data:`ALL_RANGES`: all of them."""

    room_id: str
    user_id: str
    after_topological: int
    after_stream: int


class VisibilityRangeRow(NamedTuple):
    room_id: str
    user_id: str
    start_topological: int
    start_stream: int
    end_topological: int | None
    end_stream: int | None


class RoomRow(NamedTuple):
    room_id: str
    head_topological: int
    head_stream: int
    last_stream: int
    current_state_group: int | None
    min_depth: int | None
    room_version: str | None
    authorized: bool
    late_stream: int | None


@dataclass
class Plan:
    """Every row one batch writes, in the order the writer sends them."""

    #: one per reserved stream ID, in order
    events: list[EventRow] = field(default_factory=list)
    ex_outliers: list[ExOutlierRow] = field(default_factory=list)
    #: the events stream's ``ev`` row of each de-outliered event, at its ``ex_outlier_stream``
    #: position (live batches only: a backfill ID is sent by no stream, as in Synapse):
    #: (stream ID, the fields of ``Event.wire_row``)
    ex_outlier_wire: list[tuple[int, list[Any]]] = field(default_factory=list)
    #: stored events a redaction of this batch prunes (``events.redacted`` set)
    redacted_stored: list[str] = field(default_factory=list)
    redactions: list[RedactionRow] = field(default_factory=list)
    rejections: list[RejectionRow] = field(default_factory=list)
    state_groups: list[NewGroup] = field(default_factory=list)
    event_auth: list[EventAuthRow] = field(default_factory=list)
    #: state events for the chain cover index (placed by ``chain_cover.index_events``)
    chain_events: list[ChainEvent] = field(default_factory=list)
    event_to_state_groups: list[EventStateGroupRow] = field(default_factory=list)
    event_edges: list[EventEdgeRow] = field(default_factory=list)
    memberships: list[MembershipRow] = field(default_factory=list)
    #: the batch's event IDs: no longer backward extremities
    resolved_backward: list[str] = field(default_factory=list)
    backward_extremities: list[tuple[str, str]] = field(default_factory=list)  #: (event_id, room_id)
    #: rooms whose forward extremities are replaced by these (room_id -> event IDs)
    forward_extremities: dict[str, list[str]] = field(default_factory=dict)
    current_state: list[CurrentStateRow] = field(default_factory=list)
    #: per (room_id, user_id) pair whose visibility ranges changed, sorted: the cut after which
    #: its rows are replaced by ``visibility_ranges`` (the pair's ranges after the cut)
    visibility_cuts: list[VisibilityCut] = field(default_factory=list)
    visibility_ranges: list[VisibilityRangeRow] = field(default_factory=list)
    rooms: list[RoomRow] = field(default_factory=list)
    #: for the change caches after commit: the last stream position per room and per member
    room_changes: dict[str, int] = field(default_factory=dict)
    member_changes: dict[str, int] = field(default_factory=dict)
    #: how many of the snapshot's reserved state group IDs the plan took (the first ones)
    group_ids_used: int = 0
    #: the rooms' contexts after the batch (the persister keeps them once it commits)
    rooms_after: list[RoomContext] = field(default_factory=list)
    #: the batch's events as planned, in order: copies of the ones given, with their stream
    #: and topological orderings, state groups, verdicts and redactions
    decided: list[ParsedEvent] = field(default_factory=list)
    #: what the caches learn from the batch once it commits (None: the reader keeps none)
    delta: CacheDelta | None = None

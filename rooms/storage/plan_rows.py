"""The planner's rows step: the :class:`~rooms.storage.plan.Plan` of a batch whose
orderings, states, verdicts and visibility are decided (a function over the batch's
:class:`~rooms.storage.plan_progress.Progress`), table by table.
"""
from __future__ import annotations

from typing import Any

from rooms.matrix.chain_index import IndexEvent
from rooms.storage.chain_index_store import ChainEvent
from rooms.storage.incoming_events import MEMBER, ParsedEvent
from rooms.storage.plan import (
    ALL_RANGES,
    EventRow,
    ExOutlierRow,
    Plan,
    RejectionRow,
    RoomRow,
    VisibilityCut,
    VisibilityRangeRow,
)
from rooms.storage.plan_progress import Progress
from rooms.storage.plan_snapshot import RoomContext


def rows(p: Progress) -> Plan:
    """Every row of the batch, and the rooms' contexts after it."""
    plan = Plan(room_changes=p.room_changes, member_changes=p.member_changes,
                redacted_stored=p.redacted_stored, redactions=p.redaction_rows,
                state_groups=p.groups, group_ids_used=len(p.groups))
    new = [ev for ev in p.events if ev.event_id not in p.ex_outliers]
    # a de-outliered event that is now rejected changes nothing (as in Synapse)
    deoutliered = [ev for ev in p.events if ev.event_id in p.ex_outliers and not ev.rejected_reason]
    skip = {ev.event_id for ev in p.events if ev.event_id in p.ex_outliers and ev.rejected_reason}
    for ev in p.events:
        deltas = [] if p.backfill else p.deltas.get(ev.event_id, [])
        plan.events.append(EventRow(None if ev.event_id in p.ex_outliers else event_values(p, ev), deltas))
    plan.ex_outliers = [ExOutlierRow(p.stream_ids[ev.event_id], ev.event_id, ev.state_group_after)
                        for ev in deoutliered]
    if not p.backfill:
        plan.ex_outlier_wire = [(p.stream_ids[ev.event_id],
                                 [ev.event_id, ev.room_id, ev.type, ev.state_key, ev.redacts, ev.relates_to,
                                  ev.membership, False, False]) for ev in deoutliered]
    plan.rejections = [RejectionRow(ev.event_id, ev.rejected_reason, str(p.now_ms))
                       for ev in new if ev.rejected_reason]
    # auth edges and the chain cover index of the same auth graph (rejected events and
    # outliers too: they are in it, as in Synapse's)
    plan.event_auth = [(ev.event_id, a, ev.room_id) for ev in new if ev.matrix is not None
                       for a in dict.fromkeys(ev.matrix.auth_event_ids)]
    plan.chain_events = [ChainEvent(ev.room_id, IndexEvent(ev.event_id, ev.type, ev.state_key,
                                                           ev.matrix.auth_event_ids))
                         for ev in new if ev.matrix is not None and ev.state_key is not None]
    plan.event_to_state_groups = [(ev.event_id, ev.state_group_after) for ev in p.events
                                  if not ev.outlier and ev.state_group_after is not None
                                  and ev.event_id not in skip]
    accepted = [ev for ev in p.events if not ev.outlier and not ev.rejected_reason]
    plan.event_edges = [(ev.event_id, prev, ev.room_id) for ev in accepted for prev in dict.fromkeys(ev.prev_events)]
    plan.memberships = [(ev.event_id, ev.state_key, ev.sender, ev.room_id, ev.membership,  # type: ignore[misc]
                         ev.stream_ordering, ev.topological_ordering)
                        for ev in accepted if ev.type == MEMBER]
    plan.resolved_backward = list(p.by_id)
    plan.backward_extremities = backward_extremities(p, accepted)
    plan.forward_extremities = {r: list(p.rooms[r].forward) for r in sorted(p.fwd_changed)}
    plan.current_state = list(p.current_rows.values())
    for r, u in sorted(p.touched):
        rs = p.rooms[r].user_ranges(u)
        # the ranges before the first one changed stay as stored
        kept = rs.stored
        after = rs.ranges[kept - 1][0] if kept else ALL_RANGES
        plan.visibility_cuts.append(VisibilityCut(r, u, after[0], after[1]))
        plan.visibility_ranges.extend(
            VisibilityRangeRow(r, u, start[0], start[1], None if end is None else end[0],
                               None if end is None else end[1])
            for start, end in rs.ranges[kept:])
        rs.stored = len(rs.ranges)  # as the rows will hold them (the context is kept only once they do)
    plan.rooms = [room_row(ctx) for ctx in p.rooms.values()]
    plan.rooms_after = list(p.rooms.values())
    return plan


def event_values(p: Progress, ev: ParsedEvent) -> dict[str, Any]:
    """An ``events`` row."""
    return {
        "topological_ordering": ev.topological_ordering, "depth": ev.topological_ordering,
        "event_id": ev.event_id, "room_id": ev.room_id, "type": ev.type, "state_key": ev.state_key,
        "sender": ev.sender, "membership": ev.membership, "redacts": ev.redacts,
        "relates_to": ev.relates_to, "rejected": bool(ev.rejected_reason), "outlier": ev.outlier,
        "received_ts": p.now_ms, "json": ev.raw, "redacted": ev.redacted,
    }


def backward_extremities(p: Progress, accepted: list[ParsedEvent]) -> list[tuple[str, str]]:
    """Prevs we do not have (as accepted, non-outlier events)."""
    have = {ev.event_id for ev in accepted}
    missing: dict[tuple[str, str], None] = {}
    for ev in accepted:
        for prev in ev.prev_events:
            if prev in have:
                continue
            row = p.known.get(prev)
            if row is None or row.outlier:
                missing[(prev, ev.room_id)] = None
    return list(missing)


def room_row(ctx: RoomContext) -> RoomRow:
    """A ``rooms`` row: the room after the batch."""
    head = ctx.head or (0, 0)
    info = ctx.info
    return RoomRow(ctx.room_id, head[0], head[1], ctx.last_stream, ctx.current_group, ctx.min_depth,
                   info.version.identifier if info is not None and info.version is not None else None,
                   bool(info is not None and info.authorized), ctx.late_stream)

"""The planner's orderings step: where each event of a batch sits in its room.

What is stored already (duplicates refused, stored outliers de-outliered, ``state_before``
naming unknown events, redactions that arrived before their target), each event's
topological ordering from its ``depth`` or its prevs, and an accepted event's effect on its
room's head, forward extremities, depth and joins. Functions over the batch's
:class:`~rooms.storage.plan_progress.Progress`.
"""
from __future__ import annotations

from rooms.storage.incoming_events import CREATE, MEMBER, BadEvent, ParsedEvent
from rooms.storage.plan_progress import Progress
from rooms.storage.plan_room_state import redaction_applies
from rooms.storage.plan_snapshot import Extremity, PrevInfo, RoomContext

#: the largest depth a computed topological ordering takes (the spec's integer bound)
MAX_DEPTH = 2**53 - 1


def check_known(p: Progress) -> None:
    """Duplicates (refused) and stored outliers sent again as full events (de-outliered:
    Synapse's ex_outlier; they keep their row and stream ordering and gain their state);
    ``state_before`` naming unknown events; redactions that arrived before their target."""
    for eid, ev in p.by_id.items():
        row = p.known.get(eid)
        if row is None:
            continue
        if row.outlier and not row.rejected and not ev.outlier:
            p.ex_outliers[eid] = row
            continue
        raise BadEvent(eid, "an event with this event_id is already stored")
    for ev in p.events:
        if ev.state_before:
            unknown = sorted(e for e in ev.state_before.values() if e not in p.known and e not in p.by_id)
            if unknown:
                raise BadEvent(ev.event_id, f"state_before names events we do not have {unknown[:5]} "
                                            f"(persist them first, as outliers)")
    for waiting in p.snapshot.waiting_redactions:
        target = p.by_id[waiting.target]
        if target.room_id == waiting.room_id and target.type != CREATE and redaction_applies(
                p, p.reader.matrix.get(waiting.redaction_id) if target.matrix is not None else None,
                target.matrix):
            target.redacted = True


def prev_info(p: Progress, ev: ParsedEvent, prev_id: str) -> PrevInfo | None:
    """What ``ev`` needs of prev event ``prev_id``; None if we do not have it."""
    prev = p.by_id.get(prev_id)
    if prev is not None:
        if prev.stream_ordering == 0:
            raise BadEvent(ev.event_id, f"prev_event {prev_id} comes later in the batch")
        if prev.room_id != ev.room_id:
            raise BadEvent(ev.event_id, f"prev_event {prev_id} is in another room")
        return PrevInfo(prev.key, prev.state_group_after, not prev.outlier)
    row = p.known.get(prev_id)
    if row is None:
        return None
    if row.room_id != ev.room_id:
        raise BadEvent(ev.event_id, f"prev_event {prev_id} is in another room")
    return PrevInfo(row.key, row.state_group, not row.outlier)


def order(p: Progress, ev: ParsedEvent) -> list[PrevInfo | None]:
    """The event's topological ordering: its ``depth``, else 1 + its deepest prev's (the old
    unsigned format). Returns what its prevs are."""
    infos = [prev_info(p, ev, prev) for prev in ev.prev_events]
    known = [i for i in infos if i is not None]
    if ev.depth is not None:
        ev.topological_ordering = ev.depth
    elif len(known) == len(infos) or ev.outlier:
        ev.topological_ordering = min(max((i.key[0] for i in known), default=0) + 1, MAX_DEPTH)
    else:
        raise BadEvent(ev.event_id, "no 'depth' and prev_events we do not have")
    return infos


def room_bookkeeping(p: Progress, ctx: RoomContext, ev: ParsedEvent, live: bool) -> None:
    """An accepted event's effect on the room's head, extremities, depth and joins."""
    ctx.note_order(ev.key, live)
    if live:
        ctx.head = ev.key if ctx.head is None or ev.key > ctx.head else ctx.head
        ctx.last_stream = max(ctx.last_stream, ev.stream_ordering)
        p.room_changes[ev.room_id] = ev.stream_ordering
        for prev in ev.prev_events:
            ctx.forward.pop(prev, None)
        ctx.forward[ev.event_id] = Extremity(ev.key, ev.state_group_after)
        p.fwd_changed.add(ev.room_id)
    elif ctx.head is None:
        ctx.head = ev.key
    ctx.min_depth = ev.topological_ordering if ctx.min_depth is None else min(ctx.min_depth, ev.topological_ordering)
    if ev.type == MEMBER:
        assert ev.state_key is not None
        if ev.stream_ordering > 0:
            p.member_changes[ev.state_key] = ev.stream_ordering
        if ev.membership == "join":
            ctx.joined_at(ev.state_key, ev.key)

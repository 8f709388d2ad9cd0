"""The persist path's decisions: parsed events + a loaded :class:`Snapshot` in, a
:class:`~rooms.storage.plan.Plan` out. No cursor and no SQL: what the database knows comes
from the snapshot and the :class:`PlanReader`, whose answers and whatever the plan learns
are the batch's own until it commits (docs/storage.md, "The persist path").

Per event, in the given order: orderings (``plan_orderings``), then (not an outlier) the
state before it, its authorization, the state after it (``plan_room_state``), current state
and visibility (``plan_visibility``); then the batch's redactions; then the rows
(``plan_rows``). The snapshot's room contexts (forks of the persister's) become the rooms
after the batch; the plan carries them and the caches' delta for the persister to keep
once the transaction commits.
"""
from __future__ import annotations

from collections.abc import Sequence

from rooms.storage.incoming_events import MEMBER, BadEvent, ParsedEvent
from rooms.storage.plan import Plan
from rooms.storage.plan_orderings import check_known, order, room_bookkeeping
from rooms.storage.plan_progress import Progress
from rooms.storage.plan_room_state import (
    authorize_event,
    current_changed,
    current_ref,
    differing,
    recompute_current,
    redactions,
    state_after,
    state_before,
)
from rooms.storage.plan_rows import rows
from rooms.storage.plan_snapshot import PlanReader, PrevInfo, Snapshot
from rooms.storage.plan_visibility import HV_KEY, at_head, off_head
from rooms.storage.state_deltas import StateRef
from rooms.storage.visibility_ranges import normalise_visibility


def plan_batch(events: Sequence[ParsedEvent], ids: Sequence[int], snapshot: Snapshot, reader: PlanReader, *,
               backfill: bool, now_ms: int) -> Plan:
    """The rows that persist ``events`` (stream IDs ``ids``, reserved in order), and the
    cache delta of the batch (``Plan.delta``, when the reader keeps one). Neither the events
    nor the snapshot are changed: the plan works on copies of the events (``Plan.decided``:
    with their orderings, state groups and verdicts) and forks of the rooms' contexts
    (``Plan.rooms_after``), so a batch can be planned again from the same inputs. Raises
    :class:`BadEvent` for a batch that cannot be stored, and the reader's
    :class:`~rooms.storage.plan_needs.NeedsData` for what it has not loaded."""
    working = Snapshot(rooms={r: ctx.fork() for r, ctx in snapshot.rooms.items()}, known=snapshot.known,
                       waiting_redactions=snapshot.waiting_redactions, group_ids=snapshot.group_ids)
    p = Progress.start([_copy(ev) for ev in events], working, reader, backfill=backfill, now_ms=now_ms)
    check_known(p)
    # What each state event of the batch says (membership, visibility value), outliers
    # included: a later event of the same batch may have them in its state, and they are
    # not in the database yet.
    for ev in p.events:
        if ev.is_state and (ev.type == MEMBER or (ev.type, ev.state_key) == HV_KEY):
            reader.put_facts(ev.event_id, ev.membership, normalise_visibility(
                ev.body["content"].get("history_visibility")) if ev.type != MEMBER else None)
    for ev, sid in zip(p.events, ids):
        ex = p.ex_outliers.get(ev.event_id)
        ev.stream_ordering = sid if ex is None else ex.stream_ordering
        p.stream_ids[ev.event_id] = sid
        prevs = order(p, ev)
        if ex is not None:
            ev.topological_ordering = ex.topological_ordering
        if not ev.outlier:
            state_and_visibility(p, ev, prevs)
        elif ev.matrix is not None:  # an outlier: only its own auth events (spec step 4)
            authorize_event(p, ev, None)
    redactions(p)
    plan = rows(p)
    plan.decided = p.events
    plan.delta = reader.delta(snapshot.group_ids[plan.group_ids_used:])
    if plan.delta is not None:
        plan.delta.rooms = plan.rooms_after
    return plan


def _copy(ev: ParsedEvent) -> ParsedEvent:
    """An equal event the plan may decide on (at C speed: no ``__init__``)."""
    new = ParsedEvent.__new__(ParsedEvent)
    new.__dict__.update(ev.__dict__)
    return new


def state_and_visibility(p: Progress, ev: ParsedEvent, infos: list[PrevInfo | None]) -> None:
    """A non-outlier event: the state before it, its verdict, the state after it, and (if
    accepted) its room's head, current state and visibility ranges."""
    ctx = p.rooms[ev.room_id]
    reader = p.reader
    usable = [i for i in infos if i is not None and i.has_state]
    if ev.state_before is None and len(usable) != len(infos):
        if not p.backfill and not ev.rejected_reason:
            missing = [prev for prev, i in zip(ev.prev_events, infos) if i is None or not i.has_state]
            raise BadEvent(ev.event_id, f"unknown prev_events {missing} (send state_before, or persist them first)")
        raise BadEvent(ev.event_id, "prev_events we do not have: a backfilled event then needs state_before")
    before_group, before_chain, before_map = state_before(p, ctx, ev, usable)
    ev.state_group_before = before_group
    if ev.matrix is not None:
        authorize_event(p, ev, before_map)
    live = not p.backfill
    fast = (live and not ev.rejected_reason and before_group == ctx.current_group
            and (before_group is not None or ctx.head is None) and (ctx.head is None or ev.key > ctx.head))
    accepted = not ev.rejected_reason
    key = (ev.type, ev.state_key) if ev.state_key is not None else None
    if key is not None and accepted:
        reader.put_facts(ev.event_id, ev.membership, normalise_visibility(
            ev.body["content"].get("history_visibility")) if key == HV_KEY else None)
    # the facts the visibility rules need about the state before the event
    if not fast:
        wanted = [before_map.get(HV_KEY), before_map.get((MEMBER, ev.state_key))  # type: ignore[arg-type]
                  if ev.type == MEMBER else None]
        reader.load_facts([e for e in wanted if e is not None])
    vis_before = ctx.visibility if fast else reader.visibility(before_map.get(HV_KEY))
    member_before = None
    if ev.type == MEMBER:
        member_before = (ctx.memberships.get(ev.state_key) if fast  # type: ignore[arg-type]
                         else reader.membership(before_map.get((MEMBER, ev.state_key))))  # type: ignore[arg-type]
    prev_current = None
    after_chain: int | None
    if key is not None and accepted:
        prev_current = ctx.current.get(key) if fast else None
        after_map, after_chain = state_after(p, ctx, ev, key, fast, before_group, before_chain, before_map)
    else:
        after_map, ev.state_group_after, after_chain = before_map, before_group, before_chain
    if not accepted:
        return
    room_bookkeeping(p, ctx, ev, live)
    if fast:
        ctx.current_group, ctx.current_chain, ctx.current_base = ev.state_group_after, after_chain, None
        if key is not None:
            current_changed(p, ev, key, ev.event_id, prev_current)
            if ev.type == MEMBER:
                ctx.memberships[ev.state_key] = ev.membership  # type: ignore[index,assignment]
        at_head(ctx, p.touched, ev, vis_before, member_before)
        if key == HV_KEY:
            ctx.visibility = reader.visibility(ev.event_id)
    else:
        if live:
            recompute_current(p, ctx, ev)
        changed_keys = None if after_map is ctx.current else differing(
            p, [StateRef(ev.state_group_after), current_ref(ctx)], [after_map, ctx.current])
        off_head(ctx, p.touched, reader, ev, after_map, vis_before, member_before, changed_keys)

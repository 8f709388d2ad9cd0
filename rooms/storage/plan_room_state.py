"""The planner's authorization and state step: each event's verdict, the state before and
after it (new state groups, resolutions at forks), the room's current state, and the batch's
redactions. Functions over the batch's :class:`~rooms.storage.plan_progress.Progress`;
the Matrix rules themselves are ``authorization.py``'s (over ``rooms/matrix/``).

The states read here come from the room's context (its current state, recent groups
rebuilt from it by undoing the last changes), the groups planned earlier in the batch, or
the reader; where two states can differ is found from the groups' lineage
(``state_deltas``), never a pass over a big room's whole state.
"""
from __future__ import annotations

from typing import Any

from rooms.matrix.chain_index import IndexEvent
from rooms.matrix.state_res import apply_changes
from rooms.storage.authorization import authorize, resolve_state_changes
from rooms.storage.authorization import redaction_applies as matrix_redaction_applies
from rooms.storage.incoming_events import CREATE, MEMBER, ParsedEvent, RoomInfo, StateKey, StateMap
from rooms.storage.plan import CurrentStateRow, RedactionRow
from rooms.storage.plan_progress import Progress
from rooms.storage.plan_snapshot import Key, PrevInfo, RoomContext
from rooms.storage.plan_visibility import HV_KEY, set_open
from rooms.storage.state_deltas import Resolution, StateRef, changes_between, keys_differing
from rooms.storage.state_groups import NewGroup
from rooms.storage.visibility_ranges import ANYONE, SHARED_ERAS, grants, shared_era

#: how many in-place changes of a room's current state can be undone to give a recent group's
#: state (a fork's branches start a few events back)
UNDO_STEPS = 16


# -- authorization --------------------------------------------------------------------------------

def authorize_event(p: Progress, ev: ParsedEvent, before: StateMap | None) -> None:
    """The verdict of an event of an authorized room (``before``: the state before it;
    None for an outlier, checked against its own auth events only)."""
    assert ev.matrix is not None
    matrix = p.reader.matrix
    if not ev.rejected_reason:
        ev.rejected_reason = authorize(ev.matrix, before, matrix)
    matrix.add(ev.matrix, rejected=bool(ev.rejected_reason))
    if ev.state_key is not None:  # the room's auth graph, for state resolution
        p.reader.chains.add(ev.room_id, IndexEvent(ev.event_id, ev.type, ev.state_key, ev.matrix.auth_event_ids))


def redaction_applies(p: Progress, redaction: Any, target: Any) -> bool:
    """Legacy rooms: any redaction in the room applies. Authorized rooms: the spec's check
    (redact level in the redaction's auth events, or the target's own server)."""
    if redaction is None and target is None:
        return True
    if redaction is None or target is None:
        return False
    return matrix_redaction_applies(redaction, target, p.reader.matrix)


def redactions(p: Progress) -> None:
    """The batch's redactions: their rows, and the events (of the batch or stored) they prune."""
    for ev in p.events:
        if ev.redacts is None or ev.rejected_reason or ev.event_id in p.ex_outliers:
            continue
        p.redaction_rows.append(RedactionRow(ev.event_id, ev.redacts, p.now_ms))
        target = p.by_id.get(ev.redacts)
        if target is not None:
            if target.room_id == ev.room_id and target.type != CREATE and \
                    redaction_applies(p, ev.matrix, target.matrix):
                target.redacted = True
        else:
            stored = p.known.get(ev.redacts)
            if stored is not None and stored.room_id == ev.room_id and (
                    ev.matrix is None or redaction_applies(p, ev.matrix, p.reader.matrix.get(ev.redacts))):
                p.redacted_stored.append(ev.redacts)


# -- states and groups ----------------------------------------------------------------------------

def state_of(p: Progress, ctx: RoomContext, group: int | None) -> StateMap:
    """A group's state: the room's current one, a recent one rebuilt from it by undoing
    the changes since (then kept for the batch), else the reader's."""
    if group is None:
        return {}
    if group == ctx.current_group:
        return ctx.current
    state = p.rebuilt.get(group)
    if state is not None:
        return state
    for i in range(len(ctx.undo) - 1, -1, -1):
        if ctx.undo[i][0] == group:
            state = p.rebuilt[group] = dict(ctx.current)
            for _, key, value in reversed(ctx.undo[i:]):
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = value
            p.reader.remember_state(group, state)
            return state
    return p.reader.state_of_group(group)


def differing(p: Progress, refs: list[StateRef], maps: list[StateMap]) -> set[StateKey]:
    """The keys where the states ``maps`` (named by ``refs``) may differ: from the groups'
    lineage, else (no common ancestor known) by comparing the maps."""
    keys = p.lineage.differing_keys([r.group for r in refs])
    if keys is None:
        return keys_differing(maps)
    for r in refs:
        keys.update(r.keys)
    return keys


def current_ref(ctx: RoomContext) -> StateRef:
    """The room's current state as a :class:`StateRef`."""
    if ctx.current_group is not None:
        return StateRef(ctx.current_group)
    return ctx.current_base or StateRef(None)


def new_group(p: Progress, ev: ParsedEvent, *, parent: int | None, parent_chain_length: int | None,
              delta: dict[StateKey, str], full_state: StateMap) -> NewGroup:
    """A new group whose whole state is known (``full_state``): planned, and its state kept."""
    g = p.reader.new_group(p.next_group_id(), room_id=ev.room_id, event_id=ev.event_id, parent=parent,
                           parent_chain_length=parent_chain_length, delta=delta, full_state=lambda: full_state)
    p.groups.append(g)
    p.reader.remember_state(g.id, full_state)
    return g


def resolve(p: Progress, ctx: RoomContext, prevs: list[tuple[Key, int | None]]) -> Resolution:
    """The state at a fork of the prevs' ``(key, state group after)``: Matrix state
    resolution in an authorized room (v2, or v2.1 from room v12; the same groups resolve
    the same way, so the reader caches the result by them); the older unsigned format (and
    room v1) keeps the stand-in. Either way decided from the keys where the prevs' states
    differ (found from the groups' deltas), never a pass over whole states."""
    info: RoomInfo | None = ctx.info
    groups = [g for _, g in prevs]
    reader = p.reader
    if info is not None and info.authorized and info.version is not None:
        cacheable = None not in groups
        if cacheable:
            cached: Resolution | None = reader.resolved.get(groups)
            if cached is not None:
                return cached
        maps = [state_of(p, ctx, g) for g in groups]
        keys = differing(p, [StateRef(g) for g in groups], maps)
        changes = resolve_state_changes(
            info.version, maps, reader.matrix, differing=keys,
            graph_facts=reader.chains.graph_facts(ctx.room_id, reader.matrix, groups, p.lineage))
        if changes is not None:
            res = Resolution(apply_changes(maps[0], changes), groups[0], frozenset(changes))
            if cacheable:
                reader.resolved.put(groups, res)
            return res
    # the stand-in: the state after the latest prev, plus the keys only the others have
    # (the latest of them that has it)
    ordered = sorted(prevs, key=lambda prev: prev[0], reverse=True)
    maps = [state_of(p, ctx, g) for _, g in ordered]
    state = dict(maps[0])
    added = set()
    for k in differing(p, [StateRef(g) for _, g in ordered], maps):
        if k not in state:
            for m in maps[1:]:
                v = m.get(k)
                if v is not None:
                    state[k] = v
                    added.add(k)
                    break
    return Resolution(state, ordered[0][1], frozenset(added))


def state_before(p: Progress, ctx: RoomContext, ev: ParsedEvent,
                 usable: list[PrevInfo]) -> tuple[int | None, int | None, StateMap]:
    """(group, its chain length, state) before ``ev``: ``state_before`` as a snapshot, the
    prevs' one group, or their states resolved into a new group."""
    reader = p.reader
    if ev.state_before is not None:
        before_map = ev.state_before
        g = new_group(p, ev, parent=None, parent_chain_length=None, delta={}, full_state=before_map)
        return g.id, 1, before_map
    groups = {i.state_group for i in usable}
    if not usable:
        return None, None, {}
    if len(groups) == 1:
        group = next(iter(groups))
        if group is None:
            return None, None, {}
        if group == ctx.current_group:
            return group, ctx.current_chain, ctx.current
        return group, reader.chain_length(group), state_of(p, ctx, group)
    res = resolve(p, ctx, [(i.key, i.state_group) for i in usable])
    resolved = res.state
    # the parent of the new group: any prev's group will do (the latest by key keeps
    # deltas small); its number says nothing about order
    _, base_group = max((i.key, i.state_group) for i in usable)
    base_map = state_of(p, ctx, base_group)
    # what the resolution changed, from the keys where the two can differ (the groups'
    # deltas since their common ancestor and the resolution's own changes)
    delta = changes_between(base_map, resolved, differing(p, [StateRef(base_group), StateRef(res.base, res.keys)],
                                                          [base_map, resolved]))
    if not delta:
        return base_group, reader.chain_length(base_group) if base_group is not None else None, base_map
    added = {k: v for k, v in delta.items() if v is not None}
    dropped = len(added) != len(delta)  # a delta cannot remove a key
    parent = None if dropped else base_group
    g = new_group(p, ev, parent=parent, parent_chain_length=reader.chain_length(parent) if parent else None,
                  delta=added, full_state=resolved)
    p.lineage.add(g.id, base_group, delta)
    return g.id, g.chain_length, resolved


def state_after(p: Progress, ctx: RoomContext, ev: ParsedEvent, key: StateKey, fast: bool,
                before_group: int | None, before_chain: int | None, before_map: StateMap) -> tuple[StateMap, int]:
    """An accepted state event's group after it (a one-row delta); on the fast path the
    room's current map is changed in place and is the group's state."""
    delta = {key: ev.event_id}
    reader = p.reader
    if fast:
        current = ctx.writable_current()
        if before_group is not None:
            ctx.undo.append((before_group, key, current.get(key)))
            del ctx.undo[:-UNDO_STEPS]
        current[key] = ev.event_id
        after_map = current
        g = reader.new_group(p.next_group_id(), room_id=ev.room_id, event_id=ev.event_id, parent=before_group,
                             parent_chain_length=before_chain, delta=delta, full_state=lambda: current)
    else:
        after_map = dict(before_map)
        after_map[key] = ev.event_id
        g = reader.new_group(p.next_group_id(), room_id=ev.room_id, event_id=ev.event_id, parent=before_group,
                             parent_chain_length=before_chain, delta=delta, full_state=lambda: after_map)
        reader.remember_state(g.id, after_map)
    p.groups.append(g)
    p.lineage.add(g.id, before_group, delta)
    ev.state_group_after = g.id
    return after_map, g.chain_length


# -- current state --------------------------------------------------------------------------------

def current_changed(p: Progress, ev: ParsedEvent, key: StateKey, event_id: str | None, prev: str | None) -> None:
    """Current state changed at ``ev``: a row of current_state_events and a ``state`` row."""
    membership = p.reader.membership(event_id) if key[0] == MEMBER else None
    p.current_rows[(ev.room_id, key[0], key[1])] = CurrentStateRow(
        ev.room_id, key[0], key[1], event_id, membership, ev.stream_ordering)
    p.deltas.setdefault(ev.event_id, []).append(
        {"room_id": ev.room_id, "type": key[0], "state_key": key[1], "event_id": event_id, "prev_event_id": prev})


def recompute_current(p: Progress, ctx: RoomContext, ev: ParsedEvent) -> None:
    """After an event off the room's linear head: current state = the resolved state of the
    forward extremities; open visibility ranges follow it."""
    reader = p.reader
    old, old_ref = ctx.current, current_ref(ctx)
    new: StateMap
    if len(ctx.forward) == 1:
        (only,) = ctx.forward.values()
        group = only.state_group
        new = dict(state_of(p, ctx, group))
        new_ref = StateRef(group)
        chain = reader.chain_length(group) if group is not None else None
    else:
        res = resolve(p, ctx, [(x.key, x.state_group) for x in ctx.forward.values()])
        new, new_ref = res.state, StateRef(res.base, res.keys)
        group, chain = None, None
    # only after a fork can a key go (None)
    changed = changes_between(old, new, differing(p, [old_ref, new_ref], [old, new]))
    # the facts asked below: the members' memberships and the history visibility (no other
    # event has any: asking for a topic's read the database for nothing)
    reader.load_facts([v for k, v in changed.items() if v is not None and (k[0] == MEMBER or k == HV_KEY)])
    old_vis = ctx.visibility
    if ctx.current_group is not None:  # no longer changed in place: the group's state as it is
        reader.remember_state(ctx.current_group, old)
    ctx.current, ctx.current_group, ctx.current_chain = new, group, chain
    # a resolved state is shared with the resolutions' cache: copied before any change
    ctx.current_shared = group is None
    ctx.current_base = None if group is not None else new_ref
    ctx.undo.clear()
    for k, eid in changed.items():
        current_changed(p, ev, k, eid, old.get(k))
        if k[0] == MEMBER:
            if eid is None:
                ctx.memberships.pop(k[1], None)
            else:
                ctx.memberships[k[1]] = reader.membership(eid) or "leave"
    ctx.visibility = reader.visibility(new.get(HV_KEY))
    users = {k[1] for k in changed if k[0] == MEMBER}
    if old_vis != ctx.visibility:
        users.update(ctx.invited)
    for u in users:
        set_open(ctx, p.touched, u, grants(ctx.memberships.get(u), ctx.visibility), ev.key)
    set_open(ctx, p.touched, ANYONE, ctx.visibility == "world_readable", ev.key)
    set_open(ctx, p.touched, SHARED_ERAS, shared_era(ctx.visibility), ev.key)

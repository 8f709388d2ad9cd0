"""The planner's visibility steps: how one accepted event changes a room's ranges.

Each function changes the room context's :class:`~rooms.storage.visibility_ranges.RangeSet` s in
place, adds the (room, user) pairs it touched to ``touched`` (their rows from the first
changed range on are rewritten: ``RangeSet.stored``) and
marks the user's latest bound (``RoomContext.marks``: what lets an event off the head be
decided for the few users whose answer can differ from their open range's).
A user's ranges hold only what their own membership grants: the shared-history eras before
their latest join are ``*shared``'s ranges, which the reads clip at that join (a join copies
nothing: copies grew as joins x eras, quadratically in a big room's length).
The rules themselves are ``visibility.py``'s; docs/storage.md, "Visibility", says why.
"""
from __future__ import annotations

from collections.abc import Collection

from rooms.storage.incoming_events import CREATE, HISTORY_VISIBILITY, MEMBER, ParsedEvent, StateKey, StateMap
from rooms.storage.plan_snapshot import Key, PlanReader, RoomContext
from rooms.storage.visibility_ranges import ANYONE, SHARED_ERAS, grants, normalise_visibility, shared_era, visible_to_member

HV_KEY: StateKey = (HISTORY_VISIBILITY, "")
Touched = set[tuple[str, str]]


def changed(ctx: RoomContext, touched: Touched, user: str) -> None:
    """``user``'s ranges changed: rewrite their rows, mark their latest bound."""
    touched.add((ctx.room_id, user))
    if not user.startswith("*"):
        ctx.mark(user, ctx.ranges[user].last_bound)


def switch(ctx: RoomContext, touched: Touched, user: str, before: bool, after: bool, k: Key) -> None:
    """A rule flips at event ``k`` for ``user``: the event is visible if it held before or after."""
    if before == after:
        return
    rs = ctx.user_ranges(user)
    if after and not rs.is_open:
        rs.add(k, None)
    elif before and not after:
        if not rs.covers(k):
            rs.add(k, k)
        rs.close_at(k)
    changed(ctx, touched, user)


def at_head(ctx: RoomContext, touched: Touched, ev: ParsedEvent, vis: str, member_before: str | None) -> None:
    """An event at the room's head on the current state (the fast path): only what it
    changes -- its own member's range, or the rules a visibility event flips."""
    k = ev.key
    if ctx.head == k and len(ctx.forward) == 1 and ev.type == CREATE:
        switch(ctx, touched, SHARED_ERAS, False, shared_era(vis), k)
        switch(ctx, touched, ANYONE, False, vis == "world_readable", k)
    if ev.type == MEMBER:
        u = ev.state_key
        assert u is not None
        rs = ctx.user_ranges(u)
        own = visible_to_member(vis_values=(vis,), membership_after=ev.membership,
                                own_change=(ev.membership, member_before))
        after_open = grants(ev.membership, vis)
        if own and not rs.covers(k):
            rs.add(k, None if after_open else k)
        elif not own and rs.covers(k):
            rs.remove_point(k)
        if rs.is_open and not after_open:
            rs.close_at(k)
        elif after_open and not rs.is_open:
            rs.add(k, None)
        changed(ctx, touched, u)
    elif (ev.type, ev.state_key) == HV_KEY:
        new = normalise_visibility(ev.body["content"].get("history_visibility"))
        for u in list(ctx.invited):
            switch(ctx, touched, u, vis == "invited", new == "invited", k)
        switch(ctx, touched, ANYONE, vis == "world_readable", new == "world_readable", k)
        switch(ctx, touched, SHARED_ERAS, shared_era(vis), shared_era(new), k)


def off_head(ctx: RoomContext, touched: Touched, reader: PlanReader, ev: ParsedEvent, after_map: StateMap,
             vis_before: str, member_before: str | None, differing: Collection[StateKey] | None = None) -> None:
    """An event persisted off the head (backfill, forks), decided with the rules for every
    user whose answer can differ from what their ranges already say at its key.

    Any other user ``u`` has the same member event after it as in the room's current state,
    no mark at or after its key (so ``u``'s ranges cover it iff ``u``'s last range is open),
    and is not its member: the rules then grant it iff ``u``'s current membership is granted
    under one of its visibility values -- which is whether the range is open (it is open iff
    the current membership is granted under the current visibility) unless that value is
    another one, when the invited may differ. So the users decided are: those whose member
    event differs from the current state's, those marked since the key (joins included: a
    later join changes no user row now, but rows written before held copies of the shared
    eras before the join, and an event inside one must be decided for its holder), the
    event's own member, and the invited when the visibility differs. The cost follows the
    state's difference from the current state (``differing``: the keys where the two can
    differ, from the state groups' deltas), never the room's member count. Whether a
    later join lets ``u`` see a shared-era event is not decided here: ``*shared``'s point
    is, and the reads clip it at ``u``'s latest join."""
    k = ev.key
    hv = after_map.get(HV_KEY)
    reader.load_facts([hv] if hv is not None else [])
    vis_after = reader.visibility(hv)
    vis_values = (vis_after, vis_before) if (ev.type, ev.state_key) == HV_KEY else (vis_after,)
    current = ctx.current
    candidates = ctx.marked_since(k)
    if after_map is not current:
        if differing is None:  # compare the whole states
            candidates.update(s for (t, s), _ in after_map.items() ^ current.items() if t == MEMBER)
        else:  # only the keys where they can differ (``state_deltas``)
            candidates.update(k[1] for k in differing if k[0] == MEMBER and after_map.get(k) != current.get(k))
    if any(v != ctx.visibility for v in vis_values):
        candidates.update(ctx.invited)
    if ev.type == MEMBER:
        assert ev.state_key is not None
        candidates.add(ev.state_key)
    candidates = {u for u in candidates if not u.startswith("*")}
    member_events = {u: after_map.get((MEMBER, u)) for u in candidates}
    reader.load_facts([e for e in member_events.values() if e is not None])
    for u in candidates:
        own = (ev.membership, member_before) if ev.type == MEMBER and ev.state_key == u else None
        want = visible_to_member(vis_values=vis_values, membership_after=reader.membership(member_events[u]),
                                 own_change=own)
        point(ctx, touched, u, want, k)
    point(ctx, touched, ANYONE, "world_readable" in vis_values, k)
    point(ctx, touched, SHARED_ERAS, any(shared_era(v) for v in vis_values), k)


def point(ctx: RoomContext, touched: Touched, user: str, want: bool, k: Key) -> None:
    """``user`` sees the event at ``k`` iff ``want``."""
    rs = ctx.ranges.get(user)
    has = rs is not None and rs.covers(k)
    if want and not has:
        ctx.user_ranges(user).add(k, k)
    elif has and not want:
        ctx.user_ranges(user).remove_point(k)
    else:
        return
    changed(ctx, touched, user)


def set_open(ctx: RoomContext, touched: Touched, user: str, should: bool, k: Key) -> None:
    """After current state changed at ``k``: ``user`` sees each new event iff ``should``
    (events up to the head stay as they were decided; the event itself is decided next)."""
    rs = ctx.user_ranges(user)
    at_head = ctx.head is None or ctx.head <= k
    if rs.is_open and not should:
        rs.close_at((k[0], k[1] - 1) if at_head or ctx.head is None else ctx.head)
        changed(ctx, touched, user)
    elif should and not rs.is_open:
        rs.add(k if at_head or ctx.head is None else (ctx.head[0], ctx.head[1] + 1), None)
        changed(ctx, touched, user)

"""The planner's visibility steps by value: an event off the head is decided only for the
users whose answer can differ from their ranges, and the ranges come out as if every user
had been decided (the rule that made the cost follow the state's difference from the current
state instead of the room's member count; docs/storage.md, "Visibility")."""
from __future__ import annotations

import pytest

from rooms.storage import planner
from rooms.storage.generator import RoomGenerator
from rooms.storage.incoming_events import MEMBER, ParsedEvent, StateMap
from rooms.storage.plan_snapshot import PlanReader, RoomContext
from rooms.storage.plan_visibility import HV_KEY, Touched, point
from rooms.storage.visibility_ranges import (
    ANYONE,
    SHARED_ERAS,
    RangeSet,
    normalise_visibility,
    sees,
    shared_era,
    visible_to_member,
)
from tests.rooms.storage.test_planner import A, B, M, MemoryStore, new_room, pdu


def off_head_every_user(ctx: RoomContext, touched: Touched, reader: PlanReader, ev: ParsedEvent,
                        after_map: StateMap, vis_before: str, member_before: str | None,
                        differing=None) -> None:
    """The reference: the rules applied to every member, joiner and ranged user of the room
    (``differing``, the planner's keys where the after state and current state can differ,
    is not used: the whole states are read)."""
    k = ev.key
    reader.load_facts([e for (t, s), e in after_map.items() if t == MEMBER or (t, s) == HV_KEY])
    vis_after = reader.visibility(after_map.get(HV_KEY))
    vis_values = (vis_after, vis_before) if (ev.type, ev.state_key) == HV_KEY else (vis_after,)
    members = {s: reader.membership(e) for (t, s), e in after_map.items() if t == MEMBER}
    for u in set(members) | set(ctx.last_join) | {u for u in ctx.ranges if not u.startswith("*")}:
        own = (ev.membership, member_before) if ev.type == MEMBER and ev.state_key == u else None
        point(ctx, touched, u, visible_to_member(vis_values=vis_values, membership_after=members.get(u),
                                                 own_change=own), k)
    point(ctx, touched, ANYONE, "world_readable" in vis_values, k)
    point(ctx, touched, SHARED_ERAS, any(shared_era(v) for v in vis_values), k)


def all_ranges(store: MemoryStore) -> dict[tuple[str, str], list]:
    return {(r, u): rs.as_tuples() for r, ctx in store.rooms.items() for u, rs in ctx.ranges.items() if rs.ranges}


@pytest.mark.parametrize("seed", [3, 7])
def test_off_head_events_decided_as_for_every_user(seed, monkeypatch):
    """Generated rooms (a big one with churn, forks that change the history visibility on one
    branch, invites, bans, federated joins and their backfilled history), planned batch by
    batch twice: with the planner's off-head step and with the reference that decides every
    user. Every batch's rows and every range must be the same."""
    gen = RoomGenerator(rooms=6, users=60, events=4000, seed=seed, batch=100, backfill_fraction=0.5)
    fast, reference = MemoryStore(), MemoryStore()
    calls = {"live": 0, "backfill": 0}
    real = planner.off_head

    def off_head(ctx, touched, reader, ev, *args) -> None:
        calls["backfill" if ev.stream_ordering < 0 or backfill else "live"] += 1
        real(ctx, touched, reader, ev, *args)

    for batch in gen.batches():
        backfill = batch.backfill
        monkeypatch.setattr(planner, "off_head", off_head)
        plan = fast.plan(*batch.items, backfill=batch.backfill)
        monkeypatch.setattr(planner, "off_head", off_head_every_user)
        want = reference.plan(*batch.items, backfill=batch.backfill)
        assert plan.visibility_cuts == want.visibility_cuts
        assert plan.visibility_ranges == want.visibility_ranges
    assert all_ranges(fast) == all_ranges(reference)
    # the dataset has what is tested: forks in a big room, backfilled history
    big = max(fast.rooms.values(), key=lambda c: len(c.memberships))
    assert len(big.memberships) > 40 and calls["live"] > 20 and calls["backfill"] > 20, calls


class EventFacts:
    """What the rules read about each accepted event as the planner decided it: its key, its
    visibility values, the memberships after it, its own member change. Recorded around the
    planner's own steps (``at_head``/``off_head``), so the reference sees the same states."""

    def __init__(self, monkeypatch) -> None:
        self.events: dict[str, list[tuple]] = {}  # room -> [(key, vis_values, members, own)]
        real_at_head, real_off_head = planner.at_head, planner.off_head

        def at_head(ctx, touched, ev, vis, member_before) -> None:
            real_at_head(ctx, touched, ev, vis, member_before)
            values = ((normalise_visibility(ev.body["content"].get("history_visibility")), vis)
                      if (ev.type, ev.state_key) == HV_KEY else (vis,))
            self._record(ctx, ev, values, dict(ctx.memberships), member_before)

        def off_head(ctx, touched, reader, ev, after_map, vis_before, member_before, differing=None) -> None:
            real_off_head(ctx, touched, reader, ev, after_map, vis_before, member_before, differing)
            reader.load_facts([e for (t, s), e in after_map.items() if t == MEMBER or (t, s) == HV_KEY])
            vis_after = reader.visibility(after_map.get(HV_KEY))
            values = (vis_after, vis_before) if (ev.type, ev.state_key) == HV_KEY else (vis_after,)
            members = {s: reader.membership(e) for (t, s), e in after_map.items() if t == MEMBER}
            self._record(ctx, ev, values, members, member_before)

        monkeypatch.setattr(planner, "at_head", at_head)
        monkeypatch.setattr(planner, "off_head", off_head)

    def _record(self, ctx, ev, values, members, member_before) -> None:
        own = (ev.state_key, ev.membership, member_before) if ev.type == MEMBER else None
        self.events.setdefault(ctx.room_id, []).append((ev.key, values, members, own))


@pytest.mark.parametrize("seed", [3, 7])
def test_ranges_with_shared_eras_clipped_at_the_latest_join_are_the_rules(seed, monkeypatch):
    """No user row copies a shared-history era any more: a user sees an event iff their own
    rows or ``*``'s cover it, or ``*shared``'s do and it is before their latest join. On
    generated rooms (churn in a big room, forks, visibility changes, backfill) that is, for
    every accepted event and every user, the rules decided directly -- what the copied eras
    gave before (the reads' rule, ``visibility.sees``, against ``visible_to_member`` with
    ``joins_later`` from the room's joins)."""
    gen = RoomGenerator(rooms=6, users=60, events=4000, seed=seed, batch=100, backfill_fraction=0.5)
    facts = EventFacts(monkeypatch)
    store = MemoryStore()
    for batch in gen.batches():
        store.plan(*batch.items, backfill=batch.backfill)
    checked = through_shared = 0
    for room_id, events in facts.events.items():
        ctx = store.rooms[room_id]
        joins: dict[str, tuple] = {}
        for k, _, _, own in events:
            if own is not None and own[1] == "join":
                joins[own[0]] = max(k, joins.get(own[0], k))
        assert joins == ctx.last_join  # J: the latest accepted join, as the reads look it up
        users = {u for _, _, members, _ in events for u in members} | set(joins)
        users |= {u for u in ctx.ranges if not u.startswith("*")}
        for k, values, members, own in events:
            for u in users:
                change = (own[1], own[2]) if own is not None and own[0] == u else None
                later = joins.get(u)
                want = "world_readable" in values or visible_to_member(
                    vis_values=values, membership_after=members.get(u), own_change=change,
                    joins_later=later is not None and later > k)
                assert sees(ctx.ranges, ctx.last_join.get(u), u, k) == want, (room_id, u, k)
                checked += 1
                if want and not any((ctx.ranges.get(h) or RangeSet()).covers(k) for h in (u, ANYONE)):
                    through_shared += 1
    # the dataset has what is tested: events a user sees only through *shared before their join
    assert checked > 50_000 and through_shared > 1_000, (checked, through_shared)
    big = max(store.rooms.values(), key=lambda c: len(c.memberships))
    rows = sum(len(rs.ranges) for u, rs in big.ranges.items() if not u.startswith("*"))
    assert rows < 4 * len(big.last_join) + len(big.ranges), rows  # own grants only: a few rows per user


class CountingStore(MemoryStore):
    """A store whose reader records which events' facts the planner asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []
        load = self.reader.load_facts

        def load_facts(event_ids) -> None:
            ids = list(event_ids)
            self.asked.extend(ids)
            load(ids)

        self.reader.load_facts = load_facts  # type: ignore[method-assign]


def test_an_event_on_a_branch_is_decided_for_the_users_it_can_change():
    """50 members; a fork: the history visibility becomes ``joined`` on one branch, a message
    on the other (still ``invited``). The message's state differs from the current state only
    in the visibility, so only the invited user is decided: the members' events are never
    asked about, and the ranges are as the rules say (the invitee sees the message, the
    others as their open ranges)."""
    room = new_room(visibility="invited")
    users = [f"@u{i}:a.example" for i in range(50)]
    for u in users:
        room.send(u, MEMBER, {"membership": "join"}, state_key=u)
    room.send(A, MEMBER, {"membership": "invite"}, state_key=M)
    store = CountingStore()
    store.plan(*[pdu(room, e) for e in room.order])
    tip = room.order[-1]
    hv = room.send(A, "m.room.history_visibility", {"history_visibility": "joined"}, state_key="", prev_ids=[tip])
    msg = room.send(users[0], "m.room.message", {"body": "on the other branch"}, prev_ids=[tip])
    store.asked.clear()
    plan = store.plan(pdu(room, hv), pdu(room, msg))
    member_events = {e for e in room.order if room.events[e].type == MEMBER}
    assert not member_events & set(store.asked) - {room.state_after[tip][(MEMBER, M)]}
    ctx = store.rooms[room.room_id]
    k_hv, k_msg = store.known[hv].key, store.known[msg].key
    assert ctx.ranges[M].covers(k_msg) and ctx.ranges[M].covers(k_hv)  # invited, before or after the change
    assert all(ctx.ranges[u].covers(k_msg) for u in users)
    assert {c.user_id for c in plan.visibility_cuts} == {M}
    assert B not in ctx.ranges


def test_range_set_union_and_last_bound():
    rs = RangeSet([[(1, 1), (1, 4)], [(5, 1), (5, 1)], [(9, 1), None]])
    assert rs.last_bound == (9, 1)
    for s, e in [((0, 1), (0, 9)), ((1, 5), (2, 0)), ((4, 0), (5, 0)), ((7, 0), (7, 3))]:
        rs.add(s, e)
    assert rs.as_tuples() == [((0, 1), (0, 9)), ((1, 1), (2, 0)), ((4, 0), (5, 1)), ((7, 0), (7, 3)),
                              ((9, 1), None)]
    closed = RangeSet([[(1, 1), (3, 2)]])
    assert closed.last_bound == (3, 2) and RangeSet().last_bound is None


def test_marks_name_the_users_whose_ranges_or_joins_reach_a_key():
    ctx = RoomContext("!r:hs")
    ctx.user_ranges("@a:hs").add((1, 1), None)
    ctx.mark("@a:hs", (1, 1))
    ctx.user_ranges("@b:hs").add((2, 1), (5, 5))
    ctx.mark("@b:hs", (5, 5))
    ctx.joined_at("@c:hs", (7, 1))
    ctx.joined_at("@c:hs", (3, 1))  # not the latest: no mark
    assert ctx.marked_since((5, 5)) == {"@b:hs", "@c:hs"}
    assert ctx.marked_since((5, 6)) == {"@c:hs"}
    assert ctx.marked_since((1, 1)) == {"@a:hs", "@b:hs", "@c:hs"}
    assert ctx.last_join == {"@c:hs": (7, 1)}
    ctx.mark("@a:hs", (9, 9))
    ctx.remark()  # the stale (9, 9) goes: @a's ranges reach (1, 1) only
    assert ctx.marks == [((1, 1), "@a:hs"), ((5, 5), "@b:hs"), ((7, 1), "@c:hs")]


def test_range_set_add_agrees_with_a_model_of_covered_keys():
    """``add`` (by bisection) gives canonical ranges covering exactly the keys added, on
    random ranges over a small key grid."""
    import random

    rng = random.Random(5)
    grid = [(t, s) for t in range(4) for s in range(6)]
    for _ in range(400):
        one, covered = RangeSet(), set()
        for _ in range(rng.randrange(1, 8)):
            a, b = sorted(rng.sample(range(len(grid)), 2))
            start, end = grid[a], (None if rng.random() < 0.15 else grid[b])
            one.add(start, end)
            covered.update(k for k in grid if start <= k and (end is None or k <= end))
        assert {k for k in grid if one.covers(k)} == covered
        starts = [r[0] for r in one.ranges]
        assert starts == sorted(starts) and all(r[1] is not None for r in one.ranges[:-1])
        # canonical: disjoint, and no two touching (they would have been merged)
        assert all((end[0], end[1] + 1) < nxt for (_, end), (nxt, _) in zip(one.ranges, one.ranges[1:]))

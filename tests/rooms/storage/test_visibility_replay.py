"""Visibility ranges vs the rules evaluated event by event from scratch, on random room
histories (memberships, visibility changes) persisted in random batches."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rooms.storage.reads import incremental_sync, initial_sync, room_messages
from rooms.storage.synthetic import RoomBuilder
from rooms.storage.tokens import RoomStreamToken
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES
ROOMS = itertools.count()
CREATOR, USERS = "@c:hs", ["@u1:hs", "@u2:hs", "@u3:hs"]
OUTSIDER = "@nobody:hs"
VIS = ["world_readable", "shared", "invited", "joined", "bogus"]
PRIORITY = ["join", "invite", "knock", "leave", "ban"]

op = st.one_of(
    st.tuples(st.just("msg")),
    st.tuples(st.just("member"), st.sampled_from(USERS), st.sampled_from(["join", "leave", "invite", "knock", "ban"])),
    st.tuples(st.just("vis"), st.sampled_from(VIS)),
)


def expected_visible(history, user):
    """history: [(event_id, kind, state_key, membership, vis_value)] in order."""
    vis, members = "shared", {}
    after, before = [], []
    for _, kind, key, membership, value in history:
        before.append((vis, dict(members)))
        if kind == "vis":
            vis = value if value in VIS[:4] else "shared"
        elif kind == "member":
            members[key] = membership
        after.append((vis, dict(members)))
    joins = [i for i, h in enumerate(history) if h[1] == "member" and h[2] == user and h[3] == "join"]
    out = []
    for i, (eid, kind, key, membership, _) in enumerate(history):
        values = {after[i][0]} | ({before[i][0]} if kind == "vis" else set())
        ok = "world_readable" in values
        for v in values:
            if kind == "member" and key == user:
                prev = before[i][1].get(user) or "leave"
                if membership == "leave" and prev in ("join", "invite"):
                    ok = True
                m = min(membership, prev, key=PRIORITY.index)
            else:
                m = after[i][1].get(user)
            if m == "join" or (m == "invite" and v == "invited"):
                ok = True
            if v in ("shared", "world_readable") and any(j > i for j in joins):
                ok = True
        if ok:
            out.append(eid)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.lists(op, max_size=40), st.integers(1, 15), st.integers(2, 6))
def test_ranges_match_the_rules(store, ops, batch, page):
    room_id = f"!vr{next(ROOMS)}:hs"
    b = RoomBuilder(room_id, server="hs")
    history, raws = [], []
    for kind, key, membership, value, ev in [("create", "", None, None, b.create(CREATOR)),
                                             ("member", CREATOR, "join", None, b.member(CREATOR, "join"))]:
        history.append((ev[0], kind, key, membership, value))
        raws.append(ev[1])
    for o in ops:
        if o[0] == "msg":
            ev = b.message(CREATOR, "m")
            history.append((ev[0], "msg", None, None, None))
        elif o[0] == "member":
            ev = b.member(o[1], o[2], sender=CREATOR if o[2] in ("invite", "ban") else None)
            history.append((ev[0], "member", o[1], o[2], None))
        else:
            ev = b.visibility(CREATOR, o[1])
            history.append((ev[0], "vis", "", None, o[1]))
        raws.append(ev[1])
    for i in range(0, len(raws), batch):
        store.persist(*raws[i:i + batch])
    for user in USERS + [OUTSIDER, CREATOR]:
        got = [e.event_id for e in room_messages(room_id, user, direction="f", limit=1000)["chunk"]]
        expected = expected_visible(history, user)
        assert got == expected, user
        if user not in USERS:
            continue
        # page by page both ways: a page may end inside a range, and the user's ranges and
        # the world-readable ones overlap (reads walk each holder's ranges and stop at the limit)
        assert paged(room_id, user, "f", page) == expected, user
        assert paged(room_id, user, "b", page) == expected[::-1], user
        if expected:
            timeline = initial_sync(user, limit=page)["rooms"].get(room_id, {}).get("timeline")
            joined = history_membership(history, user) == "join"
            assert ([e.event_id for e in timeline["events"]] if timeline else []) == (expected[-page:] if joined else [])


def paged(room_id, user, direction, limit):
    out, token = [], None
    while True:
        page = room_messages(room_id, user, direction=direction, from_token=token, limit=limit)
        out += [e.event_id for e in page["chunk"]]
        assert len(page["chunk"]) <= limit
        if page["end"] is None:
            return out
        token = page["end"]


def history_membership(history, user):
    membership = None
    for _, kind, key, m, _ in history:
        if kind == "member" and key == user:
            membership = m
    return membership


# -- the same with forks and merges: state after each event from a replay of the DAG ----------

fork_op = st.tuples(op, st.integers(0, 4), st.booleans())  # (what, how far back, merge with the tip)


def _resolve(states):
    """As the store's stand-in for state resolution: the latest prev's state, plus what only
    the others have (states sorted latest first)."""
    out = dict(states[0])
    for s in states[1:]:
        for k, v in s.items():
            out.setdefault(k, v)
    return out


# a join on a branch, merged: the user sees each event after the merge (found by this test)
FORK_JOIN_MERGE = [(("msg",), 1, False), (("msg",), 0, False), (("member", "@u1:hs", "join"), 2, True), (("msg",), 0, False)]
# a fork from before a join, persisted after it: before the join by key (shared history, so
# visible to the joiner), after it in the stream; an incremental sync must still find it
LATE_FORK_BEFORE_JOIN = [(("member", "@u1:hs", "join"), 0, False), (("msg",), 0, False), (("msg",), 3, False)]
# ... and two of the joiner's own events after it in the stream: the newest page holds own
# events on both sides of the late fork
LATE_FORK_BETWEEN_OWN = LATE_FORK_BEFORE_JOIN + [(("msg",), 1, False), (("msg",), 0, False)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.lists(fork_op, max_size=30), st.integers(1, 12))
@example(FORK_JOIN_MERGE, 1)
@example(FORK_JOIN_MERGE, 10)
@example(LATE_FORK_BEFORE_JOIN, 1)
@example(LATE_FORK_BEFORE_JOIN, 5)
@example(LATE_FORK_BETWEEN_OWN, 1)
def test_ranges_match_the_rules_on_forked_rooms(store, ops, batch):
    room_id = f"!vf{next(ROOMS)}:hs"
    b = RoomBuilder(room_id, server="hs")
    events = []  # (event_id, prevs, kind, key, membership, vis value, raw)
    c = b.create(CREATOR)
    events.append((c[0], [], "create", ("m.room.create", ""), None, None, c[1]))
    j = b.member(CREATOR, "join")
    events.append((j[0], [c[0]], "member", ("m.room.member", CREATOR), "join", None, j[1]))
    for (o, back, merge) in ops:
        ids = [e[0] for e in events]
        base = ids[-1 - min(back, len(ids) - 1)]
        prevs = sorted({base, ids[-1]}) if merge else [base]
        if o[0] == "msg":
            ev = b.event("m.room.message", CREATOR, {"body": "m"}, prev=prevs)
            events.append((ev[0], prevs, "msg", None, None, None, ev[1]))
        elif o[0] == "member":
            sender = CREATOR if o[2] in ("invite", "ban") else o[1]
            ev = b.event("m.room.member", sender, {"membership": o[2]}, state_key=o[1], prev=prevs)
            events.append((ev[0], prevs, "member", ("m.room.member", o[1]), o[2], None, ev[1]))
        else:
            ev = b.event("m.room.history_visibility", CREATOR, {"history_visibility": o[1]}, state_key="", prev=prevs)
            events.append((ev[0], prevs, "vis", ("m.room.history_visibility", ""), None, o[1], ev[1]))
    persisted = []
    for i in range(0, len(events), batch):
        persisted += store.persist(*[e[-1] for e in events[i:i + batch]])
    key = {p.event_id: (p.topological_ordering, p.stream_ordering) for p in persisted}
    info = {e[0]: e for e in events}
    _check_late_stream(room_id, key)

    def vis_of(state):
        eid = state.get(("m.room.history_visibility", ""))
        value = info[eid][5] if eid else None
        return value if value in VIS[:4] else "shared"

    def member_of(state, user):
        eid = state.get(("m.room.member", user))
        return info[eid][4] if eid else None

    after, before = {}, {}
    for eid, prevs, _kind, skey, *_ in events:
        before[eid] = _resolve([after[p] for p in sorted(prevs, key=key.get, reverse=True)]) if prevs else {}
        after[eid] = dict(before[eid])
        if skey is not None:
            after[eid][skey] = eid
    order = sorted(info, key=key.get)
    for user in USERS + [OUTSIDER, CREATOR]:
        joins = [key[e] for e in info if info[e][2] == "member" and info[e][3][1] == user and info[e][4] == "join"]
        want = []
        for eid in order:
            kind, membership = info[eid][2], info[eid][4]
            values = {vis_of(after[eid])} | ({vis_of(before[eid])} if kind == "vis" else set())
            ok = "world_readable" in values
            for v in values:
                if kind == "member" and info[eid][3][1] == user:
                    prev = member_of(before[eid], user) or "leave"
                    if membership == "leave" and prev in ("join", "invite"):
                        ok = True
                    m = min(membership, prev, key=PRIORITY.index)
                else:
                    m = member_of(after[eid], user)
                if m == "join" or (m == "invite" and v == "invited"):
                    ok = True
                if v in ("shared", "world_readable") and any(k > key[eid] for k in joins):
                    ok = True
            if ok:
                want.append(eid)
        got = [e.event_id for e in room_messages(room_id, user, direction="f", limit=1000)["chunk"]]
        assert got == want, user
        if user != OUTSIDER:
            _check_incremental_sync(room_id, user, want, key)


def _check_late_stream(room_id, key):
    """The persist path's ``rooms.late_stream`` is the highest stream ordering of an event
    below an earlier one (one writer stores the stream in order, so its marks are exact),
    and the migration that fills it for stored rooms agrees."""
    import importlib

    from django.db import connection

    by_stream = sorted(key.values(), key=lambda k: k[1])
    late = [s for i, (t, s) in enumerate(by_stream) if any(t < u for u, _ in by_stream[:i])]
    with connection.cursor() as c:
        c.execute("SELECT late_stream FROM rooms WHERE room_id = %s", [room_id])
        assert c.fetchone()[0] == (max(late) if late else None)
        c.execute(f"SELECT late FROM ({importlib.import_module('streams.migrations.0013_room_late_stream').LATE_EVENTS}) l "
                  "WHERE room_id = %s", [room_id])
        found = c.fetchone()
        assert (found[0] if found else None) == (max(late) if late else None)


def _check_incremental_sync(room_id, user, visible, key, limit=3):
    """Incremental sync from tokens inside the history: the room's newest ``limit`` visible
    events after the token by stream ordering, oldest first; a fork or a late join puts
    events before the join (by key) after it in the stream, which each walk must still find."""
    from django.db import connection

    streams = sorted(s for _, s in key.values())
    with connection.cursor() as c:
        c.execute("SELECT 1 FROM current_state_events WHERE room_id = %s AND type = 'm.room.member' "
                  "AND state_key = %s AND membership = 'join'", [room_id, user])
        joined = c.fetchone() is not None
    for since in {streams[0], streams[len(streams) // 3], streams[2 * len(streams) // 3], streams[-2]}:
        window = sorted((e for e in visible if key[e][1] > since), key=lambda e: key[e][1])
        room = incremental_sync(user, RoomStreamToken(since), limit=limit)["rooms"].get(room_id, {}).get("timeline")
        if room is not None:
            assert [e.event_id for e in room["events"]] == window[-limit:], (user, since)
        elif joined:
            assert window == [], (user, since)

"""Visibility ranges vs the rules evaluated event by event from scratch, on random room
histories (memberships, visibility changes) persisted in random batches."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.storage.reads import room_messages
from streams.storage.synthetic import RoomBuilder

from .helpers import store  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
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
@given(st.lists(op, max_size=40), st.integers(1, 15))
def test_ranges_match_the_rules(store, ops, batch):
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
        assert got == expected_visible(history, user), user

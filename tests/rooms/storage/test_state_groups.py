"""State at every event of random room DAGs (forks, merges, long chains) equals a brute-force
replay of the room; chains never exceed 100 groups."""
from __future__ import annotations

import itertools

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rooms.storage.reads import state_at_event
from rooms.storage.synthetic import RoomBuilder
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES
ROOMS = itertools.count()

# an event: (how many prevs 1-2, how far back to fork, kind, which key)
step = st.tuples(st.integers(1, 2), st.integers(0, 3), st.sampled_from(["msg", "state", "state", "member"]),
                 st.integers(0, 6))
dags = st.lists(step, min_size=1, max_size=80)


def replay(events, keys):
    """State after each event, computed from scratch: after = resolve(state after prevs) + own key,
    where resolve starts from the latest prev by (topological, stream) and adds what only the
    others have."""
    after: dict[str, dict] = {}
    for eid, prevs, skey in events:
        if not prevs:
            state = {}
        else:
            ordered = sorted(prevs, key=lambda p: keys[p], reverse=True)
            state = dict(after[ordered[0]])
            for p in ordered[1:]:
                for k, v in after[p].items():
                    state.setdefault(k, v)
        if skey is not None:
            state[skey] = eid
        after[eid] = state
    return after


def build(steps, room_id):
    b = RoomBuilder(room_id)
    out = []
    cid, raw = b.create("@u0:localhost")
    out.append((cid, [], ("m.room.create", ""), raw))
    for n_prev, back, kind, which in steps:
        ids = [e[0] for e in out]
        prevs = sorted({ids[-1 - min(back, len(ids) - 1)], ids[-1]})[:n_prev]
        if kind == "msg":
            eid, raw = b.event("m.room.message", "@u0:localhost", {"body": "x"}, prev=prevs)
            skey = None
        elif kind == "state":
            t = ("m.room.name", "m.room.topic", "m.room.avatar")[which % 3]
            eid, raw = b.event(t, "@u0:localhost", {"v": which}, state_key="", prev=prevs)
            skey = (t, "")
        else:
            user = f"@u{which}:localhost"
            eid, raw = b.event("m.room.member", user, {"membership": "join"}, state_key=user, prev=prevs)
            skey = ("m.room.member", user)
        out.append((eid, prevs, skey, raw))
    return out


def check(store, events, batch):
    persisted = []
    for i in range(0, len(events), batch):
        persisted += store.persist(*[raw for *_, raw in events[i:i + batch]])
    keys = {p.event_id: (p.topological_ordering, p.stream_ordering) for p in persisted}
    expected = replay([(e, p, k) for e, p, k, _ in events], keys)
    for eid, *_ in events:
        assert state_at_event(eid) == expected[eid], eid


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(dags, st.integers(1, 30))
def test_state_at_event_matches_replay(store, steps, batch):
    check(store, build(steps, f"!dag{next(ROOMS)}:localhost"), batch)


def test_long_chain_gets_snapshots_every_100_groups(store):
    steps = [(1, 0, "member", i % 7) for i in range(250)]
    check(store, build(steps, "!long:localhost"), 50)
    with connection.cursor() as c:
        c.execute("SELECT max(chain_length), count(*) FILTER (WHERE chain_length = 1) FROM state_groups "
                  "WHERE room_id = '!long:localhost'")
        longest, snapshots = c.fetchone()
    assert longest == 100 and snapshots == 3  # 251 groups: 1-100, 101-200, 201-251


def test_changed_keys_between_groups(store):
    """``StateGroupStore.changed_keys`` (the sync's deltas): every key where two groups' states
    differ, and only keys of theirs; between two groups of one delta chain without reading
    either whole state, across snapshots and forks by comparing them."""
    import random

    from rooms.storage.sql import store_cursor
    from rooms.storage.state_groups import StateGroupStore

    steps = [(1, 0, "member", i % 7) for i in range(150)] + [(2, 3, "state", i) for i in range(30)]
    events = build(steps, "!delta:localhost")
    check(store, events, 40)
    with connection.cursor() as c:
        c.execute("SELECT g.event_id, g.state_group FROM event_to_state_groups g JOIN events e USING (event_id) "
                  "WHERE e.room_id = '!delta:localhost'")
        group = dict(c.fetchall())
    ids = [e for e, *_ in events]
    pairs = [tuple(random.Random(n).sample(ids, 2)) for n in range(150)]
    on_one_chain = 0
    with store_cursor() as cur:
        for a, b in pairs:
            groups = StateGroupStore()
            keys = groups.changed_keys(cur, group[a], group[b])
            before, after = state_at_event(a), state_at_event(b)
            assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} <= keys, (a, b)
            assert keys <= before.keys() | after.keys(), (a, b)
            if group[a] in groups._chain(cur, group[b]) or group[b] in groups._chain(cur, group[a]):
                on_one_chain += 1
                assert groups.misses == 0, "a whole state read between two groups of one chain"
    assert 0 < on_one_chain < len(pairs)

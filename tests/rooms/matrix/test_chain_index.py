"""The chain cover index: positions and links by value, and by property -- reachability and
the auth difference from the index equal the ones found by walking auth events, whatever
the DAG and however it is split into batches; on generated Matrix rooms they also equal
Synapse's own auth difference, and state resolution fed by the index resolves as walking."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rooms.matrix.chain_index import ChainIndex, IndexEvent, NotIndexed, auth_events_of, build, canonical
from rooms.matrix.state_res import auth_closure, auth_difference, resolve
from testing.synapse_oracle import SynapseEvents
from tests.rooms.matrix.test_generated_rooms import action, play, start_room


def ev(event_id, key, *auth):
    t, _, sk = key.partition("|")
    return IndexEvent(event_id, t, sk, tuple(auth))


def room_events():
    """create, Alice joins, power levels, join rules, Bob joins twice (a chain), Alice's PL change."""
    return [
        ev("C", "create"),
        ev("A1", "member|a", "C"),
        ev("P1", "pl", "C", "A1"),
        ev("J", "jr", "C", "A1", "P1"),
        ev("B1", "member|b", "C", "P1", "J"),
        ev("B2", "member|b", "C", "P1", "J", "B1"),
        ev("P2", "pl", "C", "A1", "P1"),
    ]


def test_positions_and_links_by_value():
    index = build(room_events())
    assert index.positions == {"C": (1, 1), "A1": (2, 1), "P1": (3, 1), "J": (4, 1), "B1": (5, 1),
                               "B2": (5, 2), "P2": (3, 2)}
    # A1 -> C; P1 -> A1 only (C is reachable through A1); J -> P1; B1 -> J only; B2 and P2
    # continue chains whose earlier event already links there: nothing new
    assert {(oc, os_, tc, ts) for oc, d in index.links.items() for tc, ps in d.items() for os_, ts in ps} == {
        (2, 1, 1, 1), (3, 1, 2, 1), (4, 1, 3, 1), (5, 1, 4, 1)}
    assert index.auth_chain(["B2"]) == {"B2", "B1", "J", "P1", "A1", "C"}
    assert index.auth_chain(["P2"]) == {"P2", "P1", "A1", "C"}
    assert index.auth_difference([{"B1", "P1"}, {"B2", "P2"}]) == {"B2", "P2"}
    assert index.auth_difference([{"J"}, {"P2"}]) == {"J", "P2"}


def test_a_chain_head_that_moved_on_starts_a_new_chain():
    # B2 and B2' both cite B1: the first continues the chain, the second cannot
    index = build([ev("C", "create"), ev("B1", "member|b", "C"), ev("B2", "member|b", "C", "B1"),
                   ev("B2x", "member|b", "C", "B1")])
    assert index.positions["B2"] == (2, 2)
    assert index.positions["B2x"] == (3, 1)
    assert index.is_ancestor("B1", "B2x") and not index.is_ancestor("B2", "B2x")
    assert index.auth_difference([{"B2"}, {"B2x"}]) == {"B2", "B2x"}


def test_missing_auth_events_wait_and_are_placed_later():
    index = ChainIndex()
    added = index.extend([ev("C", "create"), ev("M", "member|m", "C", "X"), ev("N", "member|n", "M")])
    assert added.pending == ["M", "N"] and [p[0] for p in added.positions] == ["C"]
    with pytest.raises(NotIndexed):
        index.auth_difference([{"M"}, {"C"}])
    added = index.extend([ev("M", "member|m", "C", "X"), ev("N", "member|n", "M"), ev("X", "x", "C")])
    assert [p[0] for p in added.positions] == ["X", "M", "N"] and not added.pending
    assert index.auth_chain(["N"]) == {"N", "M", "X", "C"}


def test_auth_events_from_stored_json():
    assert auth_events_of({"auth_events": [["$a", {}], ["$b", {"sha256": "x"}]]}) == ("$a", "$b")
    # v12: the create event is implied, its ID is the room ID's hash
    assert auth_events_of({"type": "m.room.member", "room_id": "!abc", "auth_events": ["$p"]}) == ("$p", "$abc")
    assert auth_events_of({"type": "m.room.create", "state_key": "", "auth_events": []}, "!abc") == ()
    assert auth_events_of({"room_id": "!r:s1", "auth_events": ["$p"]}) == ("$p",)


# -- properties on arbitrary DAGs ------------------------------------------------------------

@st.composite
def dags(draw):
    n = draw(st.integers(1, 40))
    keys = ["k0", "k1", "k2", "k3", "k4"]
    events = []
    for i in range(n):
        auth = draw(st.lists(st.integers(0, i - 1), max_size=4, unique=True)) if i else []
        events.append(IndexEvent(f"e{i}", draw(st.sampled_from(keys)), "", tuple(f"e{a}" for a in auth)))
    return events


def walker(events):
    return {e.event_id: SimpleNamespace(auth_event_ids=e.auth_event_ids) for e in events}


@settings(max_examples=200, deadline=None)
@given(events=dags(), cuts=st.lists(st.integers(0, 40), max_size=4), data=st.data())
def test_index_answers_equal_walks(events, cuts, data):
    whole = build(events)
    # the same events in batches (any split of the same order): the same index, row for row
    bounds = sorted({0, len(events), *[c % (len(events) + 1) for c in cuts]})
    pieces = ChainIndex()
    positions, links = [], []
    for lo, hi in zip(bounds, bounds[1:]):
        added = pieces.extend(events[lo:hi])
        assert not added.pending
        positions += added.positions
        links += added.links
    assert pieces.positions == whole.positions and pieces.links == whole.links
    assert canonical(positions, links) == canonical(
        [(e, c, s) for e, (c, s) in whole.positions.items()],
        [(oc, o, tc, t) for oc, d in whole.links.items() for tc, ps in d.items() for o, t in ps])
    by_id = walker(events)
    for e in events:
        assert whole.auth_chain([e.event_id]) == auth_closure([e.event_id], by_id)
    ids = [e.event_id for e in events]
    sets = data.draw(st.lists(st.sets(st.sampled_from(ids), max_size=5), min_size=1, max_size=4))
    assert whole.auth_difference(sets) == auth_difference(sets, by_id)


# -- generated Matrix rooms: the index against the walk and against Synapse ------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version_id=st.sampled_from(["10", "11", "12"]), actions=st.lists(action, min_size=10, max_size=50))
def test_generated_rooms_auth_difference_equals_walk_and_synapse(version_id, actions):
    room = start_room(version_id)
    play(room, actions)
    events = [room.events[e] for e in room.order]
    index = build(IndexEvent(e.event_id, e.type, e.state_key, e.auth_event_ids) for e in events if e.is_state)
    # the stored JSON gives the same auth events (v12: the create event is implied)
    for e in events:
        assert set(auth_events_of(e.pdu)) == set(e.auth_event_ids)
    facts = index.graph_facts(room.events)
    oracle = SynapseEvents(version_id)
    for e in events:
        oracle.add(e.pdu, rejected=e.event_id in room.rejected)
    order = room.order
    for i in range(0, len(order), 2):
        picks = [order[i], order[(i * 7 + 3) % len(order)], order[(i * 13 + 5) % len(order)]]
        for chosen in (picks[:2], picks):
            states = [room.state_after[p] for p in chosen]
            sets = [set(s.values()) for s in states]
            ours = index.auth_difference(sets)
            assert ours == auth_difference(sets, room.events)
            assert ours == oracle.auth_difference(room.room_id, states)
            # and state resolution fed by the index resolves as it does walking
            assert resolve(room.version, states, room.events, room.rejected.keys(), graph_facts=facts) == \
                resolve(room.version, states, room.events, room.rejected.keys())


def test_graph_facts_walk_when_an_event_has_no_position():
    events = room_events()
    by_id = walker(events)
    partial = build(events[:4])  # B1, B2, P2 not indexed yet
    facts = partial.graph_facts(by_id)
    sets = [{("m", "b"): "B1", ("pl", ""): "P1"}, {("m", "b"): "B2", ("pl", ""): "P2"}]
    assert facts(sets, None) == ({"B2", "P2"}, None)
    assert build(events).graph_facts(by_id)(sets, None) == ({"B2", "P2"}, None)

"""The pieces of state resolution by value: split, the auth difference, the conflicted
subgraph, the two orderings, and the determinism guarantees."""
from __future__ import annotations

import itertools

import pytest

from rooms.matrix.room_builder import RoomBuilder
from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS
from rooms.matrix.state_res import (
    UnsupportedStateRes,
    auth_difference,
    conflicted_subgraph,
    mainline_order,
    resolve,
    reverse_topological_power_order,
    split,
)

A, B = "@a:s1", "@b:s2"
JR = ("m.room.join_rules", "")


def test_split_treats_a_key_missing_from_one_set_as_conflicted():
    k1, k2, k3 = ("t", "1"), ("t", "2"), ("t", "3")
    unconflicted, conflicted = split([{k1: "$a", k2: "$b"}, {k1: "$a", k2: "$c", k3: "$d"}])
    assert unconflicted == {k1: "$a"}
    assert conflicted == {k2: {"$b", "$c"}, k3: {"$d"}}
    assert split([{k1: "$a"}, {k1: "$a"}, {}]) == ({}, {k1: {"$a"}})


def _room(version_id="10"):
    room = RoomBuilder(KNOWN_ROOM_VERSIONS[version_id], room_id="!r:s1")
    room.send(A, "m.room.create", {"creator": A, "room_version": version_id}, state_key="")
    room.send(A, "m.room.member", {"membership": "join"}, state_key=A)
    room.send(A, "m.room.power_levels", {"users": {A: 100, B: 50}}, state_key="")
    room.send(A, "m.room.join_rules", {"join_rule": "public"}, state_key="")
    room.send(B, "m.room.member", {"membership": "join"}, state_key=B)
    return room


def test_auth_difference_and_subgraph_by_value():
    room = _room()
    base = room.order[-1]
    pl, jr = room.state_after[base][("m.room.power_levels", "")], room.state_after[base][JR]
    x = room.send(A, "m.room.join_rules", {"join_rule": "invite"}, state_key="", prev_ids=[base])
    y = room.send(B, "m.room.join_rules", {"join_rule": "knock"}, state_key="", prev_ids=[base])
    sets = [set(room.state_after[x].values()), set(room.state_after[y].values())]
    # x and y cite the same auth events (create, power levels, their sender's join)
    assert auth_difference(sets, room.events) == {x, y}
    assert conflicted_subgraph({x, y}, room.events) == {x, y}
    # pl is an auth event of x: the only path between them is the edge itself; the old join
    # rules event is on no path (x does not cite it)
    assert pl in room.events[x].auth_event_ids and jr not in room.events[x].auth_event_ids
    assert conflicted_subgraph({pl, x}, room.events) == {pl, x}
    assert conflicted_subgraph({jr, x}, room.events) == {jr, x}


def test_reverse_topological_power_order_breaks_ties_by_timestamp_before_id():
    room = _room()
    base = room.order[-1]
    ids = [room.send(A, "m.room.join_rules", {"join_rule": r}, state_key="", prev_ids=[base])
           for r in ("invite", "knock", "public")]
    # same power, no auth edges between them: earliest ts first, whatever the IDs' order
    assert reverse_topological_power_order(ids, room.events) == ids
    assert reverse_topological_power_order(reversed(ids), room.events) == ids


def test_mainline_order_without_a_pivot_is_timestamp_then_id():
    room = _room()
    base = room.order[-1]
    ids = [room.send(A, "m.room.topic", {"topic": str(i)}, state_key="", prev_ids=[base])
           for i in range(3)]
    assert mainline_order(reversed(ids), None, room.events) == ids


def test_resolution_ignores_the_order_of_sets_and_of_the_event_lookup():
    room = _room()
    base = room.order[-1]
    tips = [room.send(s, t, c, state_key="", prev_ids=[base]) for s, t, c in (
        (A, "m.room.topic", {"topic": "a"}), (B, "m.room.topic", {"topic": "b"}),
        (A, "m.room.power_levels", {"users": {A: 100, B: 0}}), (B, "m.room.name", {"name": "n"}))]
    sets = [room.state_after[t] for t in tips]
    expected = resolve(room.version, sets, room.events)
    shuffled_events = dict(reversed(list(room.events.items())))
    for perm in itertools.permutations(sets):
        assert resolve(room.version, list(perm), shuffled_events) == expected
    # A's PL demotes B, so B's topic and name fail; A's topic wins
    assert expected[("m.room.topic", "")] == tips[0]
    assert ("m.room.name", "") not in expected


def test_room_v1_is_refused_with_a_clear_error():
    room = RoomBuilder(KNOWN_ROOM_VERSIONS["1"], room_id="!r:s1")
    with pytest.raises(UnsupportedStateRes, match="v1"):
        resolve(room.version, [{("a", ""): "$x"}, {("a", ""): "$y"}], room.events)


def test_the_benchmark_room_resolves_alike_in_all_three_ways():
    """bench_state_res's room, small: Synapse's, ours with its precomputed facts and ours
    walking agree (the benchmark asserts it too, at 10,000 members)."""
    from benchmarks.bench_state_res import bench

    for version_id in ("10", "12"):
        figures = bench(version_id, 60, 1)
        assert figures["conflicted_keys"] == 50 and figures["won_by_branch_y"] == 10

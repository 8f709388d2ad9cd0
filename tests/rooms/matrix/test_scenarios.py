"""The well-known state-resolution scenarios by name, each with its expected outcome
(docs/matrix.md): the seven of Synapse's ``tests/state/test_v2.py`` harness in room versions
10, 11 and 12, and the state resets MSC4297 fixes, where v12 must differ from v11 exactly
there. Every room is also replayed through Synapse (its IDs, verdicts and states)."""
from __future__ import annotations

import pytest

from rooms.matrix.room_builder import RoomBuilder
from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS
from rooms.matrix.state_res import resolve
from testing.synapse_oracle import SynapseEvents
from tests.rooms.matrix.test_generated_rooms import check_against_synapse

A, B, C, E, Z = "@alice:example.com", "@bob:example.com", "@charlie:example.com", \
    "@evelyn:example.com", "@zara:example.com"
PL, JR, TOPIC = ("m.room.power_levels", ""), ("m.room.join_rules", ""), ("m.room.topic", "")


def member(user):
    return ("m.room.member", user)


def _users(room, levels: dict) -> dict:
    """v12 creators may not be listed: drop Alice from every users map there."""
    if room.version.creators_have_infinite_power:
        return {u: v for u, v in levels.items() if u != A}
    return dict(levels)


def _create(version_id: str) -> RoomBuilder:
    version = KNOWN_ROOM_VERSIONS[version_id]
    room = RoomBuilder(version, room_id=None if version.room_id_from_create_event else "!r:example.com")
    content = {"room_version": version_id}
    if not version.implicit_room_creator:
        content["creator"] = A
    room.send(A, "m.room.create", content, state_key="")
    return room


# --- Synapse's test_v2 harness ------------------------------------------------------------

def _initial(room: RoomBuilder) -> dict[str, str]:
    ids = {}
    ids["IMA"] = room.send(A, "m.room.member", {"membership": "join"}, state_key=A)
    ids["IPOWER"] = room.send(A, "m.room.power_levels", {"users": _users(room, {A: 100})}, state_key="")
    ids["IJR"] = room.send(A, "m.room.join_rules", {"join_rule": "public"}, state_key="")
    for name, user in (("IMB", B), ("IMC", C), ("IMZ", Z)):
        ids[name] = room.send(user, "m.room.member", {"membership": "join"}, state_key=user)
    ids["START"] = room.send(Z, "m.room.message", {"body": "start"})
    return ids


def _scenario(version_id, nodes: dict, edges: list[list[str]]):
    """Build ``nodes`` (name -> (sender, type, state_key, content)) with prev edges from the
    chains in ``edges`` ([END, X, Y, START]: END's prev is X, X's is Y, ...), in topological
    order with ties broken by name, then END; returns (room, name -> event ID, state at END)."""
    room = _create(version_id)
    ids = _initial(room)
    prevs: dict[str, set[str]] = {}
    for chain in edges:
        for later, earlier in zip(chain, chain[1:]):
            prevs.setdefault(later, set()).add(earlier)
    todo = set(nodes) | {"END"}
    while todo:
        ready = sorted(n for n in todo if all(p in ids for p in prevs.get(n, ())))
        name = ready[0]
        todo.remove(name)
        prev_ids = [ids[p] for p in sorted(prevs[name])]
        if name == "END":
            ids[name] = room.send(Z, "m.room.message", {"body": "end"}, prev_ids=prev_ids)
            continue
        sender, etype, state_key, content = nodes[name]
        if etype == "m.room.power_levels":
            content = dict(content, users=_users(room, content["users"]))
        ids[name] = room.send(sender, etype, content, state_key=state_key, prev_ids=prev_ids)
    return room, ids, room.state_before[ids["END"]]


PA_CONTENT = {"users": {A: 100, B: 50}}
TOPIC_NODES = {
    "T1": (A, "m.room.topic", "", {"topic": "T1"}),
    "PA1": (A, "m.room.power_levels", "", PA_CONTENT),
    "T2": (A, "m.room.topic", "", {"topic": "T2"}),
    "PA2": (A, "m.room.power_levels", "", {"users": {A: 100, B: 0}}),
    "PB": (B, "m.room.power_levels", "", PA_CONTENT),
    "T3": (B, "m.room.topic", "", {"topic": "T3"}),
}

SCENARIOS = {
    "ban_vs_power_levels": (
        {"PA": (A, "m.room.power_levels", "", PA_CONTENT),
         "MA": (A, "m.room.member", A, {"membership": "join"}),
         "MB": (A, "m.room.member", B, {"membership": "ban"}),
         "PB": (B, "m.room.power_levels", "", PA_CONTENT)},
        [["END", "MB", "MA", "PA", "START"], ["END", "PB", "PA"]],
        {PL: "PA", member(A): "MA", member(B): "MB"}),
    "join_rule_evasion": (
        # "join_rules" misspelt on purpose: the rule reads as missing, i.e. invite-only
        {"JR": (A, "m.room.join_rules", "", {"join_rules": "private"}),
         "ME": (E, "m.room.member", E, {"membership": "join"})},
        [["END", "JR", "START"], ["END", "ME", "START"]],
        {JR: "JR", member(E): None}),
    "offtopic_power_levels": (
        {"PA": (A, "m.room.power_levels", "", PA_CONTENT),
         "PB": (B, "m.room.power_levels", "", {"users": {A: 100, B: 50, C: 50}}),
         "PC": (C, "m.room.power_levels", "", {"users": {A: 100, B: 50, C: 0}})},
        [["END", "PC", "PB", "PA", "START"], ["END", "PA"]],
        {PL: "PC"}),
    "topic_basic": (
        TOPIC_NODES,
        [["END", "PA2", "T2", "PA1", "T1", "START"], ["END", "T3", "PB", "PA1"]],
        {PL: "PA2", TOPIC: "T2"}),
    "topic_reset": (
        {"T1": (A, "m.room.topic", "", {"topic": "T1"}),
         "PA": (A, "m.room.power_levels", "", PA_CONTENT),
         "T2": (B, "m.room.topic", "", {"topic": "T2"}),
         "MB": (A, "m.room.member", B, {"membership": "ban"})},
        [["END", "MB", "T2", "PA", "T1", "START"], ["END", "T1"]],
        {TOPIC: "T1", member(B): "MB", PL: "PA"}),
    "topic": (
        dict(TOPIC_NODES, MZ1=(Z, "m.room.message", None, {"body": "MZ1"}),
             T4=(A, "m.room.topic", "", {"topic": "T4"})),
        [["END", "T4", "MZ1", "PA2", "T2", "PA1", "T1", "START"],
         ["END", "MZ1", "T3", "PB", "PA1"]],
        {TOPIC: "T4", PL: "PA2"}),
    "mainline_sort": (
        {"T1": (A, "m.room.topic", "", {"topic": "T1"}),
         "PA1": (A, "m.room.power_levels", "", PA_CONTENT),
         "T2": (A, "m.room.topic", "", {"topic": "T2"}),
         "PA2": (A, "m.room.power_levels", "",
                 {"users": {A: 100, B: 50}, "events": {"m.room.power_levels": 100}}),
         "PB": (B, "m.room.power_levels", "", PA_CONTENT),
         "T3": (B, "m.room.topic", "", {"topic": "T3"}),
         "T4": (A, "m.room.topic", "", {"topic": "T4"})},
        [["END", "T3", "PA2", "T2", "PA1", "T1", "START"], ["END", "T4", "PB", "PA1"]],
        {TOPIC: "T3", PL: "PA2"}),
}


@pytest.mark.parametrize("version_id", ["10", "11", "12"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_named_scenario(name, version_id):
    nodes, edges, expected = SCENARIOS[name]
    room, ids, state = _scenario(version_id, nodes, edges)
    for key, node in expected.items():
        assert state.get(key) == (ids[node] if node else None), (key, node)
    check_against_synapse(room)


def test_mainline_sort_is_not_timestamp_order():
    """T4 is newer by ts than T3 but in the older power-levels epoch, so T3 wins."""
    nodes, edges, _ = SCENARIOS["mainline_sort"]
    room, ids, state = _scenario("10", nodes, edges)
    assert room.events[ids["T4"]].origin_server_ts > room.events[ids["T3"]].origin_server_ts
    assert state[TOPIC] == ids["T3"]


# --- MSC4297: the state resets v2.1 fixes ----------------------------------------------------

def _msc4297_problem_a(version_id):
    room = _create(version_id)
    v12 = room.version.creators_have_infinite_power
    e = {}
    send = room.send
    create = room.order[0]

    def auth(*names):
        return ([] if v12 else [create]) + [e[n] for n in names]

    e["ma"] = send(A, "m.room.member", {"membership": "join"}, state_key=A, auth_ids=auth())
    e["pl"] = send(A, "m.room.power_levels", {} if v12 else {"users": {A: 100}}, state_key="",
                   auth_ids=auth("ma"))
    e["jr0"] = send(A, "m.room.join_rules", {"join_rule": "public"}, state_key="", auth_ids=auth("ma", "pl"))
    e["mb"] = send(B, "m.room.member", {"membership": "join"}, state_key=B, auth_ids=auth("pl", "jr0"))
    e["mc"] = send(C, "m.room.member", {"membership": "join"}, state_key=C, auth_ids=auth("pl", "jr0"))
    e["jr1"] = send(A, "m.room.join_rules", {"join_rule": "invite"}, state_key="", auth_ids=auth("pl", "ma"))
    e["ma_leave"] = send(A, "m.room.member", {"membership": "leave"}, state_key=A, auth_ids=auth("pl", "ma"))
    tip = e["ma_leave"]
    e["mb2"] = send(B, "m.room.member", {"membership": "join", "displayname": "b"}, state_key=B,
                    auth_ids=auth("pl", "mb", "jr1"), prev_ids=[tip])
    e["mc2"] = send(C, "m.room.member", {"membership": "join", "displayname": "c"}, state_key=C,
                    auth_ids=auth("pl", "mc", "jr1"), prev_ids=[tip])
    ids = {k: e[k] for k in e}
    s_bob = {("m.room.create", ""): create, PL: e["pl"], member(C): e["mc"], JR: e["jr1"],
             member(A): e["ma_leave"], member(B): e["mb2"]}
    s_charlie = {("m.room.create", ""): create, PL: e["pl"], JR: e["jr0"], member(B): e["mb"],
                 member(A): e["ma_leave"], member(C): e["mc2"]}
    return room, ids, [s_bob, s_charlie]


def _msc4297_problem_b(version_id):
    room = _create(version_id)
    v12 = room.version.creators_have_infinite_power
    e = {}
    send = room.send
    create = room.order[0]

    def auth(*names):
        return ([] if v12 else [create]) + [e[n] for n in names]

    def pl(users):
        return {"users": users if v12 else dict(users, **{A: 100})}

    e["ma"] = send(A, "m.room.member", {"membership": "join"}, state_key=A, auth_ids=auth())
    e["pl0"] = send(A, "m.room.power_levels", {} if v12 else {"users": {A: 100}}, state_key="",
                    auth_ids=auth("ma"))
    e["jr"] = send(A, "m.room.join_rules", {"join_rule": "public"}, state_key="", auth_ids=auth("ma", "pl0"))
    e["mb"] = send(B, "m.room.member", {"membership": "join"}, state_key=B, auth_ids=auth("pl0", "jr"))
    e["mc"] = send(C, "m.room.member", {"membership": "join"}, state_key=C, auth_ids=auth("pl0", "jr"))
    e["pl1"] = send(A, "m.room.power_levels", pl({B: 50}), state_key="", auth_ids=auth("pl0", "ma"))
    e["pl2"] = send(B, "m.room.power_levels", pl({B: 50, C: 50}), state_key="", auth_ids=auth("pl1", "mb"))
    tip = e["pl2"]
    e["mz"] = send(Z, "m.room.member", {"membership": "join"}, state_key=Z, auth_ids=auth("pl2", "jr"),
                   prev_ids=[tip])
    e["me"] = send(E, "m.room.member", {"membership": "join"}, state_key=E, auth_ids=auth("pl2", "jr"),
                   prev_ids=[tip])
    e["me2"] = send(E, "m.room.member", {"membership": "join", "displayname": "e"}, state_key=E,
                    auth_ids=auth("pl2", "me", "jr"))
    base = {("m.room.create", ""): create, member(A): e["ma"], JR: e["jr"], member(B): e["mb"],
            member(C): e["mc"]}
    s_eve = {**base, PL: e["pl0"], member(E): e["me2"]}
    s_zara = {**base, PL: e["pl2"], member(Z): e["mz"]}
    return room, e, [s_eve, s_zara]


def _replay_conflicted_subgraph(version_id):
    room = _create(version_id)
    v12 = room.version.creators_have_infinite_power
    e = {}
    send = room.send
    create = room.order[0]

    def auth(*names):
        return ([] if v12 else [create]) + [e[n] for n in names]

    def pl(users):
        return {"users": users if v12 else dict(users, **{A: 100})}

    e["ma"] = send(A, "m.room.member", {"membership": "join"}, state_key=A, auth_ids=auth())
    e["pl1"] = send(A, "m.room.power_levels", pl({}), state_key="", auth_ids=auth("ma"))
    e["jr"] = send(A, "m.room.join_rules", {"join_rule": "public"}, state_key="", auth_ids=auth("ma", "pl1"))
    e["mb"] = send(B, "m.room.member", {"membership": "join"}, state_key=B, auth_ids=auth("pl1", "jr"))
    e["mc"] = send(C, "m.room.member", {"membership": "join"}, state_key=C, auth_ids=auth("pl1", "jr"))
    e["pl2"] = send(A, "m.room.power_levels", pl({B: 50}), state_key="", auth_ids=auth("ma", "pl1"))
    e["pl3"] = send(B, "m.room.power_levels", pl({B: 50, C: 50}), state_key="", auth_ids=auth("mb", "pl2"))
    e["me1"] = send(E, "m.room.member", {"membership": "join"}, state_key=E, auth_ids=auth("pl3", "jr"))
    e["me2"] = send(E, "m.room.member", {"membership": "join", "displayname": "e"}, state_key=E,
                    auth_ids=auth("pl1", "jr", "me1"))
    e["mz"] = send(Z, "m.room.member", {"membership": "join"}, state_key=Z, auth_ids=auth("pl3", "jr"))
    base = {("m.room.create", ""): create, member(A): e["ma"], member(B): e["mb"],
            member(C): e["mc"], JR: e["jr"]}
    dodgy = {**base, member(E): e["me2"], PL: e["pl1"]}
    sensible = {**base, member(Z): e["mz"], PL: e["pl3"]}
    return room, e, [dodgy, sensible]


MSC4297 = {
    # name: (builder, expected in v11, expected in v12)
    "problem_a_join_rules_reset": (
        _msc4297_problem_a,
        {JR: None, PL: "pl", member(A): "ma_leave", member(B): "mb2", member(C): "mc2"},
        {JR: "jr1", PL: "pl", member(A): "ma_leave", member(B): "mb2", member(C): "mc2"}),
    "problem_b_power_levels_reset": (
        _msc4297_problem_b,
        {PL: "pl0", member(B): "mb", member(C): "mc", member(E): "me2", member(Z): "mz"},
        {PL: "pl2", member(B): "mb", member(C): "mc", member(E): "me2", member(Z): "mz"}),
    "replay_conflicted_subgraph": (
        _replay_conflicted_subgraph,
        {PL: "pl1", member(E): "me2", member(Z): "mz", JR: "jr"},
        {PL: "pl3", member(E): "me1", member(Z): "mz", JR: "jr"}),
}


@pytest.mark.parametrize("name", sorted(MSC4297))
def test_msc4297_state_resets_differ_between_v11_and_v12_exactly_there(name):
    build, expected_v11, expected_v12 = MSC4297[name]
    results = {}
    for version_id, expected in (("11", expected_v11), ("12", expected_v12)):
        room, e, state_sets = build(version_id)
        ours = resolve(room.version, state_sets, room.events, room.rejected.keys())
        for key, node in expected.items():
            assert ours.get(key) == (e[node] if node else None), (version_id, key, node)
        oracle = SynapseEvents(version_id)
        for event_id in room.order:
            oracle.add(room.pdu(event_id), rejected=event_id in room.rejected)
        assert ours == oracle.resolve(room.room_id, state_sets)
        results[version_id] = {k: _name(e, v) for k, v in ours.items() if k != ("m.room.create", "")}
    differing = {k for k in set(results["11"]) | set(results["12"])
                 if results["11"].get(k) != results["12"].get(k)}
    expected_differing = {k for k in set(expected_v11) | set(expected_v12)
                          if expected_v11.get(k) != expected_v12.get(k)}
    assert differing == expected_differing


def _name(ids: dict, event_id: str) -> str:
    return next((n for n, i in ids.items() if i == event_id), event_id)

"""Hypothesis-generated rooms (forks and merges, power-level changes, bans and kicks,
join-rule changes, knocks, invites, redactions, senders on several servers) in room versions
10, 11 and 12: for every event, our event ID, our accept/reject verdict and our state before
it equal what Synapse's event-format, event-auth and state-resolution code compute.

Synapse's side is computed from Synapse's own earlier answers (its verdicts, its states after
each event), never from ours, so one difference anywhere fails the run at the first event it
shows up in."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rooms.matrix.room_builder import RoomBuilder
from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS
from rooms.matrix.state_res import resolve
from testing.synapse_oracle import SynapseEvents

USERS = ["@a:s1", "@b:s2", "@c:s3", "@d:s1", "@e:s2"]
LEVELS = [0, 25, 50, 75, 100]
#: weighted towards what makes state conflicts: topics and power levels on both sides
KINDS = ["message", "topic", "topic", "topic", "power_levels", "power_levels", "power_levels",
         "ban", "kick", "unban", "join", "join", "leave", "invite", "join_rules", "redaction",
         "knock", "name"]

JOIN_RULES = ["public", "invite", "knock", "restricted", "knock_restricted", "private"]

action = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, len(USERS) - 1),  # sender
    st.integers(0, len(USERS) - 1),  # target
    st.sampled_from(["extend", "fork", "merge", "merge"]),
    st.integers(0, 1_000),  # picks a branch / an earlier event / a parameter
    st.lists(st.tuples(st.integers(0, len(USERS) - 1), st.sampled_from(LEVELS)), max_size=3),
)


def start_room(version_id: str, room_id: str = "!r:s1") -> RoomBuilder:
    version = KNOWN_ROOM_VERSIONS[version_id]
    room = RoomBuilder(version, room_id=None if version.room_id_from_create_event else room_id)
    a = USERS[0]
    create = {"room_version": version_id}
    if not version.implicit_room_creator:
        create["creator"] = a
    room.send(a, "m.room.create", create, state_key="")
    room.send(a, "m.room.member", {"membership": "join"}, state_key=a)
    users = {USERS[1]: 50, USERS[2]: 50, USERS[3]: 75}
    if not version.creators_have_infinite_power:
        users[a] = 100
    room.send(a, "m.room.power_levels", {"users": users}, state_key="")
    room.send(a, "m.room.join_rules", {"join_rule": "public"}, state_key="")
    for u in USERS[1:4]:  # @e stays out: it knocks, is invited, joins by rule
        room.send(u, "m.room.member", {"membership": "join"}, state_key=u)
    return room


def play(room: RoomBuilder, actions, linear: bool = False) -> None:
    tips = [room.order[-1]]
    for kind, s, t, shape, pick, levels in actions:
        if linear:
            shape = "extend"
        sender, target = USERS[s], USERS[t]
        if shape == "fork":
            prevs = [room.order[-1 - pick % min(8, len(room.order) - 1)]]
        elif shape == "merge" and len(tips) > 1:
            i = pick % len(tips)
            prevs = [tips[i], tips[(i + 1) % len(tips)]]
            if len(tips) > 2 and pick % 3 == 0:
                prevs.append(tips[(i + 2) % len(tips)])
        else:
            prevs = [tips[pick % len(tips)]]
        if kind == "message":
            args = ("m.room.message", {"body": f"hi {pick}"}, None)
        elif kind == "topic":
            args = ("m.room.topic", {"topic": f"t{pick}"}, "")
        elif kind == "name":
            args = ("m.room.name", {"name": f"n{pick}"}, "")
        elif kind == "power_levels":
            users = {USERS[u]: lvl for u, lvl in levels}
            if room.version.creators_have_infinite_power and pick % 5:
                users.pop(USERS[0], None)  # mostly valid: creators may not be listed
            elif not room.version.creators_have_infinite_power and pick % 3:
                users.setdefault(USERS[0], 100)
            if not room.version.enforce_int_power_levels and pick % 5 == 4:
                users = {u: f" {lvl}" for u, lvl in users.items()}  # "stringy" levels (v1-9)
            content = {"users": users}
            if pick % 4 == 1:
                content["events"] = {"m.room.topic": LEVELS[pick % 5]}
            if pick % 7 == 2:
                content["ban"] = LEVELS[pick % 5]
                content["kick"] = LEVELS[(pick // 5) % 5]
            if pick % 6 == 3:
                content["invite"] = LEVELS[pick % 5]
            args = ("m.room.power_levels", content, "")
        elif kind in ("ban", "kick", "unban"):
            membership = "ban" if kind == "ban" else "leave"
            args = ("m.room.member", {"membership": membership}, target)
        elif kind == "join" and pick % 3 == 0:  # a restricted join, vouched for by target
            args = ("m.room.member", {"membership": "join",
                                      "join_authorised_via_users_server": target}, sender)
        elif kind in ("join", "leave", "knock"):
            args = ("m.room.member", {"membership": kind}, sender)
        elif kind == "invite":
            args = ("m.room.member", {"membership": "invite"}, target)
        elif kind == "join_rules":
            rule = JOIN_RULES[pick % len(JOIN_RULES)]
            content = {"join_rule": rule}
            if "restricted" in rule:
                content["allow"] = [{"type": "m.room_membership", "room_id": "!other:s1"}]
            args = ("m.room.join_rules", content, "")
        else:  # redaction of an earlier event
            redacts = room.order[pick % len(room.order)]
            if room.version.redaction.value >= 11:
                args = ("m.room.redaction", {"redacts": redacts}, None)
            else:
                args = ("m.room.redaction", {}, None, {"redacts": redacts})
        extra = args[3] if len(args) > 3 else None
        # now and then a server with a stale view: auth events picked from an older state
        stale = room.state_after[room.order[(pick * 31) % len(room.order)]] \
            if pick % 9 == 0 else None
        event_id = room.send(sender, args[0], args[1], state_key=args[2], prev_ids=prevs,
                             extra=extra, auth_from=stale)
        for p in prevs:
            if p in tips:
                tips.remove(p)
        tips.append(event_id)


def check_against_synapse(room: RoomBuilder) -> None:
    oracle = SynapseEvents(room.version.identifier)
    state_after: dict[str, dict] = {}
    for event_id in room.order:
        ours = room.events[event_id]
        theirs = oracle.add(ours.pdu)
        assert theirs.event_id == event_id
        prevs = list(theirs.prev_event_ids())
        if not prevs:
            before = None
        elif len(prevs) == 1:
            before = dict(state_after[prevs[0]])
        else:
            before = oracle.resolve(theirs.room_id, [state_after[p] for p in prevs])
        assert (before or {}) == room.state_before[event_id], f"state before {ours.type} {event_id}"
        accepted = oracle.verdict(theirs, before)
        assert accepted == (event_id not in room.rejected), \
            f"verdict on {ours.type} {ours.content} by {ours.sender}: ours {room.rejected.get(event_id)}"
        if not accepted:
            oracle.mark_rejected(ours.pdu)
        after = dict(before or {})
        if accepted and theirs.is_state():
            after[(theirs.type, theirs.state_key)] = event_id
        state_after[event_id] = after
    # and the states after any two or three events, resolved together
    if room.version.state_res.value == 1:
        return  # state res v1 is not implemented: linear rooms only
    order = room.order
    for i in range(0, len(order), 3):
        picks = [order[i], order[(i * 7 + 3) % len(order)], order[(i * 13 + 5) % len(order)]]
        for sets in (picks[:2], picks):
            ours = resolve(room.version, [room.state_after[e] for e in sets], room.events,
                           room.rejected.keys())
            assert ours == oracle.resolve(room.room_id, [state_after[e] for e in sets]), sets
            # deterministic: the order of the state sets does not matter
            assert ours == resolve(room.version, [room.state_after[e] for e in reversed(sets)],
                                   room.events, room.rejected.keys())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version_id=st.sampled_from(["10", "11", "12"]),
       actions=st.lists(action, min_size=10, max_size=50))
def test_generated_rooms_agree_with_synapse(version_id, actions):
    room = start_room(version_id)
    play(room, actions)
    check_against_synapse(room)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version_id=st.sampled_from([str(n) for n in range(1, 10)]),
       actions=st.lists(action, min_size=10, max_size=40))
def test_generated_rooms_of_older_versions_agree_with_synapse(version_id, actions):
    """v1-9: stringy power levels, no knock before v7, no restricted before v8, v1-2 IDs and
    redaction auth; v1 rooms stay linear (its state resolution, v1, is not implemented)."""
    room = start_room(version_id)
    play(room, actions, linear=version_id == "1")
    check_against_synapse(room)

"""The authorization rules, rule by rule: hypothesis draws an auth state (create event, power
levels with odd values, a join rule, everyone's membership) and an event, in every room
version 1-12; our verdict must equal Synapse's ``check_state_dependent_auth_rules``.

Histories (test_generated_rooms.py) reach the rare branches rarely (a knock in a v6 room, a
restricted join by an invited user); drawing the auth state directly reaches all of them."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synapse.api.errors import SynapseError
from synapse.api.room_versions import KNOWN_ROOM_VERSIONS as SYNAPSE_VERSIONS
from synapse.event_auth import auth_types_for_event as synapse_auth_types
from synapse.event_auth import check_state_dependent_auth_rules
from synapse.events import make_event_from_dict

from rooms.matrix.auth_rules import AuthFailed, auth_types_for_event, check_state_dependent, check_state_independent
from rooms.matrix.event_format import parse_pdu, with_content_hash
from rooms.matrix.room_versions import CREATOR_POWER_LEVEL, KNOWN_ROOM_VERSIONS

USERS = ["@a:s1", "@b:s2", "@c:s3", "@d:s1"]
MEMBERSHIPS = ["join", "join", "join", "invite", "invite", "leave", "ban", "knock", None]
JOIN_RULES = ["public", "invite", "knock", "restricted", "knock_restricted", "private", None]


def _level(version):
    ints = st.sampled_from([0, 10, 50, 75, 100])
    if version.enforce_int_power_levels:
        return st.one_of(ints, ints, st.just("50"), st.just(True))  # odd ones must fail
    if version.allow_float_power_levels:
        return st.one_of(ints, st.sampled_from(["50", " +75 ", "0100", 50.7]))
    return st.one_of(ints, st.sampled_from(["50", " +75 ", "0100"]))


@st.composite
def situations(draw):
    version_id = draw(st.sampled_from([str(n) for n in range(1, 13)]))
    version = KNOWN_ROOM_VERSIONS[version_id]
    counter = iter(range(1, 1000))
    room_id = "!r:s1"

    def event(sender, etype, content, state_key=None, prev=None, extra=None):
        pdu = {"type": etype, "sender": sender, "content": content, "depth": 5,
               "origin_server_ts": next(counter), "prev_events": prev or [], "auth_events": [],
               "room_id": room_id}
        if state_key is not None:
            pdu["state_key"] = state_key
        pdu.update(extra or {})
        if not version.event_ids_are_hashes:
            pdu["event_id"] = f"${next(counter)}:{sender.split(':')[1]}"
            pdu["prev_events"] = [[p, {}] for p in pdu["prev_events"]]
        return with_content_hash(pdu)

    create_content = {"room_version": version_id}
    if not version.implicit_room_creator:
        create_content["creator"] = USERS[0]
    if version.creators_have_infinite_power and draw(st.booleans()):
        create_content["additional_creators"] = [USERS[3]]
    if draw(st.integers(0, 9)) == 0:
        create_content["m.federate"] = False
    create = event(USERS[0], "m.room.create", create_content, "")
    if version.room_id_from_create_event:
        del create["room_id"]
        create = with_content_hash(create)
        create_id = parse_pdu(create, version).event_id
        room_id = "!" + create_id[1:]
    else:
        create_id = parse_pdu(create, version).event_id
    state = [create]
    level = _level(version)
    if draw(st.booleans()):
        pl = {"users": draw(st.dictionaries(st.sampled_from(USERS), level, max_size=4))}
        for key in ("users_default", "events_default", "state_default", "ban", "kick",
                    "redact", "invite"):
            if draw(st.integers(0, 3)) == 0:
                pl[key] = draw(level)
        if draw(st.booleans()):
            pl["events"] = draw(st.dictionaries(st.sampled_from(
                ["m.room.topic", "m.room.power_levels", "m.room.message", "m.room.redaction"]),
                level, max_size=2))
        state.append(event(USERS[0], "m.room.power_levels", pl, ""))
    rule = draw(st.sampled_from(JOIN_RULES))
    if rule is not None:
        state.append(event(USERS[0], "m.room.join_rules", {"join_rule": rule}, ""))
    for user in USERS:
        membership = draw(st.sampled_from(MEMBERSHIPS))
        if membership is not None:
            state.append(event(user, "m.room.member", {"membership": membership}, user))

    sender = draw(st.sampled_from(USERS + ["@x:s9"]))
    target = sender if draw(st.booleans()) else draw(st.sampled_from(USERS + ["@x:s9"]))
    kind = draw(st.sampled_from(["member", "member", "member", "power_levels", "topic",
                                 "message", "redaction", "aliases", "third_party_invite",
                                 "user_state"]))
    prev = [create_id] if draw(st.integers(0, 5)) == 0 else ["$p"]
    if kind == "member":
        content = {"membership": draw(st.sampled_from(
            ["join", "join", "invite", "leave", "ban", "knock", "other"]))}
        if content["membership"] == "join" and draw(st.booleans()):
            content["join_authorised_via_users_server"] = draw(st.sampled_from(USERS))
        ev = event(sender, "m.room.member", content, target, prev=prev)
    elif kind == "power_levels":
        pl = {"users": draw(st.dictionaries(st.sampled_from(USERS + ["not-a-user"]), level, max_size=4))}
        for key in ("users_default", "ban", "kick", "invite", "state_default"):
            if draw(st.integers(0, 2)) == 0:
                pl[key] = draw(level)
        if draw(st.booleans()):
            pl["events"] = draw(st.dictionaries(st.sampled_from(["m.room.topic", "m.room.name"]),
                                                level, max_size=2))
        if draw(st.integers(0, 3)) == 0:
            pl["notifications"] = {"room": draw(level)}
        ev = event(sender, "m.room.power_levels", pl, "", prev=prev)
    elif kind == "topic":
        ev = event(sender, "m.room.topic", {"topic": "t"}, "", prev=prev)
    elif kind == "message":
        ev = event(sender, "m.room.message", {"body": "m"}, prev=prev)
    elif kind == "redaction":
        redacts = draw(st.sampled_from(["$other:s1", "$other:s2", "$other:s9"]))
        content, extra = ({"redacts": redacts}, None) if version.redaction.value >= 11 \
            else ({}, {"redacts": redacts})
        ev = event(sender, "m.room.redaction", content, prev=prev, extra=extra)
    elif kind == "aliases":
        ev = event(sender, "m.room.aliases", {"aliases": []},
                   draw(st.sampled_from(["s1", "s2", "s9"])), prev=prev)
    elif kind == "third_party_invite":
        ev = event(sender, "m.room.third_party_invite", {"display_name": "x"}, "tok", prev=prev)
    else:
        ev = event(sender, "m.room.custom", {}, target, prev=prev)
    return version_id, state, ev


def _synapse_allows(version_id, state, pdu) -> bool:
    rv = SYNAPSE_VERSIONS[version_id]
    events = [make_event_from_dict(dict(p), rv) for p in state]
    event = make_event_from_dict(dict(pdu), rv)
    try:
        check_state_dependent_auth_rules(event, events)
        return True
    except SynapseError:
        return False


@settings(max_examples=1500, deadline=None)
@given(situations())
def test_verdicts_agree_with_synapse(case):
    version_id, state, pdu = case
    version = KNOWN_ROOM_VERSIONS[version_id]
    ours_state = {}
    for p in state:
        e = parse_pdu(p, version)
        ours_state[e.key] = e
    event = parse_pdu(pdu, version)
    try:
        check_state_dependent(event, ours_state)
        ours = True
    except AuthFailed:
        ours = False
    assert ours == _synapse_allows(version_id, state, pdu)
    synapse_event = make_event_from_dict(dict(pdu), SYNAPSE_VERSIONS[version_id])
    assert auth_types_for_event(event) == set(synapse_auth_types(SYNAPSE_VERSIONS[version_id], synapse_event))


def test_v12_creators_outrank_every_level():
    assert CREATOR_POWER_LEVEL > 2**53 - 1


@pytest.mark.parametrize("problem, reason", [
    ("duplicate", "twice"), ("rejected", "rejected"), ("other_room", "another room"),
    ("wrong_key", "not one this event may cite"), ("no_create", "no create event"),
])
def test_auth_events_that_rules_1_to_3_refuse(problem, reason):
    v10 = KNOWN_ROOM_VERSIONS["10"]

    def ev(etype, state_key, content, auth=(), room="!r:s1", ts=1, sender="@a:s1"):
        return parse_pdu(with_content_hash({
            "type": etype, "state_key": state_key, "sender": sender, "content": content,
            "depth": 1, "origin_server_ts": ts, "prev_events": [], "auth_events": list(auth),
            "room_id": room}), v10)

    create = ev("m.room.create", "", {"creator": "@a:s1", "room_version": "10"})
    join = ev("m.room.member", "@a:s1", {"membership": "join"}, [create.event_id], ts=2)
    join2 = ev("m.room.member", "@a:s1", {"membership": "join"}, [create.event_id], ts=3)
    elsewhere = ev("m.room.power_levels", "", {}, [create.event_id], room="!q:s1", ts=4)
    topic = ev("m.room.topic", "", {}, [create.event_id], ts=5)
    auth = {"duplicate": [create.event_id, join.event_id, join2.event_id],
            "rejected": [create.event_id, join.event_id],
            "other_room": [create.event_id, elsewhere.event_id],
            "wrong_key": [create.event_id, topic.event_id],
            "no_create": [join.event_id]}[problem]
    message = ev("m.room.message", None, {"body": "x"}, auth, ts=9)
    known = {e.event_id: e for e in (create, join, join2, elsewhere, topic)}
    rejected = {join.event_id} if problem == "rejected" else set()
    with pytest.raises(AuthFailed, match=reason):
        check_state_independent(message, known.get, rejected)


def _pdu(sender, etype, content, state_key=None, _ts=[0]):  # noqa: B006 (a counter shared by every call)
    _ts[0] += 1
    pdu = {"type": etype, "sender": sender, "content": content, "depth": 5,
           "origin_server_ts": _ts[0], "prev_events": ["$p"], "auth_events": [], "room_id": "!r:s1"}
    if state_key is not None:
        pdu["state_key"] = state_key
    return with_content_hash(pdu)


@pytest.mark.parametrize("version_id", ["7", "8", "10"])
@pytest.mark.parametrize("rule", ["restricted", "knock_restricted", "invite", "knock", "public"])
@pytest.mark.parametrize("bob_was", ["invite", "join", "knock", "leave", "ban"])
def test_joins_by_join_rule_and_prior_membership(version_id, rule, bob_was):
    """Rare in random draws: an invited (or knocking, or joined) user joining a restricted
    or knock room without anyone vouching for them."""
    state = [_pdu("@a:s1", "m.room.create", {"room_version": version_id, "creator": "@a:s1"}, ""),
             _pdu("@a:s1", "m.room.join_rules", {"join_rule": rule}, ""),
             _pdu("@a:s1", "m.room.member", {"membership": "join"}, "@a:s1"),
             _pdu("@b:s2", "m.room.member", {"membership": bob_was}, "@b:s2")]
    join = _pdu("@b:s2", "m.room.member", {"membership": "join"}, "@b:s2")
    version = KNOWN_ROOM_VERSIONS[version_id]
    ours_state = {parse_pdu(p, version).key: parse_pdu(p, version) for p in state}
    try:
        check_state_dependent(parse_pdu(join, version), ours_state)
        ours = True
    except AuthFailed:
        ours = False
    assert ours == _synapse_allows(version_id, state, join)


@settings(max_examples=200, deadline=None)
@given(version_id=st.sampled_from(["3", "6", "10", "11", "12"]),
       redacter=st.sampled_from(USERS), author=st.sampled_from(USERS),
       redact_level=st.sampled_from([None, 0, 50, 100]),
       levels=st.dictionaries(st.sampled_from(USERS), st.sampled_from([0, 50, 100]), max_size=3))
def test_redactions_take_effect_as_in_synapse(version_id, redacter, author, redact_level, levels):
    """v3+: redact level, or the same server as the redacted event's sender (Synapse:
    ``check_redaction`` flags the event for the domain re-check done when it is read)."""
    from synapse.event_auth import check_redaction

    from rooms.matrix.auth_rules import redaction_takes_effect

    version = KNOWN_ROOM_VERSIONS[version_id]
    rv = SYNAPSE_VERSIONS[version_id]
    create = {"room_version": version_id}
    if not version.implicit_room_creator:
        create["creator"] = USERS[0]
    pl = {"users": {u: lvl for u, lvl in levels.items()
                    if not (version.creators_have_infinite_power and u == USERS[0])}}
    if redact_level is not None:
        pl["redact"] = redact_level
    state = [_pdu(USERS[0], "m.room.create", create, "")]
    if version.room_id_from_create_event:
        del state[0]["room_id"]
        state[0] = with_content_hash(state[0])
    room_id = parse_pdu(state[0], version).room_id
    state.append(with_content_hash(dict(_pdu(USERS[0], "m.room.power_levels", pl, ""), room_id=room_id)))
    target = with_content_hash(dict(_pdu(author, "m.room.message", {"body": "x"}), room_id=room_id))
    target_id = parse_pdu(target, version).event_id
    content, extra = ({"redacts": target_id}, {}) if version.redaction.value >= 11 \
        else ({}, {"redacts": target_id})
    redaction = with_content_hash(dict(_pdu(redacter, "m.room.redaction", content), room_id=room_id, **extra))
    ours_state = {parse_pdu(p, version).key: parse_pdu(p, version) for p in state}
    ours = redaction_takes_effect(parse_pdu(redaction, version), parse_pdu(target, version), ours_state)
    synapse_state = {}
    for p in state:
        e = make_event_from_dict(dict(p), rv)
        synapse_state[(e.type, e.state_key)] = e
    needs_recheck = check_redaction(rv, make_event_from_dict(dict(redaction), rv), synapse_state)
    theirs = not needs_recheck or redacter.split(":")[1] == author.split(":")[1]
    assert ours == theirs


@pytest.mark.parametrize("problem", [None, "wrong_mxid", "wrong_token", "bad_signature",
                                     "other_sender", "target_banned", "no_signed",
                                     "second_key", "urlsafe_key"])
@pytest.mark.parametrize("version_id", ["6", "10", "12"])
def test_third_party_invites_agree_with_synapse(version_id, problem):
    """An invite backed by a third-party invite: the token's event, its sender, and an
    ed25519 signature by one of its public keys (real keys, verified by both)."""
    import base64

    import nacl.signing

    from rooms.matrix import canonical_json

    def b64(raw, urlsafe=False):
        return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).rstrip(b"=").decode()

    key = nacl.signing.SigningKey.generate()
    other_key = nacl.signing.SigningKey.generate()
    version = KNOWN_ROOM_VERSIONS[version_id]
    public = b64(bytes(key.verify_key), urlsafe=problem == "urlsafe_key")
    create = {"room_version": version_id}
    if not version.implicit_room_creator:
        create["creator"] = USERS[0]
    state = [_pdu(USERS[0], "m.room.create", create, "")]
    if version.room_id_from_create_event:
        del state[0]["room_id"]
        state[0] = with_content_hash(state[0])
    room_id = parse_pdu(state[0], version).room_id

    def in_room(pdu):
        return with_content_hash(dict(pdu, room_id=room_id))

    tpi_content = {"display_name": "x", "key_validity_url": "https://id/x",
                   "public_key": public if problem != "second_key" else b64(bytes(other_key.verify_key))}
    if problem == "second_key":
        tpi_content["public_keys"] = [{"public_key": public}]
    state += [in_room(_pdu(USERS[0], "m.room.member", {"membership": "join"}, USERS[0])),
              in_room(_pdu(USERS[2], "m.room.member", {"membership": "join"}, USERS[2])),
              in_room(_pdu(USERS[2] if problem == "other_sender" else USERS[0],
                           "m.room.third_party_invite", tpi_content, "tok"))]
    if problem == "target_banned":
        state.append(in_room(_pdu(USERS[0], "m.room.member", {"membership": "ban"}, USERS[1])))
    signed = {"mxid": USERS[2] if problem == "wrong_mxid" else USERS[1],
              "token": "other" if problem == "wrong_token" else "tok"}
    signer = other_key if problem == "bad_signature" else key
    signed["signatures"] = {"id.example": {"ed25519:0": b64(
        signer.sign(canonical_json.encode(signed)).signature)}}
    content = {"membership": "invite", "third_party_invite": {"display_name": "x", "signed": signed}}
    if problem == "no_signed":
        del content["third_party_invite"]["signed"]
    invite = in_room(_pdu(USERS[0], "m.room.member", content, USERS[1]))

    ours_state = {parse_pdu(p, version).key: parse_pdu(p, version) for p in state}
    try:
        check_state_dependent(parse_pdu(invite, version), ours_state)
        ours = True
    except AuthFailed:
        ours = False
    assert ours == _synapse_allows(version_id, state, invite)
    assert ours == (problem in (None, "second_key", "urlsafe_key"))

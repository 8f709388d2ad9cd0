"""Event IDs, content hashes, canonical JSON and redaction, each checked against Synapse's own
event code (``make_event_from_dict``, ``redact_event_dict``, ``compute_content_hash``) on
hypothesis-generated events of every room version."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from synapse.api.room_versions import KNOWN_ROOM_VERSIONS as SYNAPSE_VERSIONS
from synapse.crypto.event_signing import compute_content_hash
from synapse.events import make_event_from_dict
from synapse.synapse_rust.events import redact_event_dict

from rooms.matrix import canonical_json
from rooms.matrix.event_format import (
    BadEventFormat,
    compute_event_id,
    content_hash,
    content_hash_matches,
    parse_pdu,
    room_id_from_create_event_id,
    with_content_hash,
)
from rooms.matrix.event_redaction import redact
from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS, UnknownRoomVersion, room_version

VERSIONS = [str(n) for n in range(1, 13)]

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**53) + 1, 2**53 - 1), _text)
_json = st.recursive(_json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)), max_leaves=8)

_TYPES = ["m.room.member", "m.room.create", "m.room.join_rules", "m.room.power_levels",
          "m.room.history_visibility", "m.room.aliases", "m.room.redaction", "m.room.topic",
          "m.room.message", "m.room.third_party_invite"]
_KEYS = ["membership", "join_authorised_via_users_server", "third_party_invite", "creator",
         "room_version", "join_rule", "allow", "ban", "events", "events_default", "kick",
         "redact", "state_default", "users", "users_default", "invite", "notifications",
         "history_visibility", "aliases", "redacts", "body", "topic"]
_content = st.dictionaries(st.sampled_from(_KEYS) | _text, _json, max_size=6) | st.fixed_dictionaries(
    {"third_party_invite": st.one_of(st.fixed_dictionaries({"signed": _json, "x": _json}),
                                     st.fixed_dictionaries({"x": _json}))})
_extra_top = st.dictionaries(
    st.sampled_from(["origin", "membership", "prev_state", "redacts", "unsigned", "age_ts",
                     "signatures", "other"]), _json, max_size=4)


@st.composite
def pdus(draw, version_id: str):
    version = KNOWN_ROOM_VERSIONS[version_id]
    etype = draw(st.sampled_from(_TYPES))
    is_state = draw(st.booleans())
    refs = draw(st.lists(st.text("abcdef0123456789", min_size=4, max_size=8), max_size=3))
    ref_ids = ["$" + r for r in refs]
    pdu = {
        "type": etype, "sender": "@" + draw(st.sampled_from(["a", "b"])) + ":x",
        "content": draw(_content), "depth": draw(st.integers(0, 2**53 - 1)),
        "origin_server_ts": draw(st.integers(0, 2**53 - 1)),
        "prev_events": ref_ids, "auth_events": list(ref_ids), "room_id": "!room:x",
    }
    for k, v in draw(_extra_top).items():
        pdu[k] = v
    if "unsigned" in pdu and not isinstance(pdu["unsigned"], dict):
        pdu["unsigned"] = {"age_ts": 1, "x": pdu["unsigned"]}
    if "signatures" in pdu:
        pdu["signatures"] = {"x": {"ed25519:a": "sig"}}
    if is_state:
        pdu["state_key"] = draw(st.sampled_from(["", "@a:x", "x"]))
    if version.refs_are_pairs:
        pdu["prev_events"] = [[r, {}] for r in ref_ids]
        pdu["auth_events"] = [[r, {}] for r in ref_ids]
        pdu["event_id"] = "$" + draw(st.text("abc", min_size=1, max_size=5)) + ":x"
    if version.room_id_from_create_event and etype == "m.room.create" and pdu.get("state_key") == "":
        del pdu["room_id"]
    pdu = with_content_hash(pdu)
    if draw(st.booleans()):
        pdu["hashes"] = {"sha256": "tampered"}
    return version_id, pdu


@st.composite
def any_version_pdu(draw):
    return draw(pdus(draw(st.sampled_from(VERSIONS))))


@settings(max_examples=500, deadline=None)
@given(any_version_pdu())
@example(("11", {"type": "m.room.redaction", "sender": "@a:x", "content": {}, "depth": 0,
                 "origin_server_ts": 0, "prev_events": [], "auth_events": [], "room_id": "!room:x",
                 "redacts": "", "hashes": {"sha256": "x"}}))  # a top-level redacts in v11 (found in CI)
@example(("11", {"type": "m.room.redaction", "sender": "@a:x", "content": {}, "depth": 0,
                 "origin_server_ts": 0, "prev_events": [], "auth_events": [], "room_id": "!room:x",
                 "redacts": "$a", "hashes": {"sha256": "x"}}))
def test_event_id_redaction_and_content_hash_agree_with_synapse(case):
    version_id, pdu = case
    ours = KNOWN_ROOM_VERSIONS[version_id]
    theirs = SYNAPSE_VERSIONS[version_id]
    synapse_event = make_event_from_dict(dict(pdu), theirs)
    assert compute_event_id(pdu, ours) == synapse_event.event_id
    assert redact(pdu, ours) == redact_event_dict(theirs, pdu)
    name, digest = compute_content_hash(dict(pdu), hashlib.sha256)
    assert content_hash(pdu) == canonical_json_b64(digest)
    assert content_hash_matches(pdu) == (pdu["hashes"].get("sha256") == content_hash(pdu))
    parsed = parse_pdu(pdu, ours)
    assert parsed.room_id == synapse_event.room_id
    assert list(parsed.auth_event_ids) == list(synapse_event.auth_event_ids())
    assert list(parsed.prev_event_ids) == list(synapse_event.prev_event_ids())
    if parsed.type == "m.room.redaction":
        # a non-string ``redacts`` names no event: we read it as none, Synapse passes it on
        theirs = synapse_event.redacts
        assert parsed.redacts == (theirs if isinstance(theirs, str) else None)


def canonical_json_b64(digest: bytes) -> str:
    import base64
    return base64.b64encode(digest).rstrip(b"=").decode()


def test_v3_ids_use_the_standard_alphabet_and_v4_the_url_safe_one():
    # find an event whose reference hash has a '+' or '/' in standard base64
    for ts in range(200):
        pdu = with_content_hash({"type": "m.room.message", "sender": "@a:x", "content": {},
                                 "depth": 1, "origin_server_ts": ts, "prev_events": [],
                                 "auth_events": [], "room_id": "!r:x"})
        v3 = compute_event_id(pdu, KNOWN_ROOM_VERSIONS["3"])
        if "+" in v3 or "/" in v3:
            v4 = compute_event_id(pdu, KNOWN_ROOM_VERSIONS["4"])
            assert v4 == v3.replace("+", "-").replace("/", "_")
            return
    pytest.fail("no hash with + or / in 200 tries")


def test_content_that_redaction_strips_does_not_change_a_v4_id():
    base = {"type": "m.room.message", "sender": "@a:x", "content": {"body": "one"},
            "depth": 1, "origin_server_ts": 1, "prev_events": [], "auth_events": [],
            "room_id": "!r:x"}
    other = dict(base, content={"body": "two"})
    v10 = KNOWN_ROOM_VERSIONS["10"]
    # the content hashes differ, so the IDs differ; with the same hashes they are equal
    assert compute_event_id(with_content_hash(base), v10) != compute_event_id(with_content_hash(other), v10)
    a, b = dict(base, hashes={"sha256": "h"}), dict(other, hashes={"sha256": "h"})
    assert compute_event_id(a, v10) == compute_event_id(b, v10)


def test_v12_room_id_names_the_create_event_and_the_create_event_is_implied():
    v12 = KNOWN_ROOM_VERSIONS["12"]
    create = with_content_hash({"type": "m.room.create", "state_key": "", "sender": "@a:x",
                                "content": {"room_version": "12"}, "depth": 1,
                                "origin_server_ts": 1, "prev_events": [], "auth_events": []})
    c = parse_pdu(create, v12)
    assert c.room_id == room_id_from_create_event_id(c.event_id) == "!" + c.event_id[1:]
    join = with_content_hash({"type": "m.room.member", "state_key": "@a:x", "sender": "@a:x",
                              "content": {"membership": "join"}, "depth": 2,
                              "origin_server_ts": 2, "prev_events": [c.event_id],
                              "auth_events": [], "room_id": c.room_id})
    assert parse_pdu(join, v12).auth_event_ids == (c.event_id,)
    with pytest.raises(BadEventFormat, match="must not list the create event"):
        parse_pdu(dict(join, auth_events=[c.event_id]), v12)


@pytest.mark.parametrize("bad, reason", [
    ({"depth": 2**53}, "depth"),
    ({"content": {"n": 2**53}}, "out of range"),
    ({"content": {"n": 1.5}}, "float"),
    ({"event_id": "$x:y"}, "must not carry an event_id"),
    ({"prev_events": [["$x", {}]]}, "event ID strings"),
    ({"content": []}, "content must be an object"),
])
def test_malformed_v10_events_get_a_clear_error(bad, reason):
    pdu = {"type": "m.room.message", "sender": "@a:x", "content": {}, "depth": 1,
           "origin_server_ts": 1, "prev_events": [], "auth_events": [], "room_id": "!r:x",
           "hashes": {}}
    pdu.update(bad)
    with pytest.raises(BadEventFormat, match=reason):
        parse_pdu(pdu, KNOWN_ROOM_VERSIONS["10"])


def test_relaxed_canonical_json_still_hashes_old_events_with_big_integers():
    pdu = with_content_hash({"type": "m.room.message", "sender": "@a:x", "content": {"n": 2**60},
                             "depth": 1, "origin_server_ts": 1, "prev_events": [],
                             "auth_events": [], "room_id": "!r:x"})
    v5 = KNOWN_ROOM_VERSIONS["5"]
    assert parse_pdu(pdu, v5).event_id == make_event_from_dict(dict(pdu), SYNAPSE_VERSIONS["5"]).event_id
    with pytest.raises(canonical_json.InvalidCanonicalJson):
        canonical_json.encode(pdu, strict=True)


def test_canonical_json_sorts_keys_and_keeps_utf8():
    assert canonical_json.encode({"b": 1, "a": "é", "c": {"z": [], "y": None}}) == \
        '{"a":"é","b":1,"c":{"y":null,"z":[]}}'.encode()


def test_room_versions():
    assert room_version(None).identifier == "1"
    assert room_version("12").creators_have_infinite_power
    with pytest.raises(UnknownRoomVersion):
        room_version("13")


def test_v12_redaction_drops_room_id_from_every_create_typed_event():
    """Found by the generated test: in v12 the redaction algorithm drops ``room_id`` from
    any ``m.room.create`` event, state key or not, so it is not part of the ID."""
    pdu = with_content_hash({"type": "m.room.create", "sender": "@a:x", "content": {},
                             "depth": 0, "origin_server_ts": 0, "prev_events": [],
                             "auth_events": [], "room_id": "!room:x"})
    v12 = KNOWN_ROOM_VERSIONS["12"]
    assert "room_id" not in redact(pdu, v12)
    assert compute_event_id(pdu, v12) == make_event_from_dict(dict(pdu), SYNAPSE_VERSIONS["12"]).event_id


_fields = st.fixed_dictionaries({}, optional={
    "type": st.one_of(st.sampled_from(_TYPES), _json), "sender": st.one_of(st.just("@a:x"), _json),
    "content": st.one_of(_content, _json), "depth": st.one_of(st.integers(-5, 2**60), _json),
    "origin_server_ts": st.one_of(st.integers(0, 10), _json), "hashes": st.one_of(st.just({}), _json),
    "prev_events": st.one_of(st.just([]), st.just([["$x", {}]]), st.just(["$x"]), _json),
    "auth_events": st.one_of(st.just([]), st.just([["$x", {}]]), st.just(["$x"]), _json),
    "room_id": st.one_of(st.just("!r:x"), _json), "state_key": st.one_of(st.just(""), _json),
    "event_id": st.one_of(st.just("$e:x"), _json), "redacts": _json,
})


@settings(max_examples=300, deadline=None)
@given(version_id=st.sampled_from(VERSIONS), pdu=st.one_of(_fields, _json))
def test_malformed_pdus_get_bad_event_format_and_nothing_else(version_id, pdu):
    """Whatever arrives, the result is an event or a BadEventFormat with a reason; and an
    event that parses is judged by the auth rules without any other exception."""
    from rooms.matrix.auth_rules import AuthFailed, check_state_dependent
    version = KNOWN_ROOM_VERSIONS[version_id]
    try:
        event = parse_pdu(pdu, version)
    except BadEventFormat as e:
        assert str(e)
        return
    create = parse_pdu(with_content_hash({
        "type": "m.room.create", "state_key": "", "sender": "@a:x", "content": {"creator": "@a:x"},
        "depth": 1, "origin_server_ts": 1, "prev_events": [], "auth_events": [], "room_id": "!r:x",
        **({} if version.event_ids_are_hashes else {"event_id": "$c:x"})}), version)
    try:
        check_state_dependent(event, {create.key: create})
    except AuthFailed:
        pass


@pytest.mark.parametrize("version_id", ["2", "10", "12"])
def test_an_event_read_back_under_its_stored_id_parses_the_same_without_hashing(version_id, monkeypatch):
    """The persist path re-reads auth events it stored: their IDs were computed from the same
    bytes then, so ``stored_id`` stands in for the reference hash (and the canonical-JSON
    walk), and the parsed event is the one a fresh parse gives."""
    import rooms.matrix.event_format as event_format

    version = KNOWN_ROOM_VERSIONS[version_id]
    pdu = with_content_hash({"type": "m.room.member", "state_key": "@a:x", "sender": "@a:x",
                             "content": {"membership": "join"}, "depth": 2, "origin_server_ts": 2,
                             "prev_events": [], "auth_events": [], "room_id": "!r:x"})
    if not version.event_ids_are_hashes:
        pdu = dict(pdu, event_id="$given:x", prev_events=[], auth_events=[])
    fresh = parse_pdu(pdu, version)

    def no_hashing(*args, **kw):
        raise AssertionError("hashed again")

    monkeypatch.setattr(event_format, "compute_event_id", no_hashing)
    monkeypatch.setattr(event_format.canonical_json, "check_strict", no_hashing)
    assert parse_pdu(pdu, version, stored_id=fresh.event_id) == fresh

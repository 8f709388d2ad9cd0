"""The Matrix authorization rules, per room version: may this event be part of the room,
given the state it is checked against? (docs/matrix.md; the Matrix spec's authorization rules
per room version, as Synapse's ``synapse/event_auth.py`` applies them.)

Split as the receive path and state resolution need it:
* :func:`check_state_independent` -- rules 1-3: the create event's own rules, and whether the
  event's listed ``auth_events`` are acceptable at all (right keys, not rejected, same room).
  Needs only the auth events themselves.
* :func:`check_state_dependent` -- rules 4 on, against an *auth state*: a map
  ``(type, state_key) -> Event`` (the event's auth events, the state before it, the current
  state, or a partially resolved state).

A failed rule raises :class:`AuthFailed` with the reason; the caller stores the event as
rejected. Malformed power-level content is a failed rule too (Synapse raises a 400 there; both
mean "not allowed").
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from rooms.matrix import canonical_json
from rooms.matrix.event_format import Event, create_event_id_from_room_id
from rooms.matrix.room_versions import CREATOR_POWER_LEVEL, KNOWN_ROOM_VERSIONS, RoomVersion

CREATE = ("m.room.create", "")
POWER_LEVELS = ("m.room.power_levels", "")
JOIN_RULES = ("m.room.join_rules", "")
MEMBER = "m.room.member"

StateMap = Mapping[tuple[str, str], Event]

#: Levels that apply when the power-levels event (or its key) is missing.
_DEFAULT_NAMED_LEVELS = {"invite": 0, "kick": 50, "ban": 50, "redact": 50}
_TOP_LEVEL_PL_KEYS = ("users_default", "events_default", "state_default", "ban", "redact",
                      "kick", "invite")


class AuthFailed(Exception):
    """The event breaks an authorization rule (it is rejected, never becomes state)."""


class MissingAuthEvent(LookupError):
    """An event's listed auth event is not known: fetch it before checking (no verdict)."""


def domain(user_or_event_id: str) -> str:
    _, sep, rest = user_or_event_id.partition(":")
    if not sep:
        raise AuthFailed(f"{user_or_event_id!r} has no server part")
    return rest


def _is_user_id(value: object) -> bool:
    return (isinstance(value, str) and value.startswith("@")
            and len(value[1:].split(":", 1)) == 2)


# --- power levels -------------------------------------------------------------------------

def _as_int(value: Any, version: RoomVersion) -> int:
    """Validate a power level in a *new* power-levels event: JSON integers only from v10;
    before that ``int()`` semantics (numeric strings, and floats up to v5)."""
    if type(value) is int:
        return value
    if version.enforce_int_power_levels:
        raise AuthFailed(f"power level {value!r} is not an integer")
    if isinstance(value, float) and not version.allow_float_power_levels:
        raise AuthFailed(f"power level {value!r} is a float")
    return _level(value)


def _level(value: Any) -> int:
    """Read a level from an accepted event: ``int()`` semantics in every version (as
    Synapse reads them; the strict types only gate new power-levels events)."""
    if type(value) is int:
        return value
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise AuthFailed(f"power level {value!r} is not a number") from None


def creators(create: Event) -> frozenset[str]:
    """Who created the room: ``content.creator`` before v11, the sender from v11, plus the
    ``additional_creators`` in v12 (MSC4289)."""
    version = create.version
    if not version.implicit_room_creator:
        creator = create.content.get("creator")
        return frozenset((creator,)) if isinstance(creator, str) else frozenset()
    out = {create.sender}
    if version.creators_have_infinite_power:
        extra = create.content.get("additional_creators")
        if isinstance(extra, list):
            out.update(u for u in extra if isinstance(u, str))
    return frozenset(out)


def user_power_level(user_id: str, state: StateMap) -> int:
    """The user's level in ``state`` (v12 creators: above every expressible level)."""
    create = state.get(CREATE)
    if create is None:
        raise AuthFailed("no create event in the auth state")
    version = create.version
    if version.creators_have_infinite_power and user_id in creators(create):
        return CREATOR_POWER_LEVEL
    pl = state.get(POWER_LEVELS)
    if pl is not None:
        users = pl.content.get("users")
        level = users.get(user_id) if isinstance(users, dict) else None
        if level is None:
            level = pl.content.get("users_default", 0)
        return _level(level)
    return 100 if user_id in creators(create) else 0


def _named_level(state: StateMap, name: str, version: RoomVersion) -> int:
    pl = state.get(POWER_LEVELS)
    default = _DEFAULT_NAMED_LEVELS[name]
    if pl is None:
        return default
    return _level(pl.content.get(name, default))


def _send_level(event: Event, state: StateMap) -> int:
    pl = state.get(POWER_LEVELS)
    if pl is None:
        return 50 if event.is_state else 0
    events = pl.content.get("events")
    level = events.get(event.type) if isinstance(events, dict) else None
    if level is None:
        if event.is_state:
            level = pl.content.get("state_default", 50)
        else:
            level = pl.content.get("events_default", 0)
    return _level(level)


# --- auth events selection ------------------------------------------------------------------

def auth_types_for_event(event: Event) -> set[tuple[str, str]]:
    """The state keys an event's ``auth_events`` may cite (and that state resolution takes
    from the resolved state when re-checking it). The create key is always in; in v12 the
    create event is implied rather than listed."""
    if event.type == "m.room.create" and event.state_key == "":
        return set()
    keys = {CREATE, POWER_LEVELS, (MEMBER, event.sender)}
    if event.type == MEMBER:
        membership = event.content.get("membership")
        if membership in ("join", "invite", "knock"):
            keys.add(JOIN_RULES)
        if event.state_key is not None:
            keys.add((MEMBER, event.state_key))
        content = event.content
        if membership == "invite" and "third_party_invite" in content:
            try:
                token = content["third_party_invite"]["signed"]["token"]
            except (KeyError, TypeError):
                token = None
            if isinstance(token, str):
                keys.add(("m.room.third_party_invite", token))
        if (membership == "join" and event.version.restricted_join_rule
                and isinstance(content.get("join_authorised_via_users_server"), str)):
            keys.add((MEMBER, content["join_authorised_via_users_server"]))
    return keys


# --- rules 1-3 --------------------------------------------------------------------------------

def _check_create(event: Event) -> None:
    version = event.version
    if event.prev_event_ids:
        raise AuthFailed("the create event has prev events")
    if version.room_id_from_create_event:
        if "room_id" in event.pdu:
            raise AuthFailed("a v12 create event must not have a room_id")
    elif domain(event.room_id) != domain(event.sender):
        raise AuthFailed("the create event's room ID and sender are on different servers")
    room_version = event.content.get("room_version", "1")
    if not isinstance(room_version, str) or room_version not in KNOWN_ROOM_VERSIONS:
        raise AuthFailed(f"unknown room version {room_version!r}")
    if not version.implicit_room_creator and "creator" not in event.content:
        raise AuthFailed("the create event has no creator")
    if version.creators_have_infinite_power and "additional_creators" in event.content:
        extra = event.content["additional_creators"]
        if not isinstance(extra, list) or not all(_is_user_id(u) for u in extra):
            raise AuthFailed("additional_creators must be a list of user IDs")


def check_state_independent(event: Event, get_event: Callable[[str], Event | None],
                            rejected: Collection[str] = ()) -> None:
    """Rules 1-3: the create event's own rules; the listed auth events exist, are in this
    room, are not rejected, cite each key once and only keys the event may cite.

    ``get_event`` looks an auth event up (``None`` = unknown: :class:`MissingAuthEvent`)."""
    if event.type == "m.room.create" and event.state_key == "":
        _check_create(event)
        return
    version = event.version
    seen: dict[tuple[str, str], str] = {}
    for auth_id in event.auth_event_ids:
        auth_event = get_event(auth_id)
        if auth_event is None:
            raise MissingAuthEvent(auth_id)
        if auth_event.room_id != event.room_id:
            raise AuthFailed(f"auth event {auth_id} is in another room")
        if auth_id in rejected:
            raise AuthFailed(f"auth event {auth_id} was rejected")
        key = auth_event.key
        if key in seen:
            raise AuthFailed(f"auth events cite {key} twice")
        seen[key] = auth_id
    allowed = auth_types_for_event(event)
    for key in seen:
        if key not in allowed:
            raise AuthFailed(f"auth event key {key} is not one this event may cite")
    if CREATE not in seen:
        raise AuthFailed("no create event among the auth events")
    if version.room_id_from_create_event and \
            seen[CREATE] != create_event_id_from_room_id(event.room_id):
        raise AuthFailed("the room ID does not name the create event")


# --- rules 4 on -------------------------------------------------------------------------------

def check_state_dependent(event: Event, state: StateMap) -> None:
    """Rules 4 on, against ``state`` (which must hold the create event)."""
    if event.type == "m.room.create" and event.state_key == "":
        return
    create = state.get(CREATE)
    if create is None:
        raise AuthFailed("no create event in the auth state")
    version = event.version
    if not create.content.get("m.federate", True) and domain(event.sender) != domain(create.sender):
        raise AuthFailed("the room is not federated")
    if event.type == "m.room.aliases" and version.special_case_aliases_auth:
        if event.state_key is None:
            raise AuthFailed("an aliases event must be a state event")
        if event.state_key != domain(event.sender):
            raise AuthFailed("an aliases event's state key must be the sender's server")
        return
    if event.type == MEMBER:
        _check_membership(event, state, create)
        return
    sender_member = state.get((MEMBER, event.sender))
    if sender_member is None or sender_member.membership != "join":
        raise AuthFailed(f"{event.sender} is not joined to the room")
    sender_level = user_power_level(event.sender, state)
    if event.type == "m.room.third_party_invite":
        if sender_level < _named_level(state, "invite", version):
            raise AuthFailed("sender may not invite")
        return
    if sender_level < _send_level(event, state):
        raise AuthFailed(f"sender's level is too low to send {event.type}")
    if event.state_key is not None and event.state_key.startswith("@") \
            and event.state_key != event.sender:
        raise AuthFailed("only the user may set a state key that is their user ID")
    if event.type == "m.room.power_levels" and event.state_key == "":
        _check_power_levels(event, state, sender_level)
    if event.type == "m.room.redaction" and version.redaction_in_auth_rules:
        if sender_level < _named_level(state, "redact", version):
            if not isinstance(event.redacts, str) or \
                    domain(event.event_id) != domain(event.redacts):
                raise AuthFailed("sender may not redact this event")


def _check_membership(event: Event, state: StateMap, create: Event) -> None:
    version = event.version
    content = event.content
    membership = content.get("membership")
    target = event.state_key
    if target is None or not isinstance(membership, str):
        raise AuthFailed("a member event needs a state key and a membership")
    # the creator's first join: its only prev event is the create event
    if membership == "join" and len(event.prev_event_ids) == 1 \
            and event.prev_event_ids[0] == create.event_id:
        creator: object
        if version.implicit_room_creator:
            creator = create.sender
        else:
            creator = create.content.get("creator")
        if creator == target:
            return
    if not create.content.get("m.federate", True) and domain(target) != domain(create.sender):
        raise AuthFailed("the room is not federated")

    sender_member = state.get((MEMBER, event.sender))
    sender_membership = sender_member.membership if sender_member is not None else None
    sender_joined = sender_membership == "join"
    sender_invited = sender_membership == "invite"
    sender_knocked = version.knock_join_rule and sender_membership == "knock"
    target_member = state.get((MEMBER, target))
    target_membership = target_member.membership if target_member is not None else None
    target_joined = target_membership == "join"
    target_banned = target_membership == "ban"
    jr_event = state.get(JOIN_RULES)
    join_rule = jr_event.content.get("join_rule", "invite") if jr_event is not None else "invite"
    sender_level = user_power_level(event.sender, state)
    target_level = user_power_level(target, state)
    invite_level = _named_level(state, "invite", version)
    ban_level = _named_level(state, "ban", version)

    if membership == "invite" and "third_party_invite" in content:
        if target_banned:
            raise AuthFailed("the invitee is banned")
        _check_third_party_invite(event, state)
        return

    if membership != "join" and not (version.knock_join_rule and membership == "knock"):
        if (sender_invited or sender_knocked) and membership == "leave" \
                and target == event.sender:
            return
        if not sender_joined:
            raise AuthFailed(f"{event.sender} is not joined to the room")

    if membership == "invite":
        if target_banned:
            raise AuthFailed("the invitee is banned")
        if target_joined:
            raise AuthFailed("the invitee is already joined")
        if sender_level < invite_level:
            raise AuthFailed("sender may not invite")
    elif membership == "join":
        if event.sender != target:
            raise AuthFailed("a user may only join themselves")
        if target_banned:
            raise AuthFailed("the user is banned")
        if join_rule == "public":
            return
        if (version.restricted_join_rule and join_rule == "restricted") or \
                (version.knock_restricted_join_rule and join_rule == "knock_restricted"):
            if sender_joined or sender_invited:
                return
            authoriser = content.get("join_authorised_via_users_server")
            if authoriser is None:
                raise AuthFailed("a restricted join needs an authorising user")
            authoriser_member = state.get((MEMBER, authoriser)) if isinstance(authoriser, str) else None
            if authoriser_member is None or authoriser_member.membership != "join":
                raise AuthFailed("the authorising user is not joined")
            if user_power_level(authoriser, state) < invite_level:
                raise AuthFailed("the authorising user may not invite")
            return
        if join_rule == "invite" or (version.knock_join_rule and join_rule == "knock"):
            if not (sender_joined or sender_invited):
                raise AuthFailed("the room is invite-only")
            return
        raise AuthFailed(f"join rule {join_rule!r} lets nobody join")
    elif membership == "leave":
        if target_banned and sender_level < ban_level:
            raise AuthFailed("sender may not unban")
        if target != event.sender:
            kick_level = _named_level(state, "kick", version)
            if sender_level < kick_level or sender_level <= target_level:
                raise AuthFailed("sender may not kick this user")
    elif membership == "ban":
        if sender_level < ban_level or sender_level <= target_level:
            raise AuthFailed("sender may not ban this user")
    elif version.knock_join_rule and membership == "knock":
        if join_rule != "knock" and not (version.knock_restricted_join_rule
                                         and join_rule == "knock_restricted"):
            raise AuthFailed("the room does not allow knocking")
        if target != event.sender:
            raise AuthFailed("a user may only knock themselves")
        if sender_joined:
            raise AuthFailed("the user is already joined")
        if sender_invited:
            raise AuthFailed("the user is already invited")
        if target_banned:
            raise AuthFailed("the user is banned")
    else:
        raise AuthFailed(f"unknown membership {membership!r}")


def _check_third_party_invite(event: Event, state: StateMap) -> None:
    """An invite backed by a third-party invite: the invite token's event and a signature by
    one of its keys (ed25519; verified with PyNaCl when installed, else refused)."""
    signed = event.content["third_party_invite"].get("signed") \
        if isinstance(event.content["third_party_invite"], dict) else None
    if not isinstance(signed, dict) or "mxid" not in signed or "token" not in signed:
        raise AuthFailed("third-party invite without a signed mxid and token")
    if signed["mxid"] != event.state_key:
        raise AuthFailed("third-party invite for another user")
    tpi = state.get(("m.room.third_party_invite", signed["token"])) \
        if isinstance(signed["token"], str) else None
    if tpi is None:
        raise AuthFailed("no third-party invite event for this token")
    if tpi.sender != event.sender:
        raise AuthFailed("the third-party invite was sent by someone else")
    keys = [tpi.content.get("public_key")]
    public_keys = tpi.content.get("public_keys")
    if isinstance(public_keys, list):
        keys += [k.get("public_key") for k in public_keys if isinstance(k, dict)]
    if not any(_signed_by(signed, k) for k in keys if isinstance(k, str)):
        raise AuthFailed("no valid signature on the third-party invite")


def _unbase64(text: str) -> bytes:
    """Matrix unpadded base64, standard or URL-safe alphabet."""
    import base64
    text = text.replace("-", "+").replace("_", "/")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _signed_by(signed: dict[str, Any], public_key: str) -> bool:
    """Whether ``signed`` carries a valid ed25519 signature by ``public_key``."""
    try:
        from nacl.exceptions import BadSignatureError
        from nacl.signing import VerifyKey
    except ImportError:  # no verifier: never accept an unverified invite
        return False
    try:
        key = VerifyKey(_unbase64(public_key))
    except Exception:
        return False
    body = {k: v for k, v in signed.items() if k not in ("signatures", "unsigned")}
    message = canonical_json.encode(body)
    signatures = signed.get("signatures")
    for server_sigs in (signatures.values() if isinstance(signatures, dict) else ()):
        if not isinstance(server_sigs, dict):
            continue
        for key_id, sig in server_sigs.items():
            if not (isinstance(key_id, str) and key_id.startswith("ed25519:")
                    and isinstance(sig, str)):
                continue
            try:
                key.verify(message, _unbase64(sig))
                return True
            except (BadSignatureError, ValueError):
                continue
    return False


def _check_power_levels(event: Event, state: StateMap, sender_level: int) -> None:
    version = event.version
    new = event.content
    users = new.get("users", {})
    if not isinstance(users, dict):
        raise AuthFailed("users must be an object")
    for user_id, level in users.items():
        if not _is_user_id(user_id):
            raise AuthFailed(f"{user_id!r} is not a user ID")
        _as_int(level, version)
    for name in _TOP_LEVEL_PL_KEYS:
        if name in new:
            _as_int(new[name], version)
    for name in ("events", "notifications"):
        if name in new:
            if not isinstance(new[name], dict):
                if version.enforce_int_power_levels:
                    raise AuthFailed(f"{name} must be an object")
            else:
                for level in new[name].values():
                    _as_int(level, version)
    if version.creators_have_infinite_power:
        create = state.get(CREATE)
        if create is not None and creators(create) & users.keys():
            raise AuthFailed("creators may not be listed in users")

    old_event = state.get(POWER_LEVELS)
    if old_event is None:
        return
    old = old_event.content

    def changed(old_map: Mapping[str, Any], new_map: Mapping[str, Any], name: str, scoped_to_users: bool) -> None:
        old_level = _level(old_map[name]) if name in old_map else None
        new_level = _level(new_map[name]) if name in new_map else None
        if old_level is not None and new_level is not None and old_level == new_level:
            return
        if scoped_to_users and name != event.sender and old_level == sender_level:
            raise AuthFailed("sender may not change the level of a user at their own level")
        if (old_level is not None and old_level > sender_level) or \
                (new_level is not None and new_level > sender_level):
            raise AuthFailed(f"sender may not change {name!r} beyond their own level")

    for name in _TOP_LEVEL_PL_KEYS:
        changed(old, new, name, False)
    scopes = ["users", "events"]
    if version.limit_notifications_power_levels:
        scopes.append("notifications")
    for scope in scopes:
        old_map = old.get(scope, {})
        new_map = new.get(scope, {})
        old_map = old_map if isinstance(old_map, dict) else {}
        new_map = new_map if isinstance(new_map, dict) else {}
        for name in set(old_map) | set(new_map):
            changed(old_map, new_map, name, scope == "users")


# --- convenience ------------------------------------------------------------------------------

def check_against_auth_events(event: Event, get_event: Callable[[str], Event | None],
                              rejected: Collection[str] = ()) -> None:
    """Receipt steps 1-4 for the authorization part: rules 1-3, then rules 4 on against the
    event's own auth events (how an outlier is checked)."""
    check_state_independent(event, get_event, rejected)
    if event.type == "m.room.create" and event.state_key == "":
        return
    state: dict[tuple[str, str], Event] = {}
    for auth_id in event.auth_event_ids:
        auth_event = get_event(auth_id)
        if auth_event is None:  # rules 1-3 checked every one is there
            raise MissingAuthEvent(auth_id)
        state[auth_event.key] = auth_event
    check_state_dependent(event, state)


def auth_state_from(event: Event, state: Mapping[tuple[str, str], str],
                    get_event: Callable[[str], Event | None]) -> dict[tuple[str, str], Event]:
    """The part of a room state (``key -> event ID``) that ``event`` is checked against."""
    out: dict[tuple[str, str], Event] = {}
    for key in auth_types_for_event(event):
        event_id = state.get(key)
        if event_id is not None:
            auth_event = get_event(event_id)
            if auth_event is not None:
                out[key] = auth_event
    return out



def redaction_takes_effect(redaction: Event, target: Event, state: StateMap) -> bool:
    """Whether an *accepted* redaction may prune ``target`` (checked once both are held).

    v1-2 decided it in the auth rules. From v3 the redaction event only needs the send level;
    it takes effect if its sender has the redact level in ``state`` (its auth state) or is on
    the same server as the target's sender (spec: v3 "handling redactions")."""
    if target.room_id != redaction.room_id:
        return False
    if redaction.version.redaction_in_auth_rules:
        return True
    if user_power_level(redaction.sender, state) >= _named_level(state, "redact", redaction.version):
        return True
    return domain(redaction.sender) == domain(target.sender)

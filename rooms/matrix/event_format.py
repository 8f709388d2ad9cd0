"""Events as federation delivers them: per-room-version format checks, event IDs, content
hashes, and the parsed :class:`Event` the authorization rules and state resolution read.

From room version 3 on an event's ID is not in its JSON: it is ``$`` + the base64 SHA-256
*reference hash* of the redacted event (standard alphabet in v3, URL-safe from v4), so it can
be recomputed by anyone and content that redaction strips does not change it. In v12 the room
ID is derived from the create event's ID (``!`` + its hash), and the create event is implied
in every other event's ``auth_events`` instead of listed.
"""
from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any

from rooms.matrix import canonical_json
from rooms.matrix.event_redaction import redact
from rooms.matrix.room_versions import EventIdFormat, RoomVersion

#: Top-level keys the content hash does not cover (they change in transit or hold the hash).
#: The spec names the first three; Synapse also leaves out the legacy transit keys, and a
#: hash that disagrees with Synapse's would make us redact events it accepts whole.
_NOT_CONTENT_HASHED = ("unsigned", "signatures", "hashes", "age_ts", "outlier", "destinations")
#: Top-level keys the reference hash does not cover (after redaction).
_NOT_REFERENCE_HASHED = ("unsigned", "signatures", "age_ts")

_REQUIRED = ("type", "sender", "content", "depth", "origin_server_ts", "prev_events",
             "auth_events", "hashes")


class BadEventFormat(ValueError):
    """The PDU is not a valid event for its room version (federation drops such events)."""


def _b64(digest: bytes, urlsafe: bool) -> str:
    enc = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return enc(digest).rstrip(b"=").decode("ascii")


def content_hash(pdu: dict[str, Any]) -> str:
    """The ``hashes.sha256`` value a correct sender puts in ``pdu``."""
    body = {k: v for k, v in pdu.items() if k not in _NOT_CONTENT_HASHED}
    return _b64(hashlib.sha256(canonical_json.encode(body)).digest(), urlsafe=False)


def content_hash_matches(pdu: dict[str, Any]) -> bool:
    """False when the content was changed after hashing (the event must then be redacted
    before it is used; spec: server-server API, checks on receipt step 3)."""
    hashes = pdu.get("hashes")
    return isinstance(hashes, dict) and hashes.get("sha256") == content_hash(pdu)


def reference_hash(pdu: dict[str, Any], version: RoomVersion) -> bytes:
    """SHA-256 of the canonical JSON of the redacted event without signatures/unsigned.

    Relaxed canonical JSON: an old event with out-of-range integers still has an ID."""
    body = redact(pdu, version)
    for key in _NOT_REFERENCE_HASHED:
        body.pop(key, None)
    return hashlib.sha256(canonical_json.encode(body)).digest()


def compute_event_id(pdu: dict[str, Any], version: RoomVersion) -> str:
    """The event's ID: given in v1-2, the reference hash from v3 on."""
    if version.event_id_format is EventIdFormat.GIVEN:
        event_id = pdu.get("event_id")
        if not isinstance(event_id, str) or not event_id.startswith("$"):
            raise BadEventFormat("room versions 1-2 need an event_id field")
        return event_id
    urlsafe = version.event_id_format is EventIdFormat.HASH_URLSAFE
    return "$" + _b64(reference_hash(pdu, version), urlsafe)


def room_id_from_create_event_id(create_event_id: str) -> str:
    """v12 (MSC4291): the room ID names its create event: ``$hash`` -> ``!hash``."""
    return "!" + create_event_id[1:]


def create_event_id_from_room_id(room_id: str) -> str:
    return "$" + room_id[1:]


def with_content_hash(pdu: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``pdu`` with its ``hashes.sha256`` set (for building events)."""
    out = dict(pdu)
    out["hashes"] = {}
    out["hashes"] = {"sha256": content_hash(out)}
    return out


@dataclass(frozen=True, slots=True, eq=False)
class Event:
    """The fields of an event that authorization and state resolution read.

    ``auth_event_ids`` includes the implied create event in v12 (as every reader needs it);
    ``pdu`` is the dict as received, unchanged."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    sender: str
    content: dict[str, Any]
    origin_server_ts: int
    depth: int
    prev_event_ids: tuple[str, ...]
    auth_event_ids: tuple[str, ...]
    redacts: str | None
    version: RoomVersion
    pdu: dict[str, Any] = field(repr=False)

    @property
    def is_state(self) -> bool:
        return self.state_key is not None

    @property
    def key(self) -> tuple[str, str]:
        """``(type, state_key)``: where a state event sits in a room's state."""
        if self.state_key is None:
            raise ValueError(f"{self.event_id} is not a state event: it has no state key")
        return (self.type, self.state_key)

    @property
    def membership(self) -> Any:
        return self.content.get("membership")

    def __hash__(self) -> int:
        return hash(self.event_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and other.event_id == self.event_id


def _refs(value: object, name: str, pairs: bool) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise BadEventFormat(f"{name} must be a list")
    out = []
    for item in value:
        if pairs:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise BadEventFormat(f"{name} entries must be [event_id, hashes] pairs")
            out.append(item[0])
        else:
            if not isinstance(item, str):
                raise BadEventFormat(f"{name} entries must be event ID strings")
            out.append(item)
    return tuple(out)


def parse_pdu(pdu: dict[str, Any], version: RoomVersion, stored_id: str | None = None) -> Event:
    """Check ``pdu`` against ``version``'s event format and parse it.

    Raises :class:`BadEventFormat` with the reason; the content hash is not checked here
    (a mismatch means "redact", not "drop": see :func:`content_hash_matches`).

    ``stored_id``: the ID an event read back from storage was stored under. It was computed
    from these bytes and the format checked when the event was persisted, so neither is done
    again (the reference hash and the canonical-JSON walk were most of re-reading an auth
    event)."""
    if not isinstance(pdu, dict):
        raise BadEventFormat("an event must be a JSON object")
    for key in _REQUIRED:
        if key not in pdu:
            raise BadEventFormat(f"missing field {key!r}")
    etype, sender, content = pdu["type"], pdu["sender"], pdu["content"]
    if not isinstance(etype, str) or not isinstance(sender, str):
        raise BadEventFormat("type and sender must be strings")
    if not isinstance(content, dict):
        raise BadEventFormat("content must be an object")
    if not isinstance(pdu["hashes"], dict):
        raise BadEventFormat("hashes must be an object")
    depth, ts = pdu["depth"], pdu["origin_server_ts"]
    if type(depth) is not int or not 0 <= depth <= canonical_json.MAX_SAFE_INTEGER:
        raise BadEventFormat("depth must be an integer in [0, 2**53-1]")
    if type(ts) is not int:
        raise BadEventFormat("origin_server_ts must be an integer")
    state_key = pdu.get("state_key")
    if state_key is not None and not isinstance(state_key, str):
        raise BadEventFormat("state_key must be a string")
    if version.strict_canonical_json and stored_id is None:
        try:
            canonical_json.check_strict(pdu)
        except canonical_json.InvalidCanonicalJson as e:
            raise BadEventFormat(str(e)) from None
    if version.event_ids_are_hashes and "event_id" in pdu:
        raise BadEventFormat("room versions 3+ must not carry an event_id field")
    pairs = version.refs_are_pairs
    prev_ids = _refs(pdu["prev_events"], "prev_events", pairs)
    auth_ids = _refs(pdu["auth_events"], "auth_events", pairs)
    event_id = compute_event_id(pdu, version) if stored_id is None else stored_id
    is_create = etype == "m.room.create" and state_key == ""

    room_id = pdu.get("room_id")
    if version.room_id_from_create_event:
        if is_create:
            # a create event carrying a room_id still parses: auth rule 1 rejects it
            room_id = room_id_from_create_event_id(event_id)
        else:
            if not isinstance(room_id, str) or not room_id.startswith("!"):
                raise BadEventFormat("room_id must be a room ID")
            create_id = create_event_id_from_room_id(room_id)
            if create_id in auth_ids:
                raise BadEventFormat("v12 events must not list the create event in auth_events")
            auth_ids = auth_ids + (create_id,)
    elif not isinstance(room_id, str):
        raise BadEventFormat("missing field 'room_id'")

    redacts = pdu.get("redacts")
    if etype == "m.room.redaction" and version.redaction.value >= 11:
        # From v11 (MSC2174) ``redacts`` is read from the content only, as Synapse reads it:
        # a top-level one left over from the older format names nothing.
        redacts = content.get("redacts")
    if redacts is not None and not isinstance(redacts, str):
        redacts = None
    return Event(event_id=event_id, room_id=room_id, type=etype, state_key=state_key,
                 sender=sender, content=content, origin_server_ts=ts, depth=depth,
                 prev_event_ids=prev_ids, auth_event_ids=auth_ids, redacts=redacts,
                 version=version, pdu=pdu)

"""Incoming events: the exact bytes received, checked and parsed once.

The bytes are what is stored (``events.json``), so signatures stay valid; the parsed dict is
only used to fill the indexed columns. Anything the persist path cannot store correctly is a
:class:`BadEvent`, raised before a single row is written.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from rooms.matrix.event_format import BadEventFormat, content_hash_matches, parse_pdu
from rooms.matrix.event_format import Event as MatrixEvent
from rooms.matrix.room_versions import RoomVersion, UnknownRoomVersion, room_version

#: Depths outside [0, 2^53 - 1] are refused: a canonical JSON integer's range (Synapse's
#: ``event_from_pdu_json``, ``synapse/federation/federation_base.py``, refuses negative depths
#: and, from room v6, integers beyond it; docs/storage.md, "The persist path").
MAX_DEPTH = 2**53 - 1

MEMBER = "m.room.member"
HISTORY_VISIBILITY = "m.room.history_visibility"
REDACTION = "m.room.redaction"
CREATE = "m.room.create"

StateKey = tuple[str, str]
StateMap = dict[StateKey, str]


class RoomInfo(NamedTuple):
    """What the persist path must know of a room before it can even read an event of it."""

    version: RoomVersion | None  #: None: a version this store does not know
    #: the create event was a full PDU: events are parsed per version and authorized
    authorized: bool


#: body -> the RoomInfo of its room (None: not known yet)
RoomInfoLookup = Callable[[dict], "RoomInfo | None"]


def create_room_info(body: dict) -> RoomInfo:
    """A create event says its room's version (absent: "1"); a full PDU (``hashes`` and
    ``auth_events``) makes an authorized room."""
    content = body.get("content") if isinstance(body.get("content"), dict) else {}
    try:
        version = room_version(content.get("room_version", "1"))
    except (UnknownRoomVersion, TypeError):
        version = None
    return RoomInfo(version, "hashes" in body and "auth_events" in body)


def is_create(body: dict) -> bool:
    return body.get("type") == CREATE and body.get("state_key") == ""


class BadEvent(ValueError):
    """An event the store refuses; the whole ``persist_events`` call writes nothing."""

    def __init__(self, event_id: str | None, reason: str) -> None:
        self.event_id = event_id
        self.reason = reason
        super().__init__(f"event {event_id or '(no event_id)'}: {reason}")


@dataclass
class IncomingEvent:
    """An event to persist and how it arrived.

    ``state_before``: the room state before the event as sent by the remote server (a join
    over federation, backfill past the history we have); the event's prev_events then need not
    be known and a full snapshot is stored.
    """

    json: bytes | str
    outlier: bool = False
    rejected_reason: str | None = None
    state_before: Mapping[StateKey, str] | None = None


@dataclass
class ParsedEvent:
    raw: bytes
    body: dict[str, Any]
    event_id: str
    room_id: str
    type: str
    sender: str
    state_key: str | None
    prev_events: list[str]
    depth: int | None
    membership: str | None
    redacts: str | None
    relates_to: str | None
    outlier: bool
    rejected_reason: str | None
    state_before: StateMap | None
    # filled by the persist path
    stream_ordering: int = 0
    topological_ordering: int = 0
    state_group_before: int | None = None
    state_group_after: int | None = None
    redacted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    #: the Matrix core's view of the event (authorized rooms only)
    matrix: MatrixEvent | None = None
    room: RoomInfo | None = None

    @property
    def is_state(self) -> bool:
        return self.state_key is not None

    @property
    def key(self) -> tuple[int, int]:
        """The event's place in the room's history order."""
        return (self.topological_ordering, self.stream_ordering)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_incoming(item: IncomingEvent | bytes | str, rooms: RoomInfoLookup | None = None) -> ParsedEvent:
    """Check one incoming event and pull out its indexed fields.

    In an authorized room (``rooms`` says so) the event is a PDU of the room's version: its
    ID is computed (from v3 the reference hash, not a field), its format checked, and a
    content hash that does not match means the event is used redacted, as the spec says."""
    if not isinstance(item, IncomingEvent):
        item = IncomingEvent(item)
    raw = item.json.encode("utf-8") if isinstance(item.json, str) else bytes(item.json)
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadEvent(None, f"invalid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadEvent(None, "event JSON must be an object")
    info = create_room_info(body) if is_create(body) else (rooms(body) if rooms is not None else None)
    matrix = None
    if info is not None and info.authorized:
        if info.version is None:
            raise BadEvent(body.get("event_id") if isinstance(body.get("event_id"), str) else None,
                           "unknown room version")
        try:
            matrix = parse_pdu(body, info.version)
        except BadEventFormat as e:
            raise BadEvent(body.get("event_id") if isinstance(body.get("event_id"), str) else None,
                           f"not a valid room v{info.version.identifier} event: {e}") from None
        event_id = matrix.event_id
        if "room_id" not in body:  # v12 create events: the room ID is their hash
            body = dict(body, room_id=matrix.room_id)
    else:
        event_id = body.get("event_id")
        if not isinstance(event_id, str) or not event_id:
            if rooms is not None and "auth_events" in body and body.get("room_id") is not None:
                raise BadEvent(None, "no event_id, and the room's create event is not stored: "
                                     "persist it first")
            raise BadEvent(None, "missing or non-string 'event_id'")
    for name in ("room_id", "type", "sender"):
        if not isinstance(body.get(name), str) or not body[name]:
            raise BadEvent(event_id, f"missing or non-string {name!r}")
    content = body.get("content")
    if not isinstance(content, dict):
        raise BadEvent(event_id, "missing or non-object 'content'")
    state_key = body.get("state_key")
    if state_key is not None and not isinstance(state_key, str):
        raise BadEvent(event_id, "'state_key' must be a string")
    prev_raw = body.get("prev_events")
    if prev_raw is None:
        if not item.outlier:
            raise BadEvent(event_id, "missing 'prev_events'")
        prev_raw = []
    if not isinstance(prev_raw, list):
        raise BadEvent(event_id, "'prev_events' must be a list")
    prev_events = []
    for p in prev_raw:
        # room v1/v2 use [event_id, hashes] pairs, later versions bare IDs
        pid = p[0] if isinstance(p, list) and p else p
        if not isinstance(pid, str):
            raise BadEvent(event_id, f"bad prev_events entry {p!r}")
        prev_events.append(pid)
    if not prev_events and body["type"] != CREATE and not item.outlier and item.state_before is None:
        raise BadEvent(event_id, "only m.room.create may have no prev_events")
    depth = body.get("depth")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH):
        raise BadEvent(event_id, f"'depth' must be an integer in [0, 2^53-1], not {depth!r}")
    membership = None
    if body["type"] == MEMBER:
        if state_key is None:
            raise BadEvent(event_id, "m.room.member needs a state_key")
        membership = content.get("membership")
        if not isinstance(membership, str):
            raise BadEvent(event_id, "m.room.member needs a string content.membership")
    redacts = None
    if body["type"] == REDACTION:
        redacts = matrix.redacts if matrix is not None else body.get("redacts", content.get("redacts"))
        if not isinstance(redacts, str):
            raise BadEvent(event_id, "m.room.redaction needs 'redacts'")
    relates = content.get("m.relates_to")
    relates_to = relates.get("event_id") if isinstance(relates, dict) else None
    state_before = None
    if item.state_before is not None:
        state_before = {(str(t), str(k)): str(v) for (t, k), v in item.state_before.items()}
    ev = ParsedEvent(
        raw=raw, body=body, event_id=event_id, room_id=body["room_id"], type=body["type"],
        sender=body["sender"], state_key=state_key, prev_events=prev_events, depth=depth,
        membership=membership, redacts=redacts,
        relates_to=relates_to if isinstance(relates_to, str) else None,
        outlier=item.outlier, rejected_reason=item.rejected_reason, state_before=state_before,
        matrix=matrix, room=info,
    )
    if matrix is not None and not content_hash_matches(body):
        ev.redacted = True  # spec: a content hash mismatch -> the event is used redacted
    return ev


def parse_events(items: Sequence[IncomingEvent | bytes | str],
                 rooms: RoomInfoLookup | None = None) -> list[ParsedEvent]:
    """Parse a batch; duplicate event IDs inside it are an error. ``rooms`` finds a room's
    version (create events earlier in the batch are seen first)."""
    parsed = []
    created = getattr(rooms, "created", None)
    for item in items:
        ev = parse_incoming(item, rooms)
        if created is not None and ev.type == CREATE and ev.state_key == "":
            created(ev.room_id, ev.room)
        parsed.append(ev)
    seen: set[str] = set()
    for ev in parsed:
        if ev.event_id in seen:
            raise BadEvent(ev.event_id, "duplicate event_id in the batch")
        seen.add(ev.event_id)
    return parsed

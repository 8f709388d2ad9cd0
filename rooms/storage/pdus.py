"""Real PDUs for generated rooms, fast enough for a million events: what a homeserver sends
for a room of a given version -- ``auth_events`` selected from the room's state, content
hash, event ID per version (v1-2 an opaque ``$n:server``, v3+ the reference hash, v12 room
IDs from the create event) -- without the Matrix core's full bookkeeping
(``rooms.matrix.room_builder`` copies the state at every event; this keeps one current
state per room, and a copy only where a branch starts).

The caller (``generator.py``) only sends events that pass authorization against that state.
"""
from __future__ import annotations

import itertools
import json
from typing import Any

from rooms.matrix.event_format import compute_event_id, room_id_from_create_event_id, with_content_hash
from rooms.matrix.room_versions import RoomVersion

CREATE, PL, JR, MEMBER = ("m.room.create", ""), ("m.room.power_levels", ""), ("m.room.join_rules", ""), "m.room.member"

StateKey = tuple[str, str]

#: how many of its latest events' depths a room remembers: a new event's prev_events are the
#: tip or an event made just before it (a fork's branch), never an old one. Keeping every
#: event's depth cost ~170 bytes an event (1.7 GB at 10 M events).
KEEP_DEPTHS = 8


class PduRoom:
    """Builds one room's events; ``state`` is the state after ``last`` (the room's tip)."""

    def __init__(self, version: RoomVersion, room_id: str, *, server: str = "localhost",
                 ts: int = 1_700_000_000_000, counter: Any = None, id_prefix: str = "") -> None:
        self.version = version
        self.room_id: str | None = None if version.room_id_from_create_event else room_id
        self.server = server
        self.ts = ts
        self.counter = counter if counter is not None else itertools.count(1)
        self.id_prefix = id_prefix
        self.state: dict[StateKey, str] = {}
        self.last: str | None = None
        self.depth = 0
        #: the depths of the room's latest :data:`KEEP_DEPTHS` events (oldest first)
        self.depths: dict[str, int] = {}

    def _auth_events(self, etype: str, sender: str, state_key: str | None, content: dict,
                     state: dict[StateKey, str]) -> list[str]:
        keys = [PL, (MEMBER, sender)]
        if not self.version.room_id_from_create_event:
            keys.insert(0, CREATE)
        if etype == MEMBER:
            keys.append((MEMBER, state_key))
            if content.get("membership") in ("join", "invite", "knock"):
                keys.append(JR)
        return list(dict.fromkeys(state[k] for k in keys if k in state))

    def event(self, type: str, sender: str, content: dict[str, Any], *, state_key: str | None = None,
              prev: list[str] | None = None, state: dict[StateKey, str] | None = None,
              extra: dict[str, Any] | None = None, advance: bool = True) -> tuple[str, bytes]:
        """(event_id, JSON bytes) of a new event on ``prev`` (default: the tip) whose state
        before is ``state`` (default: the tip's)."""
        if prev is None:
            prev = [self.last] if self.last else []
        before = self.state if state is None else state
        try:
            depth = max((self.depths[p] for p in prev), default=0) + 1
        except KeyError as e:
            raise ValueError(f"prev event {e.args[0]} is not among the room's latest {KEEP_DEPTHS} events "
                             "(PduRoom remembers only their depths)") from None
        self.ts += 1
        pairs = self.version.refs_are_pairs
        pdu: dict[str, Any] = {
            "type": type, "sender": sender, "content": content, "depth": depth, "origin_server_ts": self.ts,
            "prev_events": [[p, {}] for p in prev] if pairs else list(prev),
            "auth_events": [], "origin": self.server,
        }
        if state_key is not None:
            pdu["state_key"] = state_key
        is_create = type == "m.room.create" and state_key == ""
        if not (is_create and self.version.room_id_from_create_event):
            pdu["room_id"] = self.room_id
        if extra:
            pdu.update(extra)
        if not is_create:
            auth = self._auth_events(type, sender, state_key, content, before)
            pdu["auth_events"] = [[a, {}] for a in auth] if pairs else auth
        if not self.version.event_ids_are_hashes:
            pdu["event_id"] = f"${self.id_prefix}{next(self.counter)}:{self.server}"
        pdu = with_content_hash(pdu)
        event_id = pdu["event_id"] if "event_id" in pdu else compute_event_id(pdu, self.version)
        if is_create and self.version.room_id_from_create_event:
            self.room_id = room_id_from_create_event_id(event_id)
        self.depths[event_id] = depth
        if len(self.depths) > KEEP_DEPTHS:
            del self.depths[next(iter(self.depths))]
        if advance:
            if state_key is not None and state is None:
                self.state[(type, state_key)] = event_id
            self.last, self.depth = event_id, depth
        return event_id, json.dumps(pdu, separators=(",", ":"), ensure_ascii=False).encode()

    # -- the events the generator sends ---------------------------------------------------------

    def create(self, creator: str, *, name: str | None = None) -> tuple[str, bytes]:
        """``name`` (a content key) tells apart create events that would otherwise be equal:
        a v12 room's ID is its create event's hash."""
        content: dict[str, Any] = {"room_version": self.version.identifier}
        if name is not None:
            content["org.synapse_repl.generated_as"] = name
        if not self.version.implicit_room_creator:
            content["creator"] = creator
        return self.event("m.room.create", creator, content, state_key="")

    def power_levels(self, sender: str, users: dict[str, int]) -> tuple[str, bytes]:
        if self.version.creators_have_infinite_power:  # v12: creators may not be listed
            users = {u: v for u, v in users.items() if u != sender}
        return self.event("m.room.power_levels", sender, {"users": users, "users_default": 0}, state_key="")

    def join_rules(self, sender: str, rule: str) -> tuple[str, bytes]:
        return self.event("m.room.join_rules", sender, {"join_rule": rule}, state_key="")

    def member(self, user: str, membership: str, *, sender: str | None = None) -> tuple[str, bytes]:
        return self.event(MEMBER, sender or user, {"membership": membership}, state_key=user)

    def visibility(self, sender: str, value: str) -> tuple[str, bytes]:
        return self.event("m.room.history_visibility", sender, {"history_visibility": value}, state_key="")

    def message(self, sender: str, body: str, **kw: Any) -> tuple[str, bytes]:
        return self.event("m.room.message", sender, {"msgtype": "m.text", "body": body}, **kw)

    def redact(self, sender: str, target: str) -> tuple[str, bytes]:
        if self.version.redaction.value >= 11:  # MSC2174: redacts lives in the content
            return self.event("m.room.redaction", sender, {"reason": "spam", "redacts": target})
        return self.event("m.room.redaction", sender, {"reason": "spam"}, extra={"redacts": target})

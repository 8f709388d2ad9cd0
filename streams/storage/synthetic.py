"""Event JSON for synthetic rooms (tests, ``generate_rooms``, benchmarks): a room as one
server would build it, each event on top of the previous one unless told otherwise."""
from __future__ import annotations

import itertools
import json
from typing import Any

_COUNTER = itertools.count(1)


class RoomBuilder:
    def __init__(self, room_id: str, *, server: str = "localhost", ts: int = 1_700_000_000_000,
                 id_prefix: str = "", counter: Any = None) -> None:
        self.room_id = room_id
        self.id_prefix = id_prefix
        self.counter = counter if counter is not None else _COUNTER
        self.server = server
        self.ts = ts
        self.last: str | None = None
        self.depth = 0
        self.depths: dict[str, int] = {}

    def event(self, type: str, sender: str, content: dict[str, Any], *, state_key: str | None = None,
              prev: list[str] | None = None, depth: int | None = None, extra: dict[str, Any] | None = None,
              advance: bool = True) -> tuple[str, bytes]:
        """(event_id, JSON bytes) of a new event; by default on top of the last one."""
        event_id = f"${self.id_prefix}{next(self.counter)}:{self.server}"
        if prev is None:
            prev = [self.last] if self.last else []
        if depth is None:
            depth = max((self.depths.get(p, self.depth) for p in prev), default=0) + 1
        self.ts += 1
        body: dict[str, Any] = {
            "event_id": event_id, "room_id": self.room_id, "type": type, "sender": sender,
            "content": content, "prev_events": prev, "depth": depth, "origin_server_ts": self.ts,
        }
        if state_key is not None:
            body["state_key"] = state_key
        if extra:
            body.update(extra)
        self.depths[event_id] = depth
        if advance:
            self.last, self.depth = event_id, depth
        return event_id, json.dumps(body, separators=(",", ":")).encode()

    def create(self, creator: str) -> tuple[str, bytes]:
        return self.event("m.room.create", creator, {"creator": creator, "room_version": "10"}, state_key="")

    def member(self, user: str, membership: str, *, sender: str | None = None) -> tuple[str, bytes]:
        return self.event("m.room.member", sender or user, {"membership": membership}, state_key=user)

    def visibility(self, sender: str, value: str) -> tuple[str, bytes]:
        return self.event("m.room.history_visibility", sender, {"history_visibility": value}, state_key="")

    def message(self, sender: str, body: str) -> tuple[str, bytes]:
        return self.event("m.room.message", sender, {"msgtype": "m.text", "body": body})

    def redact(self, sender: str, target: str) -> tuple[str, bytes]:
        return self.event("m.room.redaction", sender, {"reason": "spam"}, extra={"redacts": target})

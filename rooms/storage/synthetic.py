"""Event JSON for synthetic rooms (tests, ``generate_rooms``, benchmarks): a room as one
server would build it, each event on top of the previous one unless told otherwise."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from rooms.matrix.event_format import compute_event_id, with_content_hash
from rooms.matrix.room_versions import room_version
from rooms.models import CurrentStateEvent, Event, ForwardExtremity
from rooms.storage import persist_events
from streams.runtime import runtime as process_runtime

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


# -- live rooms: coherent, authorized traffic through the persist path -------------------------

#: The version of the rooms :class:`LiveRooms` creates. Version 2: its PDUs carry their
#: ``event_id`` (from v3 the ID is a hash and the field is refused), which every version of
#: the store's parser reads; its rules (auth, state resolution v2) are today's.
LIVE_ROOM_VERSION = "2"
_CREATE, _POWER, _JOIN_RULES = ("m.room.create", ""), ("m.room.power_levels", ""), ("m.room.join_rules", "")


MEMBER_TYPE = "m.room.member"


@dataclass
class LiveRoom:
    """What the next event of a room needs: its state (``(type, state_key) -> event ID``),
    each user's membership, its forward extremities and the highest depth among them."""

    room_id: str
    state: dict[tuple[str, str], str] = field(default_factory=dict)
    membership: dict[str, str] = field(default_factory=dict)
    extremities: list[str] = field(default_factory=list)
    depth: int = 0

    def members(self) -> list[str]:
        return sorted(u for u, m in self.membership.items() if m == "join")


class LiveRooms:
    """Room traffic an operator could have produced, for the demo and ``write_facts events``.

    A fixed set of rooms (``!<prefix><i>:<server>``), continued from what the store holds: a
    room starts with its create event, the creator's join, power levels and public join rules;
    then users join, send messages and now and then leave. Each event's ``prev_events`` are the
    room's forward extremities as stored, its depth one more than theirs, its ``auth_events``
    the create event, power levels, the sender's membership (and for a join the join rules),
    taken from the room's current state; a content hash, room version :data:`LIVE_ROOM_VERSION`.
    So every event passes the Matrix authorization rules and the batch jobs recompute exactly
    what the persist path stored.

    :meth:`plan` is pure (rooms in, events out); :meth:`write` loads the rooms, plans and
    persists in one ``persist_events`` transaction.
    """

    def __init__(self, prefix: str, *, rooms: int = 8, users: int = 40, server: str = "localhost",
                 rng: Any = None, clock: Any = None) -> None:
        import random
        import time

        if rooms < 1 or users < 2:
            raise ValueError("need at least 1 room and 2 users")
        self.room_ids = [f"!{prefix}{i}:{server}" for i in range(rooms)]
        self.users = [f"@{prefix}user{i}:{server}" for i in range(users)]
        self.rng = rng or random.Random()
        self.clock = clock or (lambda: int(time.time() * 1000))

    # -- pure --------------------------------------------------------------------------------

    def creator(self, room_id: str) -> str:
        return self.users[self.room_ids.index(room_id) % len(self.users)]

    def plan(self, rooms: dict[str, LiveRoom], count: int) -> list[bytes]:
        """``count`` events spread over ``rooms`` (changed in place to after them)."""
        out = []
        for _ in range(count):
            room = rooms[self.rng.choice(sorted(rooms))]
            out.append(self._next(room))
        return out

    def _next(self, room: LiveRoom) -> bytes:
        rng, creator = self.rng, self.creator(room.room_id)
        if _CREATE not in room.state:
            return self._send(room, creator, "m.room.create", {"creator": creator, "room_version": LIVE_ROOM_VERSION}, "")
        if room.membership.get(creator) != "join" and len(room.state) == 1:
            return self._send(room, creator, MEMBER_TYPE, {"membership": "join"}, creator)
        if _POWER not in room.state:
            return self._send(room, creator, "m.room.power_levels", {
                "users": {creator: 100}, "users_default": 0, "events_default": 0, "state_default": 50,
                "ban": 50, "kick": 50, "redact": 50, "invite": 0}, "")
        if _JOIN_RULES not in room.state:
            return self._send(room, creator, "m.room.join_rules", {"join_rule": "public"}, "")
        members = room.members()
        outsiders = [u for u in self.users if room.membership.get(u) != "join"]
        r = rng.random()
        if outsiders and (len(members) < 3 or r < 0.2):
            user = rng.choice(outsiders)
            return self._send(room, user, MEMBER_TYPE, {"membership": "join"}, user)
        leavers = [u for u in members if u != creator]
        if leavers and r < 0.25:
            user = rng.choice(leavers)
            return self._send(room, user, MEMBER_TYPE, {"membership": "leave"}, user)
        sender = rng.choice(members)
        return self._send(room, sender, "m.room.message",
                          {"msgtype": "m.text", "body": "hello " + "x" * rng.randrange(10, 80)}, None)

    def _send(self, room: LiveRoom, sender: str, type: str, content: dict[str, Any], state_key: str | None) -> bytes:
        version = room_version(LIVE_ROOM_VERSION)
        keys = [] if type == "m.room.create" else [_CREATE, _POWER, (MEMBER_TYPE, sender)]
        if type == MEMBER_TYPE and content.get("membership") == "join":
            keys += [_JOIN_RULES, (MEMBER_TYPE, state_key)]
        auth = sorted({room.state[k] for k in keys if k in room.state})
        prev = list(room.extremities)
        if version.refs_are_pairs:  # v1-2: [event ID, hashes] pairs
            prev, auth = [[e, {}] for e in prev], [[e, {}] for e in auth]
        pdu: dict[str, Any] = {
            "room_id": room.room_id, "type": type, "sender": sender, "content": content,
            "prev_events": prev, "auth_events": auth, "depth": room.depth + 1,
            "origin_server_ts": self.clock(),
        }
        if state_key is not None:
            pdu["state_key"] = state_key
        if not version.event_ids_are_hashes:  # v1-2: the sender names it
            pdu["event_id"] = f"${self.rng.getrandbits(128):032x}:{room.room_id.partition(':')[2]}"
        pdu = with_content_hash(pdu)
        event_id = compute_event_id(pdu, version)
        room.extremities, room.depth = [event_id], room.depth + 1
        if state_key is not None:
            room.state[(type, state_key)] = event_id
            if type == MEMBER_TYPE:
                room.membership[state_key] = content["membership"]
        return stored_json(pdu, event_id)

    # -- against the store -------------------------------------------------------------------

    def load(self, room_ids: list[str], using: str = "default") -> dict[str, LiveRoom]:
        """The rooms as stored: current state, forward extremities and their depth."""
        from django.db.models import Max

        rooms = {r: LiveRoom(r) for r in room_ids}
        for row in CurrentStateEvent.objects.using(using).filter(room_id__in=room_ids).values(
                "room_id", "type", "state_key", "event_id", "membership"):
            room = rooms[row["room_id"]]
            room.state[(row["type"], row["state_key"])] = row["event_id"]
            if row["type"] == MEMBER_TYPE:
                room.membership[row["state_key"]] = row["membership"]
        for room_id, event_id in ForwardExtremity.objects.using(using).filter(room_id__in=room_ids).values_list(
                "room_id", "event_id"):
            rooms[room_id].extremities.append(event_id)
        ext = [e for r in rooms.values() for e in r.extremities]
        for row in Event.objects.using(using).filter(event_id__in=ext).values("room_id").annotate(d=Max("depth")):
            rooms[row["room_id"]].depth = row["d"]
        for room in rooms.values():
            room.extremities.sort()
        return rooms

    def write(self, count: int, *, runtime: Any = None, rooms: list[str] | None = None) -> list:
        """Persist ``count`` events (one transaction) into ``rooms`` (default: all)."""

        if runtime is None:

            runtime = process_runtime()
        loaded = self.load(rooms or self.room_ids, runtime.using)
        return persist_events(self.plan(loaded, count), runtime=runtime)


def stored_json(pdu: dict[str, Any], event_id: str) -> bytes:
    """The bytes handed to ``persist_events``: the PDU; a v3+ PDU (whose ID is its hash, not a
    field) with ``event_id`` added, for a store whose parser reads the ID from the JSON."""
    body = pdu if "event_id" in pdu else dict(pdu, event_id=event_id)
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

"""A realistic synthetic homeserver history, as batches for ``persist_events``.

Shape: a few very large rooms with heavy join/leave churn (the case where state copies
explode), many small rooms, all four history visibilities (some changing mid-life), invites,
redactions, bans, power-level changes, forks that merge again, and rooms joined over
federation whose older history is backfilled at the end (state arrives as outliers, old
messages get negative stream orderings). Every event is a real PDU of its room's version
(rooms cycle through versions 1-12: IDs per version, content hashes, auth events; see
``pdus.py``) and passes authorization. Deterministic for a seed; live traffic interleaves
rooms as a server sees it.
"""
from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS, StateResAlgorithm
from rooms.storage.incoming_events import IncomingEvent
from rooms.storage.pdus import PduRoom

#: the room versions rooms cycle through (the big rooms get the first ones). The first is not
#: 12: a v12 room's ID is its create event's hash, and ``generate_rooms`` recognises an
#: already generated seed by the first room's ID.
ROOM_VERSIONS = ("11", "12", "10", "9", "8", "7", "6", "5", "4", "3", "2", "1")

VISIBILITIES = ("shared", "joined", "invited", "world_readable")
VIS_WEIGHTS = (50, 20, 15, 15)


@dataclass
class Batch:
    items: list
    backfill: bool = False
    #: the room of each item, as the generator named it (a v12 room's real ID is its create
    #: event's hash): what a router of rooms to event writers shards by
    rooms: list[str] = field(default_factory=list)


class _Members:
    """A set with O(1) random choice (big rooms have thousands of members)."""

    def __init__(self) -> None:
        self._list: list[str] = []
        self._pos: dict[str, int] = {}

    def add(self, u: str) -> None:
        if u not in self._pos:
            self._pos[u] = len(self._list)
            self._list.append(u)

    def discard(self, u: str) -> None:
        i = self._pos.pop(u, None)
        if i is not None:
            last = self._list.pop()
            if i < len(self._list):
                self._list[i] = last
                self._pos[last] = i

    def choice(self, rng: random.Random) -> str:
        return self._list[rng.randrange(len(self._list))]

    def __contains__(self, u: object) -> bool:
        return u in self._pos

    def __len__(self) -> int:
        return len(self._list)


@dataclass
class _Room:
    builder: PduRoom
    big: bool
    creator: str
    members: _Members = field(default_factory=_Members)
    invited: set[str] = field(default_factory=set)
    banned: set[str] = field(default_factory=set)
    name: str = ""  #: the ID chosen for the room (a v12 room's real ID is its create's hash)
    recent: deque = field(default_factory=lambda: deque(maxlen=50))
    vis: str = "shared"


class RoomGenerator:
    def __init__(self, *, rooms: int, users: int, events: int, seed: int, batch: int = 500,
                 backfill_fraction: float = 0.05, server: str = "localhost",
                 versions: tuple[str, ...] = ROOM_VERSIONS) -> None:
        if rooms < 1 or users < 2 or events < 1:
            raise ValueError("need at least 1 room, 2 users and 1 event")
        self.rng = random.Random(seed)
        self.n_rooms, self.n_users, self.budget, self.batch = rooms, users, events, batch
        self.backfill_fraction = backfill_fraction
        self.server = server
        self.versions = [KNOWN_ROOM_VERSIONS[v] for v in versions]
        self.prefix = f"g{seed}_"
        self.users = [f"@user{i}:{server}" for i in range(users)]
        self.counter = itertools.count(1)
        self.emitted = 0
        self.backfill_queue: list[tuple[str, list[IncomingEvent]]] = []

    def room_ids(self) -> list[str]:
        """The room IDs chosen for the rooms (a v12 room's real ID is its create event's
        hash, known once generated: ``rooms`` then holds it instead)."""
        return [f"!{self.prefix}room{i}:{self.server}" for i in range(self.n_rooms)]

    # -- the history --------------------------------------------------------------------------

    def batches(self) -> Iterator[Batch]:
        rng = self.rng
        n_big = 1 if self.n_rooms < 3 else min(5, max(1, self.n_rooms // 100))
        # a few accounts (bots, admins, heavy users) are in ~150 rooms each: initial sync's hard case
        self.power_users = self.users[:max(1, self.n_users // 100)]
        self.power_share = min(1.0, 150 / max(1, self.n_rooms - n_big))
        rooms: list[_Room] = []
        pending: list = []
        pending_rooms: list[str] = []
        for i, room_id in enumerate(self.room_ids()):
            big = i < n_big
            creator = self.users[rng.randrange(self.n_users)]
            b = PduRoom(self.versions[i % len(self.versions)], room_id, server=self.server,
                        id_prefix=self.prefix, counter=self.counter)
            room = _Room(b, big, creator, vis=rng.choices(VISIBILITIES, VIS_WEIGHTS)[0], name=room_id)
            rooms.append(room)
            n_members = min(self.n_users, 200 if big else rng.randint(2, 8))
            every = max(1, round(1 / self.backfill_fraction)) if self.backfill_fraction > 0 else 0
            # a federated join needs someone not in the room yet to join (tiny user counts:
            # a normal room, not a history whose live part would hang off unfetched events)
            federated = (not big and every > 0 and (i - n_big) % every == 0
                         and n_members + 1 < self.n_users)
            for item in (self._federated_start(room, n_members) if federated else self._start(room, n_members)):
                pending.append(item)
                pending_rooms.append(room.name)
                if len(pending) >= self.batch:
                    yield Batch(pending, rooms=pending_rooms)
                    pending, pending_rooms = [], []
        weights = [(0.4 / n_big) if r.big else (0.6 / max(1, self.n_rooms - n_big)) for r in rooms]
        cum = list(itertools.accumulate(weights))
        while self.emitted < self.budget:
            room = rng.choices(rooms, cum_weights=cum)[0]
            step = self._step(room)
            if isinstance(step, list):
                pending.extend(step)
                pending_rooms.extend([room.name] * len(step))
            else:
                pending.append(step)
                pending_rooms.append(room.name)
            if len(pending) >= self.batch:
                yield Batch(pending, rooms=pending_rooms)
                pending, pending_rooms = [], []
        if pending:
            yield Batch(pending, rooms=pending_rooms)
        for name, chunk in self.backfill_queue:
            for i in range(0, len(chunk), self.batch):
                part = chunk[i:i + self.batch]
                yield Batch(part, backfill=True, rooms=[name] * len(part))

    def _emit(self, ev: tuple[str, bytes]) -> bytes:
        self.emitted += 1
        return ev[1]

    def _start(self, room: _Room, n_members: int) -> list:
        b, rng = room.builder, self.rng
        out = [self._emit(b.create(room.creator, name=room.name)), self._emit(b.member(room.creator, "join")),
               self._emit(b.power_levels(room.creator, {room.creator: 100})),
               self._emit(b.join_rules(room.creator, "public")),
               self._emit(b.visibility(room.creator, room.vis))]
        room.members.add(room.creator)
        extra = [u for u in self.power_users if rng.random() < self.power_share] if not room.big else []
        for u in rng.sample(self.users, n_members) + extra:
            if u not in room.members:
                out.append(self._emit(b.member(u, "join")))
                room.members.add(u)
        return out

    def _federated_start(self, room: _Room, n_members: int) -> list:
        """A room created elsewhere: its state reaches us as outliers with our join, its older
        messages come later by backfill (oldest chunk first, each message on the one before)."""
        b, rng = room.builder, self.rng
        state: dict[tuple[str, str], str] = {}
        outliers: list[IncomingEvent] = []

        def state_event(ev: tuple[str, bytes], key: tuple[str, str]) -> None:
            state[key] = ev[0]
            outliers.append(IncomingEvent(self._emit(ev), outlier=True))

        state_event(b.create(room.creator, name=room.name), ("m.room.create", ""))
        state_event(b.member(room.creator, "join"), ("m.room.member", room.creator))
        state_event(b.power_levels(room.creator, {room.creator: 100}), ("m.room.power_levels", ""))
        state_event(b.join_rules(room.creator, "public"), ("m.room.join_rules", ""))
        state_event(b.visibility(room.creator, room.vis), ("m.room.history_visibility", ""))
        room.members.add(room.creator)
        for u in rng.sample(self.users, n_members):
            if u not in room.members:
                state_event(b.member(u, "join"), ("m.room.member", u))
                room.members.add(u)
        old: list[IncomingEvent] = []
        for i in range(rng.randint(10, 40)):
            ev = b.message(room.members.choice(rng), f"old message {i}")
            old.append(IncomingEvent(self._emit(ev), state_before=dict(state) if i == 0 else None))
        self.backfill_queue.append((room.name, old))
        joiner = next(u for u in self.users if u not in room.members)
        join = b.member(joiner, "join")
        room.members.add(joiner)
        return outliers + [IncomingEvent(self._emit(join), state_before=dict(state))]

    def _step(self, room: _Room) -> bytes | list:
        b, rng = room.builder, self.rng
        r = rng.random()
        churn = 0.30 if room.big else 0.05
        if r < churn:
            outsiders = room.invited or None
            if rng.random() < 0.5 or len(room.members) <= 2:
                candidate = (rng.choice(sorted(outsiders)) if outsiders and rng.random() < 0.5
                             else self.users[rng.randrange(self.n_users)])
                if candidate not in room.members and candidate not in room.banned:
                    room.members.add(candidate)
                    room.invited.discard(candidate)
                    return self._emit(b.member(candidate, "join"))
            leaver = room.members.choice(rng)
            if leaver != room.creator:
                room.members.discard(leaver)
                return self._emit(b.member(leaver, "leave"))
        elif r < churn + 0.02:
            target = self.users[rng.randrange(self.n_users)]
            if target not in room.members and target not in room.invited and target not in room.banned:
                room.invited.add(target)
                return self._emit(b.member(target, "invite", sender=room.creator))
        elif r < churn + 0.04 and room.recent:
            target = room.recent.popleft()
            return self._emit(b.redact(room.creator, target))
        elif r < churn + 0.043:
            room.vis = rng.choices(VISIBILITIES, VIS_WEIGHTS)[0]
            return self._emit(b.visibility(room.creator, room.vis))
        elif r < churn + 0.046 and len(room.members) > 2:
            target = room.members.choice(rng)
            if target != room.creator:  # the creator (level 100) bans a member
                room.members.discard(target)
                room.invited.discard(target)
                room.banned.add(target)
                return self._emit(b.member(target, "ban", sender=room.creator))
        elif r < churn + 0.049:
            mod = room.members.choice(rng)  # a moderator now (level 50)
            if mod != room.creator:
                return self._emit(b.power_levels(room.creator, {room.creator: 100, mod: 50}))
        elif r < churn + 0.055 and len(room.members) > 1 and \
                room.builder.version.state_res is not StateResAlgorithm.V1:
            return self._fork(room)
        sender = room.creator if rng.random() < 0.2 else room.members.choice(rng)
        ev = b.message(sender, "message " + "x" * rng.randrange(10, 120))
        room.recent.append(ev[0])
        return self._emit(ev)

    def _fork(self, room: _Room) -> list:
        """Two branches from the tip -- the creator changes the history visibility on one, a
        member chats on the other -- and a merge. The later visibility event wins the
        resolution (same power-levels epoch: by timestamp), so the tip's state stays known."""
        b, rng = room.builder, self.rng
        tip, before = b.last, dict(b.state)
        vis = rng.choices(VISIBILITIES, VIS_WEIGHTS)[0]
        hv_id, hv = b.event("m.room.history_visibility", room.creator, {"history_visibility": vis}, state_key="",
                            prev=[tip], state=before, advance=False)
        chat = b.message(room.members.choice(rng), "on the other branch")
        b.state[("m.room.history_visibility", "")] = hv_id
        room.vis = vis
        merge = b.message(room.creator, "merged", prev=[chat[0], hv_id])
        return [self._emit((hv_id, hv)), self._emit(chat), self._emit(merge)]

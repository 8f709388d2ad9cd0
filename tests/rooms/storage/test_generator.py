"""The generator's output is fixed by its seed: the memory diet (each room remembers only its
latest events' depths) changed no byte of it."""
from __future__ import annotations

import hashlib

import pytest

from rooms.storage.generator import RoomGenerator
from rooms.storage.incoming_events import IncomingEvent
from rooms.storage.pdus import KEEP_DEPTHS, PduRoom


def digest(gen: RoomGenerator, limit: int) -> str:
    """Every item's bytes and how it arrives (outlier, state sent with it, backfill)."""
    h = hashlib.sha256()
    n = 0
    for b in gen.batches():
        h.update(b"B%d|" % b.backfill)
        for item in b.items:
            if isinstance(item, IncomingEvent):
                h.update(b"I%d|" % item.outlier)
                h.update(repr(sorted((item.state_before or {}).items())).encode())
                item = item.json
            h.update(item)
            h.update(b"\n")
            n += 1
            if n >= limit:
                return h.hexdigest()
    return h.hexdigest()


def test_the_same_seed_gives_the_same_bytes_as_before_the_memory_diet():
    """Digests computed with the generator that kept every event's depth (commit 8b4ff0e): a
    small history with every feature (forks, redactions, backfill, all room versions), and the
    first events of bench_storage's 10 M dataset."""
    small = RoomGenerator(rooms=40, users=60, events=6000, seed=7, batch=200)
    assert digest(small, 10**9) == "3bb4eafb516e4a54c7fd417a0db32099e360f0e53c277c82b6b5d0beb6af811f"
    ten_million = RoomGenerator(rooms=100_000, users=200_000, events=10_000_000, seed=1)
    assert digest(ten_million, 3000) == "00f0a766bfc602ad10e24d1e4e8003d69608ce437efafb9e2eaf70113f176b3b"


def test_a_room_remembers_only_its_latest_depths():
    from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS

    room = PduRoom(KNOWN_ROOM_VERSIONS["11"], "!r:localhost")
    room.create("@a:localhost")
    first = room.member("@a:localhost", "join")[0]
    for i in range(KEEP_DEPTHS):
        room.message("@a:localhost", f"m{i}")
    assert len(room.depths) == KEEP_DEPTHS and first not in room.depths
    with pytest.raises(ValueError, match="not among the room's latest"):
        room.message("@a:localhost", "on an old event", prev=[first])
    assert room.depth == KEEP_DEPTHS + 2

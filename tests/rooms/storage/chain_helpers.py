"""Rooms stored with their chain cover index, as the persist path will store them: the
events' rows, then ``index_events`` in the same transaction (shared by the storage and job
tests)."""
from __future__ import annotations

import json
import random

from django.db import transaction

from rooms.storage.chain_index_store import chain_event, index_events
from rooms.storage.sql import insert_rows, store_cursor
from tests.rooms.matrix.test_generated_rooms import play, start_room
from tests.rooms.storage.helpers import rows

_stream = iter(range(1, 10**9))


def store(events, room_id=None):
    """Insert ``events`` (PDU dicts with their IDs) as the persist path would, then index them
    in the same transaction."""
    with transaction.atomic(), store_cursor() as cursor:
        insert_rows(cursor, "events", (
            "stream_ordering", "topological_ordering", "depth", "event_id", "room_id", "type", "state_key",
            "sender", "rejected", "outlier", "received_ts", "json", "redacted", "instance_name"),
            ("bigint", "bigint", "bigint", "text", "text", "text", "text", "text", "boolean", "boolean",
             "bigint", "bytea", "boolean", "text"),
            [(next(_stream), 1, 1, e, room_id or pdu.get("room_id") or "!" + e[1:], pdu["type"],
              pdu.get("state_key"), pdu["sender"], False, False, 0, json.dumps(pdu).encode(), False, "master")
             for e, pdu in events])
        return index_events(cursor, [
            chain_event(e, room_id or pdu.get("room_id") or "!" + e[1:], pdu["type"], pdu.get("state_key"), pdu)
            for e, pdu in events])


def stored_rows():
    positions = rows("SELECT event_id, chain_id, sequence_number FROM event_auth_chains")
    links = rows("SELECT origin_chain_id, origin_sequence_number, target_chain_id, target_sequence_number "
                 "FROM event_auth_chain_links")
    return positions, links


def generated_room(version_id, seed, n=60):
    """A generated room (test_generated_rooms' actions, drawn from ``seed``) whose room ID and
    event IDs are its own: rooms of one version would otherwise share their first events."""
    rng = random.Random(seed)
    room = start_room(version_id, room_id=f"!r{seed}:s1")
    actions = []
    kinds = ["topic", "power_levels", "ban", "kick", "join", "leave", "invite", "join_rules", "message", "name"]
    for _ in range(n):
        actions.append((rng.choice(kinds), rng.randrange(5), rng.randrange(5),
                        rng.choice(["extend", "fork", "merge", "merge"]), rng.randrange(1000),
                        [(rng.randrange(5), rng.choice([0, 25, 50, 75, 100])) for _ in range(rng.randrange(3))]))
    play(room, actions)
    return room




def store_room(room, seed=7):
    """All of ``room``'s events in stream order, in batches of random sizes."""
    events = [(e, room.events[e].pdu) for e in room.order]
    rng = random.Random(seed)
    i = 0
    while i < len(events):
        size = rng.choice([1, 2, 5, 17])
        store(events[i:i + size], room.room_id)
        i += size

"""The stored chain cover index, on PostgreSQL and SQLite: generated rooms stored in batches of
any size and indexed batch by batch inside the storing transaction give exactly the index the
pure algorithm builds from all events at once; waiting events are placed when their auth
events come; chain IDs never clash."""
from __future__ import annotations

import pytest
from django.db import transaction

from rooms.matrix.chain_index import build, canonical
from rooms.matrix.state_res import auth_difference
from rooms.storage.chain_index_store import chain_event, index_events, load_room, reset_chain_id_sequence
from rooms.storage.sql import store_cursor
from tests.rooms.storage.chain_helpers import generated_room, store, store_room, stored_rows
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, rows

pytestmark = ON_BOTH_DATABASES

@pytest.mark.parametrize("version_id", ["10", "12"])
def test_batches_give_the_index_built_at_once(default_database, version_id):
    room = generated_room(version_id, seed=int(version_id))
    store_room(room)
    state = [room.events[e] for e in room.order if room.events[e].is_state]
    from rooms.matrix.chain_index import IndexEvent

    expected = build(IndexEvent(e.event_id, e.type, e.state_key, e.auth_event_ids) for e in state)
    positions, links = stored_rows()
    assert len(positions) == len(state) and not rows("SELECT * FROM event_auth_chain_to_calculate")
    assert canonical(positions, links) == canonical(
        [(e, c, s) for e, (c, s) in expected.positions.items()],
        [(oc, o, tc, t) for oc, d in expected.links.items() for tc, ps in d.items() for o, t in ps])
    with store_cursor() as cursor:
        loaded = load_room(cursor, room.room_id)
    order = room.order
    for i in range(0, len(order), 3):
        sets = [set(room.state_after[order[i]].values()), set(room.state_after[order[(i * 7 + 3) % len(order)]].values())]
        assert loaded.auth_difference(sets) == auth_difference(sets, room.events)


def test_waiting_events_are_placed_when_their_auth_events_come(default_database):
    room = "!w:s1"

    def pdu(t, sk, *auth):
        return {"type": t, "state_key": sk, "sender": "@a:s1", "room_id": room, "auth_events": list(auth),
                "content": {}}

    added = store([("$C", pdu("m.room.create", "")), ("$M", pdu("m.room.member", "@m:s2", "$C", "$X")),
                   ("$N", pdu("m.room.member", "@n:s2", "$C", "$M"))])
    assert [p[0] for p in added.positions] == ["$C"] and added.pending == ["$M", "$N"]
    assert sorted(rows("SELECT event_id, room_id, type, state_key FROM event_auth_chain_to_calculate")) == [
        ("$M", room, "m.room.member", "@m:s2"), ("$N", room, "m.room.member", "@n:s2")]
    store([("$T", {"type": "m.room.message", "sender": "@a:s1", "room_id": room, "content": {}})])
    assert len(rows("SELECT * FROM event_auth_chain_to_calculate")) == 2  # nothing new for them
    added = store([("$X", pdu("m.room.join_rules", "", "$C"))])
    assert [p[0] for p in added.positions] == ["$X", "$M", "$N"] and not added.pending
    assert rows("SELECT * FROM event_auth_chain_to_calculate") == []
    with store_cursor() as cursor:
        index = load_room(cursor, room)
    assert index.auth_chain(["$N"]) == {"$N", "$M", "$X", "$C"}
    # what a rebuild from scratch in stream order builds
    positions, links = stored_rows()
    from rooms.matrix.chain_index import IndexEvent

    expected = build([IndexEvent("$C", "m.room.create", "", ()),
                      IndexEvent("$M", "m.room.member", "@m:s2", ("$C", "$X")),
                      IndexEvent("$N", "m.room.member", "@n:s2", ("$C", "$M")),
                      IndexEvent("$X", "m.room.join_rules", "", ("$C",))])
    assert canonical(positions, links) == canonical(
        [(e, c, s) for e, (c, s) in expected.positions.items()],
        [(oc, o, tc, t) for oc, d in expected.links.items() for tc, ps in d.items() for o, t in ps])


def test_reindexing_is_a_no_op_and_chain_ids_never_clash(default_database):
    def pdu(room, t, sk, *auth):
        return {"type": t, "state_key": sk, "sender": "@a:s1", "room_id": room, "auth_events": list(auth), "content": {}}

    store([("$a1", pdu("!a:s1", "m.room.create", "")), ("$a2", pdu("!a:s1", "m.room.member", "@a:s1", "$a1"))])
    store([("$b1", pdu("!b:s1", "m.room.create", "")), ("$b2", pdu("!b:s1", "m.room.member", "@a:s1", "$b1"))])
    with transaction.atomic(), store_cursor() as cursor:
        again = index_events(cursor, [chain_event("$a2", "!a:s1", "m.room.member", "@a:s1",
                                                  pdu("!a:s1", "m.room.member", "@a:s1", "$a1"))])
    assert not again.positions and not again.links
    positions, links = stored_rows()
    assert len({c for _, c, _ in positions}) == 4 and len(positions) == 4
    assert sorted((oc, tc) for oc, _, tc, _ in links) == sorted(
        (dict((e, c) for e, c, _ in positions)[x], dict((e, c) for e, c, _ in positions)[y])
        for x, y in [("$a2", "$a1"), ("$b2", "$b1")])
    # after a rebuild swapped rows in, the sequence continues above them
    with transaction.atomic(), store_cursor() as cursor:
        cursor.execute("UPDATE event_auth_chains SET chain_id = chain_id + 1000")
        reset_chain_id_sequence(cursor)
    added = store([("$c1", pdu("!c:s1", "m.room.create", ""))])
    assert added.positions[0][1] > max(c for _, c, _ in positions) + 1000

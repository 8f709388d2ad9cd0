"""The room store's panels on an event's admin page: edges, state group, state at the event."""
from __future__ import annotations

import pytest

from rooms.models import Event
from rooms.storage.synthetic import RoomBuilder
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES


def test_event_page_shows_edges_state_group_and_state(store, admin_client):
    room = RoomBuilder("!adm:hs")
    create = room.create("@c:hs")
    join = room.member("@c:hs", "join")
    msg = room.message("@c:hs", "hello")
    store.persist(create[1], join[1], msg[1])
    event = Event.objects.get(event_id=join[0])
    # (IDs carry a <wbr> after each separator, common.breakable: compared as read)
    body = admin_client.get(f"/admin/rooms/event/{event.pk}/change/").content.decode().replace("<wbr>", "")
    assert "<h3>DAG edges</h3>" in body and "<h3>State group</h3>" in body and "<h3>State at this event</h3>" in body
    edges = body.split("<h3>DAG edges</h3>")[1].split("<h3>")[0]
    assert create[0] in edges.split("referenced by")[0] and msg[0] in edges.split("referenced by")[1]
    state = body.split("<h3>State at this event</h3>")[1]
    assert "m.room.create" in state and "m.room.member" in state and "@c:hs" in state
    assert "a delta of group" in body or "a full snapshot" in body


def test_a_rejected_events_page_shows_why_and_its_auth_events(store, admin_client):
    import json

    from rooms.matrix.room_builder import RoomBuilder as MatrixRoom
    from rooms.matrix.room_versions import room_version

    room = MatrixRoom(room_version("10"), room_id="!rej:hs")
    room.send("@c:hs", "m.room.create", {"creator": "@c:hs", "room_version": "10"}, state_key="")
    room.send("@c:hs", "m.room.member", {"membership": "join"}, state_key="@c:hs")
    bad = room.send("@c:hs", "m.room.member", {"membership": "join"}, state_key="@x:hs")  # joins someone else
    assert bad in room.rejected
    store.persist(*[json.dumps(room.pdu(e)).encode() for e in room.order])
    event = Event.objects.get(event_id=bad)
    assert event.rejected
    body = admin_client.get(f"/admin/rooms/event/{event.pk}/change/").content.decode().replace("<wbr>", "")
    panel = body.split("<h3>Authorization</h3>")[1].split("<h3>")[0]
    assert "rejected: auth_error" in panel and room.order[0] in panel and room.order[1] in panel
    ok = Event.objects.get(event_id=room.order[1])
    body = admin_client.get(f"/admin/rooms/event/{ok.pk}/change/").content.decode().replace("<wbr>", "")
    assert "accepted" in body.split("<h3>Authorization</h3>")[1].split("<h3>")[0]

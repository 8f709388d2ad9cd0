"""The room store's panels on an event's admin page: edges, state group, state at the event."""
from __future__ import annotations

import pytest

from streams.models import Event
from streams.storage.synthetic import RoomBuilder

from .helpers import ON_BOTH_DATABASES, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES


def test_event_page_shows_edges_state_group_and_state(store, admin_client):
    room = RoomBuilder("!adm:hs")
    create = room.create("@c:hs")
    join = room.member("@c:hs", "join")
    msg = room.message("@c:hs", "hello")
    store.persist(create[1], join[1], msg[1])
    event = Event.objects.get(event_id=join[0])
    body = admin_client.get(f"/admin/streams/event/{event.pk}/change/").content.decode()
    assert "<h3>DAG edges</h3>" in body and "<h3>State group</h3>" in body and "<h3>State at this event</h3>" in body
    edges = body.split("<h3>DAG edges</h3>")[1].split("<h3>")[0]
    assert create[0] in edges.split("referenced by")[0] and msg[0] in edges.split("referenced by")[1]
    state = body.split("<h3>State at this event</h3>")[1]
    assert "m.room.create" in state and "m.room.member" in state and "@c:hs" in state
    assert "a delta of group" in body or "a full snapshot" in body

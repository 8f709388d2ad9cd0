"""The read-only /api/ endpoints: authentication, 4xx JSON on bad parameters, lossless bodies."""
from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from rooms.storage.synthetic import RoomBuilder
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES
A = "@alice:hs"
AUTH = {"HTTP_AUTHORIZATION": "Bearer s3cret"}


@pytest.fixture
def room(store, settings):
    settings.API_TOKEN = "s3cret"
    b = RoomBuilder("!api:hs", server="hs")
    evs = [b.create(A), b.member(A, "join")] + [b.message(A, f"m{i}") for i in range(5)]
    odd_id = "$odd:hs"
    odd = ('{"event_id":"%s","room_id":"!api:hs","type":"m.room.message","sender":"%s","depth":9,'
           '"prev_events":["%s"],"content":{"body":"\\u00e9 big","n":18446744073709551617}}' % (odd_id, A, evs[-1][0]))
    store.persist(*[raw for _, raw in evs], odd.encode())
    return [e for e, _ in evs] + [odd_id], odd.encode()


def test_requires_auth(client, room):
    assert client.get("/api/sync", {"user_id": A}).status_code == 401
    r = client.get("/api/sync", {"user_id": A}, HTTP_AUTHORIZATION="Bearer wrong")
    assert r.status_code == 401 and "invalid" in r.json()["error"]
    staff = User.objects.create_user("op", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get("/api/sync", {"user_id": A}).status_code == 200


def test_messages_carry_stored_bytes(client, room):
    ids, odd = room
    r = client.get("/api/rooms/!api:hs/messages", {"user_id": A, "limit": 3}, **AUTH)
    assert r.status_code == 200 and odd in r.content  # the stored bytes, spliced in as they are
    body = json.loads(r.content)
    assert [e["event_id"] for e in body["chunk"]] == ids[::-1][:3]
    r2 = client.get("/api/rooms/!api:hs/messages", {"user_id": A, "limit": 3, "from": body["end"]}, **AUTH)
    assert [e["event_id"] for e in r2.json()["chunk"]] == ids[::-1][3:6]


def test_state_sync_topological_event(client, room):
    ids, _ = room
    r = client.get("/api/rooms/!api:hs/state", {"at": ids[3]}, **AUTH)
    assert r.status_code == 200
    assert {(s["type"], s["event_id"]) for s in r.json()["state"]} == {("m.room.create", ids[0]), ("m.room.member", ids[1])}
    sync = client.get("/api/sync", {"user_id": A, "limit": 2, "rooms": 5}, **AUTH).json()
    assert [e["event_id"] for e in sync["rooms"]["!api:hs"]["timeline"]["events"]] == ids[-2:]
    assert sync["rooms"]["!api:hs"]["timeline"]["limited"]
    # Matrix's shape: the state at the timeline's start beside it, as whole events
    assert [(e["type"], e["event_id"]) for e in sync["rooms"]["!api:hs"]["state"]["events"]] == \
        [("m.room.create", ids[0]), ("m.room.member", ids[1])]
    since = sync["next_batch"]
    assert client.get("/api/sync", {"user_id": A, "since": since}, **AUTH).json()["rooms"] == {}
    topo = client.get("/api/rooms/!api:hs/topological", {"limit": 2}, **AUTH).json()
    assert [e["event_id"] for e in topo["chunk"]] == ids[:2]
    assert client.get(f"/api/events/{ids[2]}", **AUTH).json()["event"]["event_id"] == ids[2]


@pytest.mark.parametrize("url, params, status, fragment", [
    ("/api/rooms/!api:hs/messages", {}, 400, "user_id is required"),
    ("/api/rooms/!api:hs/messages", {"user_id": "bob"}, 400, "@name:server"),
    ("/api/rooms/!api:hs/messages", {"user_id": A, "limit": "x"}, 400, "integer"),
    ("/api/rooms/!api:hs/messages", {"user_id": A, "limit": "0"}, 400, "between"),
    ("/api/rooms/!api:hs/messages", {"user_id": A, "dir": "up"}, 400, "dir"),
    ("/api/rooms/!api:hs/messages", {"user_id": A, "from": "q12"}, 400, "invalid room stream token"),
    ("/api/sync", {"user_id": A, "since": "t1"}, 400, "since"),
    ("/api/rooms/!api:hs/state", {}, 400, "at=<event_id>"),
    ("/api/rooms/!api:hs/state", {"at": "$missing:hs"}, 404, "not found"),
    ("/api/rooms/!other:hs/state", {"at": "$odd:hs"}, 404, "not in"),
    ("/api/events/$missing:hs", {}, 404, "not found"),
    ("/api/rooms/!nowhere:hs/messages", {"user_id": A}, 404, "room !nowhere:hs not found"),
    ("/api/rooms/!nowhere:hs/topological", {}, 404, "room !nowhere:hs not found"),
])
def test_bad_parameters_get_json_errors(client, room, url, params, status, fragment):
    r = client.get(url, params, **AUTH)
    assert r.status_code == status and fragment in r.json()["error"]


def test_a_known_room_the_user_cannot_see_is_an_empty_page_not_a_404(client, room):
    r = client.get("/api/rooms/!api:hs/messages", {"user_id": "@mallory:hs"}, **AUTH)
    assert r.status_code == 200 and r.json()["chunk"] == []


def test_only_get(client, room):
    assert client.post("/api/sync", **AUTH).status_code == 405


def test_page_size_capped_by_api_max_limit(client, room, settings):
    settings.API_MAX_LIMIT = 5
    r = client.get("/api/rooms/!api:hs/messages", {"user_id": A, "limit": 6}, **AUTH)
    assert r.status_code == 400 and "between 1 and 5" in r.json()["error"]
    assert client.get("/api/rooms/!api:hs/messages", {"user_id": A, "limit": 5}, **AUTH).status_code == 200

"""Input a careless view would answer with a 500 answers 4xx with a message, on PostgreSQL
and on SQLite: Python's int digit limit, NUL bytes PostgreSQL refuses, integers past 64 bits
SQLite refuses, Unicode digits, and admin searches too costly to run (docs/security.md)."""
from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from replication.http.replication_secret import bearer_header

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

HUGE = "9" * 5000  # past Python's int() digit limit (4300)
WIDE = "9" * 30  # past 64 bits


@pytest.fixture
def api(default_database, settings):
    settings.API_TOKEN = "t" * 40
    return Client(raise_request_exception=False, headers={"Authorization": f"Bearer {settings.API_TOKEN}"})


API_CASES = [
    ("/api/sync", {"user_id": "@a:hs", "since": f"s{HUGE}"}, "since"),
    ("/api/sync", {"user_id": "@a:hs", "since": f"s{WIDE}"}, "since"),
    ("/api/sync", {"user_id": "@a:hs", "since": f"t{WIDE}-1"}, "since"),
    ("/api/sync", {"user_id": "@a:hs", "since": "s\u0663"}, "since"),  # an Arabic-Indic 3
    ("/api/sync", {"user_id": "@a\x00:hs"}, "NUL"),
    ("/api/sync", {"user_id": "@a:hs", "limit": HUGE}, "limit"),
    ("/api/rooms/!r\x00:hs/messages", {"user_id": "@a:hs"}, "NUL"),
    ("/api/rooms/!r:hs/messages", {"user_id": "@a:hs", "from": f"t1-{WIDE}"}, "from"),
    ("/api/rooms/!r:hs/state", {"at": "$e\x00:hs"}, "NUL"),
    ("/api/events/$e\x00:hs", {}, "NUL"),
    ("/api/sync", {"user_id": "@" + "a" * 300 + ":hs"}, "user_id"),
]


def test_api_bad_input_is_a_400_with_a_message(api):
    for path, params, needle in API_CASES:  # (one test per database: setting one up is the cost)
        r = api.get(path, params)
        assert r.status_code == 400, (path, params, r.status_code, r.content[:300])
        assert needle in r.json()["error"], (path, params)


@pytest.fixture
def catchup(default_database, settings):
    return Client(raise_request_exception=False, headers=bearer_header(settings.REPLICATION_SECRET))


CATCHUP_CASES = [
    ({"from_token": WIDE, "upto_token": WIDE}, "at most"),
    ({"from_token": "0", "upto_token": HUGE}, "at most"),
    ({"from_token": "0", "upto_token": "1", "instance_name": "mas\x00ter"}, "NUL"),
    ({"from_token": "0", "upto_token": "1", "instance_name": "m" * 300}, "instance_name"),
    ({"from_token": "\u0663", "upto_token": "4"}, "integers"),
]


def test_catchup_bad_input_is_a_400_with_a_message(catchup):
    for params, needle in CATCHUP_CASES:
        # a fresh transaction ID each time: an answer kept under a used one would be replayed
        r = catchup.get(f"/_synapse/replication/get_repl_stream_updates/receipts/{uuid.uuid4().hex}", params)
        assert r.status_code == 400, (params, r.status_code, r.content[:300])
        assert r.json()["errcode"] == "M_INVALID_PARAM" and needle in r.json()["error"], params


@pytest.fixture
def staff(default_database):
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_user("op", password="x" * 12, is_staff=True, is_superuser=True))
    return client


ADMIN_CASES = [
    ({"q": "\u00b2"}, 200, None),  # "²".isdigit() is True, int("²") fails: now a text search
    ({"q": HUGE[:19]}, 200, None),  # the largest number a stream ID can be: a lookup
    ({"q": WIDE}, 200, None),  # past 64 bits: searched as text, not as a stream ID
    ({"q": HUGE}, 400, "characters"),
    ({"q": "a\x00b"}, 400, "NUL"),
    ({"by_room_id": "!r\x00:hs"}, 400, "NUL"),
    ({"type__exact": "m.room\x00"}, 400, "NUL"),
    ({"sid_from": WIDE}, 200, "is not a whole number"),  # as for sid_from=abc: said on the page
    ({"sid_to": HUGE}, 200, "is not a whole number"),
    ({"q": " ".join(f"t{i}" for i in range(2000))}, 400, "terms"),
    ({"q": "x" * 1000}, 400, "characters"),
]


def test_admin_bad_input_is_refused_with_a_message(staff):
    for params, status, needle in ADMIN_CASES:
        r = staff.get("/admin/rooms/event/", params)
        assert r.status_code == status, (params, r.status_code, r.content[:300])
        if needle is not None:
            assert needle in r.content.decode(), params
    # and ordinary searches still work
    assert staff.get("/admin/streams/receipt/", {"q": "12"}).status_code == 200
    assert staff.get("/admin/streams/receipt/", {"q": "@user:hs !room:hs"}).status_code == 200

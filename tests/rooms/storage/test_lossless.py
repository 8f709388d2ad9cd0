"""Lossless round trip: the bytes a read returns are the bytes received, whatever the JSON's
shape (unicode escapes, key order, huge integers, whitespace, number spellings)."""
from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rooms.storage.reads import get_event, room_messages
from rooms.storage.synthetic import RoomBuilder
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES
IDS = itertools.count()

ODD = [
    '{"body":"\\u00e9\\u0000\\ud83d\\ude00 \\"q\\" \\/ caf\u00e9 \U0001f600"}',  # escapes and raw UTF-8
    '{"z":1,"a":2,"m":{"y":[],"b":{}}}',  # key order kept
    '{"n":123456789012345678901234567890123,"neg":-18446744073709551617}',  # beyond 64 bits
    '{ "ws" :\t[ 1 ,\n 2 ] ,"f":1.0,"e":1E+2,"z":-0,"small":1e-300 }',  # whitespace, number spellings
    '{"dup":1,"dup":2}',  # duplicate keys (not canonical JSON, still stored as sent)
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def event_bytes(prev, content_text):
    eid = f"$lossless{next(IDS)}:hs"
    raw = ('{"type":"m.room.message","room_id":"!l:hs","sender":"@a:hs","event_id":"%s","depth":%d,'
           '"prev_events":["%s"],"content":%s}' % (eid, 2 + next(IDS), prev, content_text)).encode()
    return eid, raw


@pytest.fixture
def room(store):
    b = RoomBuilder("!l:hs", server="hs")
    create, join = b.create("@a:hs"), b.member("@a:hs", "join")
    store.persist(create[1], join[1])
    return join[0]


@pytest.mark.parametrize("content", ODD)
def test_odd_json_round_trips(store, room, content):
    eid, raw = event_bytes(room, content)
    store.persist(raw)
    assert get_event(eid).json == raw
    assert [e.json for e in room_messages("!l:hs", "@a:hs", limit=1)["chunk"]] == [raw]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5), st.booleans(),
       st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :\n")]))
def test_random_json_round_trips(store, room, content, ascii_only, separators):
    eid, raw = event_bytes(room, json.dumps(content, ensure_ascii=ascii_only, separators=separators))
    store.persist(raw)
    assert get_event(eid).json == raw

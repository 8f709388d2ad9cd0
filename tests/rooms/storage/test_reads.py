"""Every read on PostgreSQL: state at event, topological traversal, back-pagination with both
token forms, initial and incremental sync, redactions, and the stream change cache."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rooms.storage import RoomStreamToken
from rooms.storage.change_cache import StreamChangeCache
from rooms.storage.reads import (
    NotFound,
    get_event,
    incremental_sync,
    initial_sync,
    room_late_stream,
    room_messages,
    state_at_event,
    topological_events,
    visible_events,
)
from rooms.storage.synthetic import RoomBuilder
from rooms.storage.tokens import BadToken
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES
A, B, C = "@alice:hs", "@bob:hs", "@carol:hs"


def room(store, room_id, n_messages, *, members=(A,), vis=None):
    b = RoomBuilder(room_id, server="hs")
    evs = [b.create(A)] + [b.member(m, "join") for m in members]
    if vis:
        evs.append(b.visibility(A, vis))
    msgs = [b.message(A, f"{room_id} m{i}") for i in range(n_messages)]
    store.persist(*[raw for _, raw in evs + msgs])
    return b, [e for e, _ in evs], [e for e, _ in msgs]


def bodies(rows):
    return [json.loads(r.json)["content"].get("body") for r in rows]


def test_back_pagination_tokens(store):
    b, setup, msgs = room(store, "!p:hs", 25)
    page = room_messages("!p:hs", A, direction="b", limit=10)
    assert [e.event_id for e in page["chunk"]] == msgs[::-1][:10]
    last = page["chunk"][-1]
    assert str(page["end"]) == f"t{last.topological_ordering}-{last.stream_ordering - 1}"
    seen = [e.event_id for e in page["chunk"]]
    while page["end"] is not None:
        page = room_messages("!p:hs", A, from_token=RoomStreamToken.parse(str(page["end"])), limit=10)
        seen += [e.event_id for e in page["chunk"]]
    assert seen == (setup + msgs)[::-1]
    # a live token bounds the stream ordering only
    mid = get_event(msgs[9])
    page = room_messages("!p:hs", A, from_token=RoomStreamToken(mid.stream_ordering), limit=3)
    assert [e.event_id for e in page["chunk"]] == [msgs[9], msgs[8], msgs[7]]
    # forwards from a historic token
    page = room_messages("!p:hs", A, from_token=mid.token, direction="f", limit=3)
    assert [e.event_id for e in page["chunk"]] == msgs[10:13]


def test_tokens_parse_and_reject():
    assert RoomStreamToken.parse("s42") == RoomStreamToken(42)
    assert RoomStreamToken.parse("t5964--1980434") == RoomStreamToken(-1980434, 5964)
    assert str(RoomStreamToken(-3, 7)) == "t7--3"
    for bad in ("", "x1", "t5", "s", "t-1-2", "m5~1.6"):
        with pytest.raises(BadToken):
            RoomStreamToken.parse(bad)


def test_topological_traversal_and_state_at_event(store):
    b, setup, msgs = room(store, "!t:hs", 5, members=(A, B))
    page = topological_events("!t:hs", limit=4)
    assert [e.event_id for e in page["chunk"]] == (setup + msgs)[:4]
    page2 = topological_events("!t:hs", from_token=page["end"], limit=100)
    assert [e.event_id for e in page2["chunk"]] == (setup + msgs)[4:] and page2["end"] is None
    state = state_at_event(msgs[0])
    assert state == {("m.room.create", ""): setup[0], ("m.room.member", A): setup[1], ("m.room.member", B): setup[2]}
    assert state_at_event(msgs[0]) is state  # cached
    with pytest.raises(NotFound):
        state_at_event("$nope:hs")


def test_reads_respect_visibility(store):
    b, setup, msgs = room(store, "!v:hs", 3, vis="joined")
    assert room_messages("!v:hs", C)["chunk"] == []
    with pytest.raises(NotFound):
        get_event(msgs[0], user_id=C)
    with pytest.raises(NotFound):
        state_at_event(msgs[0], user_id=C)
    assert get_event(msgs[0], user_id=A).event_id == msgs[0]


def test_redaction_prunes_on_read_keeps_stored_json(store):
    b, setup, msgs = room(store, "!r:hs", 2)
    rid, raw = b.redact(A, msgs[0])
    store.persist(raw)
    got = json.loads(get_event(msgs[0]).json)
    assert "body" not in got["content"] and got["unsigned"]["redacted"] is True
    assert bodies(room_messages("!r:hs", A, limit=10)["chunk"])[1:3] == ["!r:hs m1", None]
    from rooms.models import Event
    assert b"m0" in bytes(Event.objects.get(event_id=msgs[0]).json)  # original kept


def test_redaction_before_its_target(store):
    b, setup, msgs = room(store, "!r2:hs", 0)
    target_id, target = b.message(A, "secret")
    rid, redaction = b.event("m.room.redaction", A, {}, extra={"redacts": target_id}, prev=[setup[-1]])
    # the redaction arrives first (it only needs the room), then its target
    b2 = json.loads(target)
    b2["prev_events"] = [rid]
    store.persist(redaction)
    store.persist(json.dumps(b2).encode())
    assert "body" not in json.loads(get_event(target_id).json)["content"]


def test_initial_sync_recent_rooms_and_events(store):
    for i in range(5):
        room(store, f"!s{i}:hs", 4 + i, members=(A, B) if i % 2 == 0 else (A,))
    sync = initial_sync(B, limit=3, rooms=2)
    assert list(sync["rooms"]) == ["!s4:hs", "!s2:hs"]  # most recently active first
    timeline = sync["rooms"]["!s4:hs"]["timeline"]
    assert bodies(timeline["events"]) == ["!s4:hs m5", "!s4:hs m6", "!s4:hs m7"] and timeline["limited"]
    all_rooms = initial_sync(B, limit=50, rooms=100)
    assert set(all_rooms["rooms"]) == {"!s0:hs", "!s2:hs", "!s4:hs"}
    assert not all_rooms["rooms"]["!s0:hs"]["timeline"]["limited"]
    # exactly as many events as the limit: not limited; one fewer: limited, from the second on
    whole = all_rooms["rooms"]["!s0:hs"]["timeline"]["events"]
    exact = initial_sync(B, limit=len(whole), rooms=100)["rooms"]["!s0:hs"]["timeline"]
    assert [e.event_id for e in exact["events"]] == [e.event_id for e in whole] and not exact["limited"]
    short = initial_sync(B, limit=len(whole) - 1, rooms=100)["rooms"]["!s0:hs"]["timeline"]
    assert [e.event_id for e in short["events"]] == [e.event_id for e in whole[1:]] and short["limited"]
    assert short["prev_batch"] == RoomStreamToken(whole[1].stream_ordering - 1, whole[1].topological_ordering)


def test_incremental_sync(store):
    b1, _, _ = room(store, "!i1:hs", 2, members=(A, B))
    b2, _, _ = room(store, "!i2:hs", 2, members=(A, B))
    b3, _, _ = room(store, "!i3:hs", 2, members=(A,))
    since = initial_sync(B)["next_batch"]
    nothing = incremental_sync(B, since)
    assert nothing["rooms"] == {} and nothing["rooms_checked"] == 0
    store.persist(b1.message(A, "new in 1")[1])
    store.persist(b3.member(B, "invite", sender=A)[1])
    store.persist(b3.message(A, "not for bob yet")[1])
    sync = incremental_sync(B, since, limit=5)
    assert list(sync["rooms"]) == ["!i1:hs"] and bodies(sync["rooms"]["!i1:hs"]["timeline"]["events"]) == ["new in 1"]
    assert sync["rooms_checked"] == 2  # !i1 and !i3 (membership change); the change cache skipped !i2
    assert [(m["room_id"], m["membership"]) for m in sync["membership_changes"]] == [("!i3:hs", "invite")]
    again = incremental_sync(B, sync["next_batch"])
    assert again["rooms"] == {} and again["membership_changes"] == []



def state_ids(answer, room_id):
    return {e.event_id for e in answer["rooms"][room_id]["state"]["events"]}


def test_a_limited_sync_carries_the_state_changed_in_its_gap(store):
    """Matrix's sync shape: ``state`` is what the reader needs besides the timeline. Initial:
    the state at the timeline's start. Incremental and limited: what changed between the
    previous sync and the timeline's start -- a topic and a ban inside the gap are there, the
    state the reader already had and the state events in the timeline are not. Not limited
    and linear: nothing (Synapse's ``_calculate_state``; checked against a real Synapse in
    tests/interop/test_sync_state.py)."""
    b = RoomBuilder("!gap:hs", server="hs")
    setup = [b.create(A), b.member(A, "join"), b.member(B, "join"), b.member(C, "join")]
    first_topic = b.event("m.room.topic", A, {"topic": "first"}, state_key="")
    store.persist(*[raw for _, raw in setup + [first_topic]])
    messages = [b.message(A, f"m{i}") for i in range(6)]
    store.persist(*[raw for _, raw in messages])
    create, a_join, b_join, c_join = (e for e, _ in setup)

    initial = initial_sync(B, limit=3)
    room_now = initial["rooms"]["!gap:hs"]
    assert [e.event_id for e in room_now["timeline"]["events"]] == [e for e, _ in messages[-3:]]
    assert room_now["timeline"]["limited"]
    assert state_ids(initial, "!gap:hs") == {create, a_join, b_join, c_join, first_topic[0]}
    everything = initial_sync(B, limit=50)  # the whole room in the timeline: no state block
    assert not everything["rooms"]["!gap:hs"]["timeline"]["limited"] and state_ids(everything, "!gap:hs") == set()

    since = initial["next_batch"]
    topic = b.event("m.room.topic", A, {"topic": "second"}, state_key="")
    gap = [b.message(A, f"gap {i}") for i in range(3)]
    ban = b.event("m.room.member", A, {"membership": "ban"}, state_key=C)
    burst = [topic, *gap, ban, *[b.message(A, f"after {i}") for i in range(4)]]
    store.persist(*[raw for _, raw in burst])
    gappy = incremental_sync(B, since, limit=3)
    room_then = gappy["rooms"]["!gap:hs"]
    assert room_then["timeline"]["limited"]
    assert [e.event_id for e in room_then["timeline"]["events"]] == [e for e, _ in burst[-3:]]
    assert state_ids(gappy, "!gap:hs") == {topic[0], ban[0]}  # the gap's changes, nothing the reader had
    by_id = {e.event_id: json.loads(e.json) for e in room_then["state"]["events"]}
    assert by_id[ban[0]]["content"] == {"membership": "ban"} and by_id[ban[0]]["state_key"] == C

    # the ban inside a timeline that still reaches the gap's start: in the timeline, not in state
    wide = incremental_sync(B, since, limit=6)
    assert ban[0] in {e.event_id for e in wide["rooms"]["!gap:hs"]["timeline"]["events"]}
    assert state_ids(wide, "!gap:hs") == {topic[0]}
    # not limited, a linear timeline: no state block (the timeline holds every change)
    whole = incremental_sync(B, since, limit=50)
    assert not whole["rooms"]["!gap:hs"]["timeline"]["limited"] and state_ids(whole, "!gap:hs") == set()
    # no state changed in the gap: an empty block, nothing read
    later = gappy["next_batch"]
    store.persist(*[raw for _, raw in [b.message(A, f"quiet {i}") for i in range(5)]])
    quiet = incremental_sync(B, later, limit=2)
    assert quiet["rooms"]["!gap:hs"]["timeline"]["limited"] and state_ids(quiet, "!gap:hs") == set()


def test_a_banned_member_is_told_no_state_from_after_the_ban(store):
    """A member banned inside the gap gets the room's events up to the ban and its state up to
    there: a topic set after the ban is not told to them (Synapse's ``leave`` room, whose
    state ends at the leave)."""
    b = RoomBuilder("!ban:hs", server="hs")
    store.persist(*[raw for _, raw in [b.create(A), b.member(A, "join"), b.member(C, "join"),
                                      b.message(A, "before")]])
    since = initial_sync(C)["next_batch"]
    before_ban = b.event("m.room.topic", A, {"topic": "before the ban"}, state_key="")
    gap = b.message(A, "in the gap")
    ban = b.event("m.room.member", A, {"membership": "ban"}, state_key=C)
    after_ban = b.event("m.room.topic", A, {"topic": "after the ban"}, state_key="")
    store.persist(*[raw for _, raw in [before_ban, gap, ban, after_ban, b.message(A, "after")]])
    answer = incremental_sync(C, since, limit=2)
    room_then = answer["rooms"]["!ban:hs"]
    assert [e.event_id for e in room_then["timeline"]["events"]] == [gap[0], ban[0]]
    assert room_then["timeline"]["limited"] and state_ids(answer, "!ban:hs") == {before_ban[0]}
    assert after_ban[0] in state_ids(incremental_sync(A, since, limit=1), "!ban:hs")


def test_a_member_who_joined_in_the_gap_is_told_the_whole_state(store):
    """Joined since the token: the room's state before the join is news to them (a topic set
    long before), so its state block is whole, as in an initial sync, and the timeline is
    limited (Synapse's newly joined room). A rejoin after a leave counts; a join event while
    joined (a new display name) does not."""
    b = RoomBuilder("!new:hs", server="hs")
    setup = [b.create(A), b.member(A, "join")]
    topic = b.event("m.room.topic", A, {"topic": "old news"}, state_key="")
    store.persist(*[raw for _, raw in [*setup, topic, b.message(A, "before")]])
    since = initial_sync(C)["next_batch"]
    join = b.member(C, "join")
    store.persist(*[raw for _, raw in [join, b.message(A, "welcome"), b.message(C, "hello")]])
    answer = incremental_sync(C, since, limit=5)
    room_now = answer["rooms"]["!new:hs"]
    assert [e.event_id for e in room_now["timeline"]["events"]][0] == join[0] and room_now["timeline"]["limited"]
    assert topic[0] in state_ids(answer, "!new:hs")
    # a display name change while joined: an ordinary incremental sync
    since = answer["next_batch"]
    rename = b.event("m.room.member", C, {"membership": "join", "displayname": "C"}, state_key=C)
    store.persist(rename[1], b.message(A, "renamed")[1])
    again = incremental_sync(C, since, limit=5)
    assert not again["rooms"]["!new:hs"]["timeline"]["limited"] and state_ids(again, "!new:hs") == set()


def test_incremental_sync_finds_a_late_event_in_a_closed_range(store):
    """A fork stored after the token sits, by key, in a range of Bob's that closed before it
    (his first membership, history ``joined``: only that range shows it). The walk of a
    closed range starts at its end's stream ordering unless the room marked a late event
    (``rooms.late_stream``), as this fork does."""
    b, _, msgs = room(store, "!late:hs", 3, members=(A, B), vis="joined")
    store.persist(b.member(B, "leave")[1], b.member(B, "join")[1], b.message(A, "after the rejoin")[1])
    since = initial_sync(B)["next_batch"]
    _, fork = b.event("m.room.message", A, {"body": "fork"}, prev=[msgs[1]])
    store.persist(fork)
    sync = incremental_sync(B, since, limit=5)
    assert bodies(sync["rooms"]["!late:hs"]["timeline"]["events"]) == ["fork"]
    history = room_messages("!late:hs", B, direction="f", limit=50)["chunk"]
    assert "fork" in bodies(history)


def test_stream_order_walk_needs_the_rooms_mark():
    """Order ``s`` reads each room's ``late_stream`` from its caller (once per room): asked
    without it, a clear error rather than a query that looks it up in three places."""
    with pytest.raises(ValueError, match="late"):
        visible_events("m.room_id", order="s", since="%(since)s")
    assert room_late_stream("m.room_id") in visible_events("m.room_id", order="s", since="%(since)s",
                                                            late=room_late_stream("m.room_id"))


def test_incremental_sync_from_before_the_change_cache(store, monkeypatch):
    """A token older than the change cache's horizon: the cache can only say "every room may
    have changed", and the rooms' last live event decides instead of reading them all."""
    from rooms.storage import reads
    from rooms.storage.caches import ChangeCaches, storage_caches

    real_rooms_changed = reads._rooms_changed
    builders = [room(store, f"!o{i}:hs", 2, members=(A, B))[0] for i in range(4)]
    since = initial_sync(B)["next_batch"]
    store.persist(builders[1].message(A, "new in 1")[1])
    store.persist(builders[3].message(A, "new in 3")[1])
    for i in range(6):  # later traffic in a room Bob is not in pushes the horizon past the token
        store.persist(builders[0].message(A, f"also new in 0, {i}")[1])
    monkeypatch.setattr(ChangeCaches, "PREFILL", 3)
    # a process started after the token: its events feed begins 3 positions back, and its
    # rooms' cache holds the 2 latest rooms' last change (a server with more rooms than it keeps)
    monkeypatch.setattr(ChangeCaches, "ROOM_ENTRIES", 2)
    storage_caches().forget()
    sync = incremental_sync(B, since, limit=2)
    assert storage_caches().change.rooms.earliest_known_position > since.stream  # the case under test
    assert sync["rooms_checked"] == 3  # !o0, !o1, !o3: not !o2, which has nothing new
    assert sorted(sync["rooms"]) == ["!o0:hs", "!o1:hs", "!o3:hs"]
    assert bodies(sync["rooms"]["!o3:hs"]["timeline"]["events"]) == ["new in 3"]
    assert bodies(sync["rooms"]["!o0:hs"]["timeline"]["events"]) == ["also new in 0, 4", "also new in 0, 5"]

    # with room for every room, the cache starts knowing each room's last change: the same
    # answer with no question to the database about the rooms
    monkeypatch.undo()
    monkeypatch.setattr(ChangeCaches, "PREFILL", 3)
    storage_caches().forget()
    asked: list[str] = []
    monkeypatch.setattr(reads, "_rooms_changed", lambda cur, cache, rooms, since: (
        asked.append("rooms") if since < cache.earliest_known_position else None)
        or real_rooms_changed(cur, cache, rooms, since))
    again = incremental_sync(B, since, limit=2)
    assert storage_caches().change.rooms.earliest_known_position <= since.stream and asked == []
    assert again["rooms_checked"] == 3 and sorted(again["rooms"]) == sorted(sync["rooms"])
    assert all(bodies(again["rooms"][r]["timeline"]["events"]) == bodies(sync["rooms"][r]["timeline"]["events"])
               for r in sync["rooms"])


def test_page_from_a_token_scans_from_the_token(store, default_database):
    """A page far from the room's end going back (far from its start going forward) costs what
    a page at that end does: each walk's index scan starts at the token, not at the end of
    the range it walks, filtering its way to the token (5,500 buffers for a page of 20 in a
    688,000-event room, before). The pages are checked on both databases, their buffers on
    PostgreSQL."""
    from rooms.storage import reads
    from rooms.storage.sql import store_cursor

    _, _, msgs = room(store, "!big:hs", 3000, members=(A, B), vis="joined")
    early, late = get_event(msgs[100]), get_event(msgs[2899])
    executed: list = []
    real_fetch_all = reads.fetch_all
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reads, "fetch_all", lambda cur, sql, params: executed.append((sql, params)) or
                   real_fetch_all(cur, sql, params))
        pages = {"back from the end": room_messages("!big:hs", B, limit=20),
                 "back from early": room_messages("!big:hs", B, from_token=early.token, limit=20),
                 "forward from the start": room_messages("!big:hs", B, direction="f", limit=20),
                 "forward from late": room_messages("!big:hs", B, from_token=late.token, direction="f", limit=20)}
    assert [e.event_id for e in pages["back from early"]["chunk"]] == msgs[100:80:-1]
    assert [e.event_id for e in pages["forward from late"]["chunk"]] == msgs[2900:2920]
    assert [e.event_id for e in pages["back from the end"]["chunk"]] == msgs[:-21:-1]
    if default_database != "postgresql":
        return  # (SQLite: one room's index walked with the visibility check per row)
    buffers = {}
    with store_cursor() as cur:
        for name, (sql, params) in zip(pages, executed):
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            plan = cur.fetchone()[0]
            plan = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
            buffers[name] = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    # (measured: 17 back and 10-13 forward wherever the token is; scanning from the range's end,
    # 31 and 24 here, growing with the distance)
    assert buffers["back from early"] <= buffers["back from the end"] + 3, buffers
    assert buffers["forward from late"] <= buffers["forward from the start"] + 3, buffers


# Synapse's tests/util/test_stream_change_cache.py vectors
def test_change_cache_vectors():
    cache = StreamChangeCache("t", 3)
    for e, p in (("user@foo.com", 6), ("bar@baz.net", 7), ("user2@foo.com", 8), ("bar2@baz.net", 8)):
        cache.entity_has_changed(e, p)
    assert all(cache.has_entity_changed(e, 4) for e in ("user@foo.com", "bar@baz.net", "user2@foo.com", "bar2@baz.net"))
    assert not cache.has_entity_changed("user@foo.com", 6)
    assert not cache.has_entity_changed("user2@foo.com", 8)
    assert not cache.has_entity_changed("user@foo.com", 7)
    assert not cache.has_entity_changed("user2@foo.com", 9)
    assert not cache.has_entity_changed("not@here.website", 9)
    assert cache.has_entity_changed("user@foo.com", 0) and cache.has_entity_changed("not@here.website", 2)

    small = StreamChangeCache("t", 1, max_size=2)
    small.entity_has_changed("user@foo.com", 2)
    small.entity_has_changed("bar@baz.net", 3)
    small.entity_has_changed("user@elsewhere.org", 4)
    assert small.get_all_entities_changed(1) is None
    assert small.get_all_entities_changed(2) == ["bar@baz.net", "user@elsewhere.org"]
    small.entity_has_changed("bar@baz.net", 5)
    assert small.get_all_entities_changed(2) == ["user@elsewhere.org", "bar@baz.net"]

    pre = StreamChangeCache("t", 1, prefilled={"user@foo.com": 2})
    assert pre.has_entity_changed("user@foo.com", 1)
    assert pre.get_entities_changed(["user@foo.com", "x"], 1) == {"user@foo.com"}


@pytest.mark.parametrize("raw", [b'{"type":"m.room.message","content":{}}', b'{}', b'  { "type": "x" }',
                                 b'{\n  "a": 1\n}', b'{ }'])
def test_event_id_spliced_into_stored_json(raw):
    """The ``event_id`` goes first, the stored bytes after it untouched, whatever the JSON's
    layout (this store writes it compact: the fast path; anything else the general one)."""
    from rooms.storage.reads import with_event_id

    for event_id in ("$abcDEF123_-", 'odd"id\\'):
        out = with_event_id(raw, event_id)
        assert json.loads(out) == {"event_id": event_id, **json.loads(raw)}
        assert out.startswith(b'{"event_id":') and out.endswith(raw.strip()[1:])


@given(st.text(max_size=12), st.sampled_from([b'{"type":"m.room.message","content":{}}', b'{}', b' {"a": 1}']))
def test_any_event_id_is_spliced_as_a_json_string(event_id, raw):
    """Whatever an ID holds (quotes, backslashes, control characters, non-ASCII), the splice
    is valid JSON carrying that ID: only IDs that need no escaping take the fast path."""
    from rooms.storage.reads import with_event_id

    assert json.loads(with_event_id(raw, event_id)) == {"event_id": event_id, **json.loads(raw)}


def test_page_from_a_token_at_the_end_of_the_key_space(store):
    """A token at the largest position a token may name (64 bits): going forward there is
    nothing after it, going back everything is before it; no bound overflows into an error."""
    _, setup, msgs = room(store, "!edge:hs", 3)
    top = 2**63 - 1
    for token in (RoomStreamToken(top, 5), RoomStreamToken(top, top), RoomStreamToken.parse(f"t{top}-{top}")):
        assert room_messages("!edge:hs", A, from_token=token, direction="f", limit=5)["chunk"] == []
        back = room_messages("!edge:hs", A, from_token=token, direction="b", limit=10)
        assert [e.event_id for e in back["chunk"]] == (setup + msgs)[::-1]

"""The planner's orderings step by value (``plan_orderings``): what is stored already, each
event's topological ordering, and an accepted event's effect on its room's head,
extremities, depth and joins. Events of the older unsigned format, in memory."""
from __future__ import annotations

import json

import pytest

from rooms.storage.incoming_events import BadEvent, IncomingEvent
from rooms.storage.plan_orderings import MAX_DEPTH, check_known, order, room_bookkeeping
from rooms.storage.plan_progress import Progress
from rooms.storage.plan_snapshot import Extremity, KnownEvent, PrevInfo, RoomContext, Snapshot, WaitingRedaction
from tests.rooms.storage.test_planner import A, B, MemoryStore

ROOM = "!legacy:a.example"


def raw(event_id: str, *, prev: list[str] = (), depth: int | None = None, type: str = "m.room.message",
        sender: str = A, room: str = ROOM, state_key: str | None = None, content: dict | None = None,
        redacts: str | None = None) -> bytes:
    body = {"event_id": event_id, "room_id": room, "type": type, "sender": sender, "content": content or {},
            "prev_events": list(prev), "origin_server_ts": 1}
    if depth is not None:
        body["depth"] = depth
    if state_key is not None:
        body["state_key"] = state_key
    if redacts is not None:
        body["redacts"] = redacts
    return json.dumps(body).encode()


def stored_room() -> MemoryStore:
    """A legacy room with its create event (depth 5) and a join stored."""
    store = MemoryStore()
    store.plan(raw("$c", type="m.room.create", state_key="", depth=5),
               raw("$j", prev=["$c"], type="m.room.member", state_key=A, content={"membership": "join"}))
    return store


def placed(p: Progress) -> Progress:
    """Stream orderings given in batch order, as ``plan_batch`` gives them before ordering."""
    for n, ev in enumerate(p.events, start=100):
        ev.stream_ordering = n
    return p


def test_the_depth_is_the_topological_ordering_else_one_past_the_deepest_prev():
    store = stored_room()
    p = placed(store.progress(raw("$a", prev=["$j"]), raw("$b", prev=["$a", "$c"]), raw("$d", prev=["$a"], depth=40)))
    a, b, d = p.events
    join = store.known["$j"]
    assert order(p, a) == [PrevInfo(join.key, join.state_group, True)] and a.topological_ordering == 7
    assert order(p, b) == [PrevInfo(a.key, None, True), PrevInfo(store.known["$c"].key, store.known["$c"].state_group,
                                                                   True)]
    assert b.topological_ordering == 8
    assert order(p, d) and d.topological_ordering == 40


def test_a_computed_ordering_stops_at_the_largest_depth():
    store = stored_room()
    store.plan(raw("$deep", prev=["$j"], depth=MAX_DEPTH))
    p = placed(store.progress(raw("$next", prev=["$deep"])))
    order(p, p.events[0])
    assert p.events[0].topological_ordering == MAX_DEPTH


def test_prevs_that_cannot_be_placed_are_refused():
    store = stored_room()
    p = store.progress(raw("$x", prev=["$y"]), raw("$y", prev=["$j"]),
                       raw("$far", prev=["$unknown"]), raw("$known-depth", prev=["$unknown"], depth=9))
    x, _, far, with_depth = p.events
    with pytest.raises(BadEvent, match="comes later in the batch"):
        order(p, x)
    with pytest.raises(BadEvent, match="no 'depth'"):
        order(p, far)
    assert order(p, with_depth) == [None] and with_depth.topological_ordering == 9
    other = store.progress(raw("$elsewhere", prev=["$j"], room="!other:a.example", depth=3))
    with pytest.raises(BadEvent, match="in another room"):
        order(other, other.events[0])


def test_stored_events_are_refused_but_a_stored_outlier_sent_whole_is_de_outliered():
    store = stored_room()
    with pytest.raises(BadEvent, match="already stored"):
        check_known(store.progress(raw("$j", prev=["$c"], type="m.room.member", state_key=A,
                                       content={"membership": "join"})))
    store.plan(IncomingEvent(raw("$out", prev=["$j"], depth=7, type="m.room.topic", state_key=""), outlier=True))
    p = store.progress(raw("$out", prev=["$j"], depth=7, type="m.room.topic", state_key=""))
    check_known(p)
    assert p.ex_outliers == {"$out": store.known["$out"]}


def test_state_before_naming_events_we_do_not_have_is_refused():
    store = stored_room()
    p = store.progress(IncomingEvent(raw("$s", prev=["$gone"], depth=20),
                                     state_before={("m.room.create", ""): "$c", ("m.room.member", B): "$nowhere"}))
    with pytest.raises(BadEvent, match="state_before names events we do not have"):
        check_known(p)


def test_a_redaction_stored_before_its_target_prunes_it_unless_it_is_the_create_event():
    store = stored_room()
    p = store.progress(raw("$t", prev=["$j"]), raw("$c2", prev=["$j"], type="m.room.create", state_key=""))
    p.snapshot.waiting_redactions = [WaitingRedaction("$t", ROOM, "$r"), WaitingRedaction("$c2", ROOM, "$r")]
    check_known(p)
    assert [ev.redacted for ev in p.events] == [True, False]
    elsewhere = store.progress(raw("$u", prev=["$j"]))
    elsewhere.snapshot.waiting_redactions = [WaitingRedaction("$u", "!other:a.example", "$r")]
    check_known(elsewhere)
    assert not elsewhere.events[0].redacted


def bookkeeping(store: MemoryStore, item: bytes, ctx: RoomContext, *, live: bool, key: tuple[int, int]) -> Progress:
    events, _, _ = store.snapshot_for(item)
    p = Progress.start(events, Snapshot(rooms={ctx.room_id: ctx}), store.reader, backfill=not live, now_ms=1)
    ev = p.events[0]
    ev.topological_ordering, ev.stream_ordering = key
    room_bookkeeping(p, ctx, ev, live)
    return p


def test_a_live_event_moves_the_head_and_replaces_its_prevs_as_forward_extremities():
    store = MemoryStore()
    ctx = RoomContext(ROOM, head=(3, 30), last_stream=30, min_depth=1,
                      forward={"$p": Extremity((3, 30), 7), "$q": Extremity((2, 20), 6)})
    p = bookkeeping(store, raw("$m", prev=["$p"], type="m.room.member", state_key=B, content={"membership": "join"}),
                    ctx, live=True, key=(4, 40))
    assert (ctx.head, ctx.last_stream, ctx.min_depth) == ((4, 40), 40, 1)
    assert ctx.forward == {"$q": Extremity((2, 20), 6), "$m": Extremity((4, 40), None)}
    assert (p.room_changes, p.member_changes, p.fwd_changed) == ({ROOM: 40}, {B: 40}, {ROOM})
    assert ctx.last_join == {B: (4, 40)} and ctx.late_stream is None


def test_a_backfilled_event_lowers_the_depth_and_leaves_head_and_extremities():
    store = MemoryStore()
    ctx = RoomContext(ROOM, head=(3, 30), last_stream=30, min_depth=2, forward={"$p": Extremity((3, 30), 7)})
    p = bookkeeping(store, raw("$old", prev=["$older"]), ctx, live=False, key=(1, -5))
    assert (ctx.head, ctx.last_stream, ctx.min_depth) == ((3, 30), 30, 1)
    assert ctx.forward == {"$p": Extremity((3, 30), 7)}
    assert (p.room_changes, p.member_changes, p.fwd_changed) == ({}, {}, set())
    assert ctx.late_stream == 30  # below the head: events after a token may sit before it


def test_known_events_key_is_topological_then_stream():
    assert KnownEvent("$e", ROOM, 4, 9, False, False, None).key == (4, 9)

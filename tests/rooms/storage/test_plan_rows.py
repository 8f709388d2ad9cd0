"""The planner's rows step by value (``plan_rows``): a decided batch as rows, table by table,
and the rooms' contexts after it."""
from __future__ import annotations

from rooms.storage.plan import ALL_RANGES, RoomRow, VisibilityCut, VisibilityRangeRow
from rooms.storage.plan_orderings import check_known, order
from rooms.storage.plan_rows import backward_extremities, room_row, rows
from rooms.storage.plan_snapshot import RoomContext
from rooms.storage.planner import state_and_visibility
from rooms.storage.visibility_ranges import RangeSet
from tests.rooms.storage.test_plan_orderings import ROOM, raw, stored_room
from tests.rooms.storage.test_planner import A, B


def decided(store, *items, ids=(100, 101, 102, 103)):
    """A batch run through every step but the rows (as ``plan_batch`` does)."""
    p = store.progress(*items)
    check_known(p)
    for ev, sid in zip(p.events, ids):
        ev.stream_ordering = sid
        p.stream_ids[ev.event_id] = sid
        infos = order(p, ev)
        if not ev.outlier:
            state_and_visibility(p, ev, infos)
    return p


def test_a_batch_becomes_its_rows_and_the_rooms_after_it():
    store = stored_room()
    p = decided(store, raw("$m", prev=["$j"]),
                raw("$b", prev=["$m"], type="m.room.member", state_key=B, content={"membership": "join"}))
    plan = rows(p)
    m, b = plan.events
    assert m.values["event_id"] == "$m" and m.values["topological_ordering"] == 7 and m.values["received_ts"] == 1
    assert b.state_deltas == [{"room_id": ROOM, "type": "m.room.member", "state_key": B, "event_id": "$b",
                               "prev_event_id": None}]
    assert plan.event_edges == [("$m", "$j", ROOM), ("$b", "$m", ROOM)]
    assert plan.memberships == [("$b", B, A, ROOM, "join", 101, 8)]
    assert plan.forward_extremities == {ROOM: ["$b"]} and plan.backward_extremities == []
    assert plan.resolved_backward == ["$m", "$b"] and plan.member_changes == {B: 101}
    assert [(g.id, g.event_id) for g in plan.state_groups] == [(p.snapshot.group_ids[0], "$b")]
    assert plan.group_ids_used == 1
    ctx = p.rooms[ROOM]
    assert plan.rooms_after == [ctx] and plan.rooms == [room_row(ctx)]
    assert plan.rooms[0] == RoomRow(ROOM, 8, 101, 101, plan.state_groups[0].id, 5, "1", False, None)
    # B's new range, written whole: nothing of it was stored
    assert VisibilityCut(ROOM, B, *ALL_RANGES) in plan.visibility_cuts
    assert VisibilityRangeRow(ROOM, B, 8, 101, None, None) in plan.visibility_ranges
    assert ctx.ranges[B].stored == 1  # as the rows will hold them


def test_a_changed_range_set_keeps_its_stored_ranges_and_rewrites_the_rest():
    store = stored_room()
    p = decided(store, raw("$x", prev=["$j"]))
    ctx = p.rooms[ROOM]
    ctx.ranges[B] = RangeSet([[(1, 1), (2, 2)], [(4, 4), None]], stored=1)
    p.touched.add((ROOM, B))
    plan = rows(p)
    assert VisibilityCut(ROOM, B, 1, 1) in plan.visibility_cuts
    assert [r for r in plan.visibility_ranges if r.user_id == B] == [VisibilityRangeRow(ROOM, B, 4, 4, None, None)]


def test_backward_extremities_are_prevs_we_do_not_have_as_full_events():
    store = stored_room()
    p = store.progress(raw("$e", prev=["$j", "$missing", "$out"], depth=9))
    store.known["$out"] = store.known["$j"].__class__("$out", ROOM, 3, 3, True, False, None)
    p.snapshot.known["$out"] = store.known["$out"]
    assert backward_extremities(p, p.events) == [("$missing", ROOM), ("$out", ROOM)]


def test_a_room_row_of_a_room_with_no_events_yet():
    assert room_row(RoomContext(ROOM)) == RoomRow(ROOM, 0, 0, 0, None, None, None, False, None)

"""``RoomContext.note_order``: the marks behind ``rooms.late_stream``, which let incremental
sync skip ``*shared``'s walks from a token after them. A mark missed is a visible event
missed, so each way an event can sit before an earlier one of the stream is named here."""
from __future__ import annotations

from rooms.storage.plan_snapshot import LATE_ALWAYS, RoomContext


def _room(head=(10, 100), last_stream=100, late=None) -> RoomContext:
    ctx = RoomContext("!r:hs", head=head, last_stream=last_stream)
    ctx.late_stream = late
    return ctx


def test_events_in_order_leave_no_mark():
    ctx = RoomContext("!r:hs")
    ctx.note_order((1, 1), live=True)  # the first event: nothing before it
    assert ctx.late_stream is None
    ctx = _room()
    ctx.note_order((11, 101), live=True)
    ctx.note_order((10, 101), live=True)  # the same depth, later in the stream: after the head
    assert ctx.late_stream is None


def test_a_fork_below_the_head_is_marked_at_its_stream_ordering():
    ctx = _room()
    ctx.note_order((4, 105), live=True)
    assert ctx.late_stream == 105


def test_an_event_stored_out_of_stream_order_is_marked_at_the_last_one():
    # another writer stored stream ordering 100 first; this one, 97, is above the head by
    # key, yet 98-100 (stored) come after it in the stream
    ctx = _room()
    ctx.note_order((12, 97), live=True)
    assert ctx.late_stream == 100


def test_backfill_below_the_head_marks_the_last_stream_ordering():
    ctx = _room()
    ctx.note_order((2, -5), live=False)
    assert ctx.late_stream == 100


def test_backfill_above_the_head_marks_the_room_for_good():
    ctx = _room()
    ctx.note_order((50, -5), live=False)
    assert ctx.late_stream == LATE_ALWAYS


def test_backfill_into_a_room_without_live_events_marks_nothing_it_could_reach():
    ctx = _room(head=(3, -1), last_stream=0)
    ctx.note_order((2, -2), live=False)
    assert ctx.late_stream is None  # a mark at 0 or below: no token's window holds these


def test_marks_are_never_lowered():
    ctx = _room(late=300)
    ctx.note_order((4, 105), live=True)
    assert ctx.late_stream == 300


def test_a_fork_is_equal_and_changes_to_it_leave_the_original_as_it_was():
    """What a batch plans on (``RoomContext.fork``): the cached context must stay as it was
    until the batch commits, whatever the batch changes."""
    from rooms.storage.plan_snapshot import Extremity
    from rooms.storage.visibility_ranges import RangeSet

    key = ("m.room.topic", "")
    original = RoomContext("!r", head=(3, 3), last_stream=3, current_group=5, current={key: "$t"},
                           memberships={"@a": "join", "@i": "invite"}, forward={"$x": Extremity((3, 3), 5)},
                           ranges={"@a": RangeSet([[(1, 1), None]], stored=1)}, last_join={"@a": (1, 1)},
                           undo=[(4, key, None)])
    original.remark()
    marks = list(original.marks)
    fork = original.fork()
    assert fork == original and fork.invited == {"@i"} and fork.ranges["@a"] is original.ranges["@a"]
    own = fork.user_ranges("@a")  # the fork's own copy once it is to be changed, stored count kept
    assert own is not original.ranges["@a"] and own == original.ranges["@a"] and own.stored == 1
    fork.writable_current()[("m.room.name", "")] = "$n"
    fork.memberships["@i"] = "join"
    fork.forward.pop("$x")
    fork.user_ranges("@a").close_at((4, 4))
    fork.user_ranges("@b").add((4, 4), None)
    fork.joined_at("@b", (4, 4))
    fork.undo.append((5, key, "$t"))
    fork.head = (4, 4)
    assert original.current == {key: "$t"} and original.invited == {"@i"} and "$x" in original.forward
    assert original.ranges["@a"].as_tuples() == [((1, 1), None)] and "@b" not in original.ranges
    assert original.last_join == {"@a": (1, 1)} and original.marks == marks
    assert original.undo == [(4, key, None)] and original.head == (3, 3)
    assert fork.invited == set() and original.ranges["@a"].stored == 1

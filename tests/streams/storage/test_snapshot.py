"""``RoomContext.note_order``: the marks behind ``rooms.late_stream``, which let incremental
sync skip ``*shared``'s walks from a token after them. A mark missed is a visible event
missed, so each way an event can sit before an earlier one of the stream is named here."""
from __future__ import annotations

from streams.storage.snapshot import LATE_ALWAYS, RoomContext


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

"""synapse_attach/progress.py: Synapse's persisted-upto rule, by value."""
from __future__ import annotations

from synapse_attach.catalogue import STREAMS, StreamTable
from synapse_attach.progress import PersistedUpto, max_stored, persisted_upto, walk_base, writer_positions
from synapse_attach.snapshot import PositionRow, TableFacts

EVENTS = next(s for s in STREAMS if s.name == "events")
BACKFILL = next(s for s in STREAMS if s.name == "backfill")
T1, T2 = StreamTable("events", "stream_ordering"), StreamTable("current_state_delta_stream", "stream_id")


def test_writer_positions_are_the_rows_of_the_generators_name_in_tokens():
    rows = [PositionRow("events", "master", 40), PositionRow("events", "persister1", 37),
            PositionRow("backfill", "master", -5), PositionRow("presence_stream", "master", 9)]
    assert writer_positions(EVENTS, rows) == {"master": 40, "persister1": 37}
    assert writer_positions(BACKFILL, rows) == {"master": 5}  # stored negated


def test_an_idle_writer_does_not_hold_it_back_when_the_others_ids_follow_on():
    # persister1 last wrote at 11; master wrote 12..15 since: all of it is persisted.
    tables = [TableFacts(T1, 15, (11, 12, 13, 15)), TableFacts(T2, 14, (14,))]
    assert persisted_upto({"master": 15, "persister1": 11}, tables) == PersistedUpto(15, 11)


def test_a_gap_holds_it_back_as_it_holds_synapse_back():
    # 13 was handed out and never stored (in flight, or rolled back): nothing passes it.
    tables = [TableFacts(T1, 15, (12, 14, 15))]
    assert persisted_upto({"master": 15, "persister1": 11}, tables) == PersistedUpto(12, 11)


def test_it_never_goes_below_the_lowest_writer():
    assert persisted_upto({"a": 20, "b": 30}, [TableFacts(T1, 30, (25, 30))]).position == 20


def test_without_positions_it_is_the_largest_stored_id_at_least_one():
    assert persisted_upto({}, [TableFacts(T1, 7), TableFacts(T2, 9)]) == PersistedUpto(9, None)
    assert persisted_upto({}, [TableFacts(T1, 0)]) == PersistedUpto(1, None)


def test_a_truncated_read_stops_the_walk_and_says_so():
    tables = [TableFacts(T1, 100, (3, 4, 5), truncated=True), TableFacts(T2, 9, (6, 7))]
    assert persisted_upto({"a": 2}, tables) == PersistedUpto(5, 2, complete=False)
    # a gap below the bound: the answer is exact
    tables = [TableFacts(T1, 100, (4, 5, 6), truncated=True)]
    assert persisted_upto({"a": 2}, tables) == PersistedUpto(2, 2, complete=True)


def test_walk_base_and_max_stored():
    assert walk_base({}) is None
    assert walk_base({"a": 4, "b": 2}) == 2
    assert max_stored([TableFacts(T1, 4), TableFacts(T2, 8)]) == 8
    assert max_stored([]) == 0

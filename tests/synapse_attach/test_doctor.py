"""synapse_attach/doctor.py: Synapse's start-up checks, predicted by value."""
from __future__ import annotations

from synapse_attach.catalogue import CHECKED_SEQUENCES, STREAMS, StreamTable
from synapse_attach.doctor import (
    POSITIONS_AHEAD_OF_SEQUENCE,
    SEQUENCE_BEHIND_TABLE,
    Finding,
    check_generator,
    check_sequence,
)
from synapse_attach.snapshot import PositionRow, SequenceState, TableFacts

RECEIPTS = next(s for s in STREAMS if s.name == "receipts")
BACKFILL = next(s for s in STREAMS if s.name == "backfill")
PRESENCE = next(s for s in STREAMS if s.name == "presence")
LINEARIZED = StreamTable("receipts_linearized", "stream_id")


def test_a_consistent_stream_has_no_findings():
    seq = SequenceState("receipts_sequence", 10, True)
    assert check_generator(RECEIPTS, seq, [TableFacts(LINEARIZED, 10)],
                           [PositionRow("receipts", "master", 10)]) == []


def test_is_called_false_means_last_value_was_not_handed_out():
    assert SequenceState("s", 10, False).allocated == 9
    findings = check_generator(RECEIPTS, SequenceState("receipts_sequence", 10, False),
                               [TableFacts(LINEARIZED, 10)], [])
    assert [(f.code, f.found, f.allocated) for f in findings] == [(SEQUENCE_BEHIND_TABLE, 10, 9)]


def test_a_table_ahead_of_its_sequence_is_named_with_synapses_setval():
    [finding] = check_generator(RECEIPTS, SequenceState("receipts_sequence", 5, True),
                                [TableFacts(LINEARIZED, 8)], [PositionRow("receipts", "master", 5)])
    assert finding == Finding(SEQUENCE_BEHIND_TABLE, "receipts_sequence", 5, 8, "receipts", "receipts_linearized",
                              "SELECT GREATEST(MAX(stream_id), 0) FROM receipts_linearized")
    assert finding.fix.endswith(
        "SELECT setval('receipts_sequence', (SELECT GREATEST(MAX(stream_id), 0) FROM receipts_linearized));")
    assert "next start" in finding.consequence


def test_a_position_ahead_of_its_sequence_means_synapse_will_not_start():
    positions = [PositionRow("presence_stream", "master", 12), PositionRow("presence_stream", "w1", 9),
                 PositionRow("receipts", "master", 99)]
    [finding] = check_generator(PRESENCE, SequenceState("presence_stream_sequence", 11, True),
                                [TableFacts(StreamTable("presence_stream", "stream_id"), 11)], positions)
    assert (finding.code, finding.found, finding.allocated, finding.stream) == (
        POSITIONS_AHEAD_OF_SEQUENCE, 12, 11, "presence")
    assert "IncorrectDatabaseSetup" in finding.consequence
    assert finding.fix.endswith("DELETE FROM stream_positions WHERE stream_name = 'presence_stream';")


def test_backfill_compares_its_stored_negative_positions_so_never_trips():
    tables = [TableFacts(StreamTable("events", "stream_ordering"), 3)]
    findings = check_generator(BACKFILL, SequenceState("events_backfill_stream_seq", 1, True), tables,
                               [PositionRow("backfill", "master", -30)])
    # the table (tokens: -MIN) is ahead; the stored position (-30) is not above 1
    assert [(f.code, f.table_max_sql) for f in findings] == [
        (SEQUENCE_BEHIND_TABLE, "SELECT GREATEST(-MIN(stream_ordering), 0) FROM events")]


def test_a_plain_sequence_gets_the_table_check_only():
    chain = CHECKED_SEQUENCES[0]
    assert check_sequence(chain, SequenceState(chain.sequence, 4, True), 4) == []
    [finding] = check_sequence(chain, SequenceState(chain.sequence, 4, True), 6)
    assert (finding.code, finding.stream, finding.table) == (SEQUENCE_BEHIND_TABLE, None, "event_auth_chains")

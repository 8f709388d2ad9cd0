"""synapse_attach/status.py: the report from a snapshot, by value."""
from __future__ import annotations

from synapse_attach.catalogue import CHECKED_SEQUENCES, generators
from synapse_attach.snapshot import PositionRow, SequenceState, Snapshot, TableFacts
from synapse_attach.status import format_text, report


def snapshot(**changes) -> Snapshot:
    """A quiet Synapse: every generator's sequence at 1, tables empty, no positions; then the
    changes (``events=(positions, last_value, ids)``)."""
    sequences = {s.sequence: SequenceState(s.sequence, 1, True) for s in generators()}
    sequences.update({c.sequence: SequenceState(c.sequence, 1, False) for c in CHECKED_SEQUENCES})
    tables = {s.name: tuple(TableFacts(t, 0) for t in s.tables) for s in generators()}
    rows: list[PositionRow] = []
    for name, (writers, last_value, ids) in changes.items():
        spec = next(s for s in generators() if s.name == name)
        sequences[spec.sequence] = SequenceState(spec.sequence, last_value, True)
        rows += [PositionRow(spec.positions_name, w, p) for w, p in writers.items()]
        first, *rest = spec.tables
        tables[name] = (TableFacts(first, max(ids, default=0), tuple(ids)),
                        *(TableFacts(t, 0) for t in rest))
    return Snapshot(tuple(rows), sequences, tables, {c.sequence: 0 for c in CHECKED_SEQUENCES}, "16.4")


def test_a_stream_with_two_writers_one_idle():
    result = report(snapshot(events=({"master": 9, "persister": 5}, 9, [5, 6, 7, 8, 9])))
    events = next(s for s in result.streams if s.spec.name == "events").as_dict()
    assert {k: events[k] for k in ("writers", "persisted_upto", "allocated", "max_stored", "findings")} == {
        "writers": [{"instance": "master", "position": 9}, {"instance": "persister", "position": 5}],
        "persisted_upto": 9, "allocated": 9, "max_stored": 9, "findings": []}
    assert result.findings == ()
    text = format_text(result)
    assert "events: persisted-upto 9, sequence events_stream_seq allocated 9, max stored 9\n" \
           "    writer master: 9\n    writer persister: 5" in text
    assert "caches: persisted-upto 1, sequence cache_invalidation_stream_seq allocated 1, max stored 0\n" \
           "    no positions recorded (any process writes this stream)" in text
    assert "federation: kept in memory by its writer (nothing in the database)" in text
    assert "sequence state_group_id_seq: allocated 0, max stored in state_groups 0" in text


def test_findings_are_gathered_and_printed_with_their_fix():
    result = report(snapshot(receipts=({"master": 12}, 10, [2, 3])))
    assert [(f.code, f.stream) for f in result.findings] == [("positions_ahead_of_sequence", "receipts")]
    assert result.as_dict()["findings"][0]["fix"].endswith(
        "DELETE FROM stream_positions WHERE stream_name = 'receipts';")
    assert "    fix: Stop Synapse and all its workers" in format_text(result)

"""The sequence doctor: what Synapse's start-up checks will find in its database, before it
restarts (docs/attach.md). Pure; every fix is shown, never run.

When Synapse builds an ID generator it compares, for each of the stream's tables, the
sequence's last allocated ID with the largest ID stored in the table and with the largest
position recorded in ``stream_positions`` for the stream (``synapse/storage/util/sequence.py``,
``PostgresSequenceGenerator.check_consistency``):

- a table ahead of its sequence is repaired at start-up: Synapse logs a warning and moves the
  sequence forward with ``setval``. Until it restarts, a writer may be handed an ID already
  stored.
- a recorded position ahead of the sequence stops Synapse from starting
  (``IncorrectDatabaseSetup``); its message tells the operator to stop every process and delete
  the stream's ``stream_positions`` rows. Synapse compares the stored value, so backfill's
  negative positions never trip it.

Plain sequences (``event_auth_chain_id``, ``application_services_txn_id_seq``,
``state_group_id_seq``) get the first check only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from synapse_attach.catalogue import CheckedSequence, StreamSpec, StreamTable
from synapse_attach.snapshot import PositionRow, SequenceState, TableFacts

#: A table's largest ID is above its sequence's last allocated ID (repaired at start-up).
SEQUENCE_BEHIND_TABLE = "sequence_behind_table"
#: A stream_positions row is above its sequence's last allocated ID (Synapse will not start).
POSITIONS_AHEAD_OF_SEQUENCE = "positions_ahead_of_sequence"


@dataclass(frozen=True)
class Finding:
    """One inconsistency, the figures that show it, what Synapse does about it, and the fix its
    documentation gives (SQL for the operator to run with every Synapse process stopped)."""

    code: str
    sequence: str
    allocated: int
    found: int
    stream: str | None = None
    table: str | None = None
    #: what gives the table's largest ID, as Synapse's check computes it
    table_max_sql: str | None = None
    #: the generator's name in stream_positions (positions findings)
    positions_name: str | None = None

    @property
    def consequence(self) -> str:
        if self.code == POSITIONS_AHEAD_OF_SEQUENCE:
            return ("Synapse refuses to start (IncorrectDatabaseSetup): stream_positions records "
                    f"{self.found} for {self.positions_name}, above the sequence's {self.allocated}")
        return (f"Synapse moves {self.sequence} forward at its next start (a warning in its log); "
                f"until then {self.table} holds {self.found}, above the sequence's {self.allocated}, "
                "and a new ID may collide with a stored one")

    @property
    def fix(self) -> str:
        if self.code == POSITIONS_AHEAD_OF_SEQUENCE:
            return ("Stop Synapse and all its workers, then run: "
                    f"DELETE FROM stream_positions WHERE stream_name = '{self.positions_name}';")
        return ("Restart Synapse (it repairs this itself), or with every Synapse process stopped run: "
                f"SELECT setval('{self.sequence}', ({self.table_max_sql}));")

    def as_dict(self) -> dict[str, object]:
        return {"code": self.code, "stream": self.stream, "positions_name": self.positions_name,
                "sequence": self.sequence, "table": self.table,
                "allocated": self.allocated, "found": self.found,
                "consequence": self.consequence, "fix": self.fix}


def table_max_sql(table: StreamTable, positive: bool = True) -> str:
    """Synapse's figure for a table's largest ID (backfill's stored IDs are negative)."""
    aggregate = f"MAX({table.column})" if positive else f"-MIN({table.column})"
    return f"SELECT GREATEST({aggregate}, 0) FROM {table.table}"


def _table_findings(sequence: SequenceState, tables: Sequence[tuple[StreamTable, int]],
                    stream: str | None, positive: bool = True) -> list[Finding]:
    return [Finding(SEQUENCE_BEHIND_TABLE, sequence.name, sequence.allocated, found, stream, table.table,
                    table_max_sql(table, positive))
            for table, found in tables if found > sequence.allocated]


def check_generator(spec: StreamSpec, sequence: SequenceState, tables: Sequence[TableFacts],
                    positions: Sequence[PositionRow]) -> list[Finding]:
    """Synapse's start-up checks of one ID generator: each table against the sequence, then the
    stream's largest stored ``stream_positions`` value against it."""
    findings = _table_findings(sequence, [(t.table, t.max_token) for t in tables], spec.name, spec.positive)
    stored = [r.stream_id for r in positions if r.stream_name == spec.positions_name]
    largest = max(stored, default=None)
    # Synapse skips an absent or zero maximum, and compares the stored (signed) value.
    if largest and largest > sequence.allocated:
        findings.append(Finding(POSITIONS_AHEAD_OF_SEQUENCE, sequence.name, sequence.allocated, largest,
                                spec.name, positions_name=spec.positions_name))
    return findings


def check_sequence(checked: CheckedSequence, sequence: SequenceState, table_max: int) -> list[Finding]:
    """Synapse's start-up check of a plain sequence against its table."""
    return _table_findings(sequence, [(checked.table, table_max)], None)

"""Where every stream of a Synapse stands, from one snapshot of its database: the report
``manage.py synapse_status`` prints (docs/attach.md). Pure: a :class:`Snapshot` in, records out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from synapse_attach.catalogue import CHECKED_SEQUENCES, OTHER_GENERATORS, STREAMS, CheckedSequence, StreamSpec
from synapse_attach.doctor import Finding, check_generator, check_sequence
from synapse_attach.progress import PersistedUpto, max_stored, persisted_upto, writer_positions
from synapse_attach.snapshot import SequenceState, Snapshot


@dataclass(frozen=True)
class StreamStatus:
    """One stream: its writers' recorded positions and the figures computed from them (tokens).

    ``allocated``: the sequence's largest handed-out ID; ``max_stored``: the largest ID in its
    tables. ``None`` throughout for a stream kept in memory (nothing in the database)."""

    spec: StreamSpec
    writers: dict[str, int]
    persisted_upto: PersistedUpto | None
    sequence: SequenceState | None
    max_stored: int | None
    findings: tuple[Finding, ...]

    @property
    def allocated(self) -> int | None:
        return None if self.sequence is None else self.sequence.allocated

    def as_dict(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "stream": spec.name,
            "replicated": spec.replicated,
            "in_memory": spec.in_memory,
            "positions_name": spec.positions_name,
            "sequence": spec.sequence,
            "tables": [f"{t.table}.{t.column}" for t in spec.tables],
            "sign": spec.sign,
            "records_positions": spec.records_positions,
            "writers": [{"instance": name, "position": pos} for name, pos in sorted(self.writers.items())],
            "persisted_upto": None if self.persisted_upto is None else self.persisted_upto.position,
            "persisted_upto_complete": None if self.persisted_upto is None else self.persisted_upto.complete,
            "last_value": None if self.sequence is None else self.sequence.last_value,
            "is_called": None if self.sequence is None else self.sequence.is_called,
            "allocated": self.allocated,
            "max_stored": self.max_stored,
            "findings": [f.as_dict() for f in self.findings],
        }


@dataclass(frozen=True)
class SequenceStatus:
    """A plain sequence Synapse checks at start-up, against its table."""

    checked: CheckedSequence
    sequence: SequenceState
    table_max: int
    findings: tuple[Finding, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"sequence": self.checked.sequence, "database": self.checked.database,
                "table": f"{self.checked.table.table}.{self.checked.table.column}",
                "last_value": self.sequence.last_value, "is_called": self.sequence.is_called,
                "allocated": self.sequence.allocated, "max_stored": self.table_max,
                "findings": [f.as_dict() for f in self.findings]}


@dataclass(frozen=True)
class Report:
    streams: tuple[StreamStatus, ...]
    sequences: tuple[SequenceStatus, ...]
    server_version: str = ""

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for s in self.streams for f in s.findings) + tuple(
            f for q in self.sequences for f in q.findings)

    def as_dict(self) -> dict[str, Any]:
        return {"server_version": self.server_version,
                "streams": [s.as_dict() for s in self.streams],
                "sequences": [q.as_dict() for q in self.sequences],
                "findings": [f.as_dict() for f in self.findings]}


def stream_status(spec: StreamSpec, snapshot: Snapshot) -> StreamStatus:
    if spec.in_memory or spec.sequence is None:
        return StreamStatus(spec, {}, None, None, None, ())
    tables = snapshot.stream_tables[spec.name]
    sequence = snapshot.sequences[spec.sequence]
    positions = writer_positions(spec, snapshot.positions)
    return StreamStatus(spec, positions, persisted_upto(positions, tables), sequence, max_stored(tables),
                        tuple(check_generator(spec, sequence, tables, snapshot.positions)))


def report(snapshot: Snapshot) -> Report:
    """Every stream of the catalogue (then the other generators), and the plain sequences."""
    streams = tuple(stream_status(spec, snapshot) for spec in STREAMS + OTHER_GENERATORS)
    sequences = tuple(
        SequenceStatus(c, snapshot.sequences[c.sequence], snapshot.checked_tables[c.sequence],
                       tuple(check_sequence(c, snapshot.sequences[c.sequence], snapshot.checked_tables[c.sequence])))
        for c in CHECKED_SEQUENCES if c.sequence in snapshot.sequences)
    return Report(streams, sequences, snapshot.server_version)


def _figure(value: int | None) -> str:
    return "-" if value is None else str(value)


def format_text(result: Report) -> str:
    """The report as an operator reads it in a terminal: one block per stream, findings last."""
    lines = []
    for s in result.streams:
        spec = s.spec
        if spec.in_memory:
            lines.append(f"{spec.name}: kept in memory by its writer (nothing in the database)")
            continue
        label = spec.name if spec.replicated else f"{spec.name} (not replicated)"
        upto = s.persisted_upto
        upto_text = "-" if upto is None else f"{upto.position}{'' if upto.complete else '+'}"
        lines.append(f"{label}: persisted-upto {upto_text}, sequence {spec.sequence} allocated "
                     f"{_figure(s.allocated)}, max stored {_figure(s.max_stored)}")
        if s.writers:
            lines.extend(f"    writer {name}: {pos}" for name, pos in sorted(s.writers.items()))
        elif spec.records_positions:
            lines.append("    no writer has recorded a position")
        else:
            lines.append("    no positions recorded (any process writes this stream)")
    for q in result.sequences:
        lines.append(f"sequence {q.checked.sequence}: allocated {q.sequence.allocated}, "
                     f"max stored in {q.checked.table.table} {q.table_max}")
    findings = result.findings
    lines.append("")
    if not findings:
        lines.append("doctor: no findings (Synapse's start-up checks would pass)")
    for f in findings:
        lines.append(f"doctor: {f.code}: {f.consequence}")
        lines.append(f"    fix: {f.fix}")
    return "\n".join(lines)

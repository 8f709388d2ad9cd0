"""What one read of Synapse's database yields: plain records, no I/O (docs/attach.md).

The reader (``reader.py``) fills them from one REPEATABLE READ transaction; the core
(``progress.py``, ``doctor.py``, ``status.py``) computes from them alone, so every rule is tested
by value. IDs are kept as Synapse stores them where the doctor needs the stored figure
(``stream_positions``), and as tokens (counting up: backfill's stored IDs negated) elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from synapse_attach.catalogue import StreamTable


@dataclass(frozen=True)
class SequenceState:
    """A PostgreSQL sequence as ``SELECT last_value, is_called FROM seq`` shows it."""

    name: str
    last_value: int
    is_called: bool

    @property
    def allocated(self) -> int:
        """The largest ID handed out: ``last_value``, or one less while ``nextval`` has not yet
        returned it (``is_called`` false); Synapse's ``get_max_allocated``."""
        return self.last_value if self.is_called else self.last_value - 1


@dataclass(frozen=True)
class PositionRow:
    """One row of Synapse's ``stream_positions``, the stored value as is."""

    stream_name: str
    instance_name: str
    stream_id: int


@dataclass(frozen=True)
class TableFacts:
    """One table of a stream, in tokens.

    ``max_token``: Synapse's start-up figure, ``GREATEST(MAX(id), 0)`` (``GREATEST(-MIN(id), 0)``
    for backfill). ``ids_from_base``: the distinct IDs at or above the stream's walk base,
    ascending, as far as read; ``truncated`` when the read stopped at its bound before the end.
    """

    table: StreamTable
    max_token: int
    ids_from_base: tuple[int, ...] = ()
    truncated: bool = False


@dataclass(frozen=True)
class Snapshot:
    """Everything the core needs, read at one instant of Synapse's main database (and of the
    state database when it is separate)."""

    positions: tuple[PositionRow, ...]
    sequences: Mapping[str, SequenceState]
    #: per stream (generator) name, its tables in catalogue order
    stream_tables: Mapping[str, tuple[TableFacts, ...]]
    #: per plain sequence name, its table's ``GREATEST(MAX(id), 0)``
    checked_tables: Mapping[str, int] = field(default_factory=dict)
    server_version: str = ""

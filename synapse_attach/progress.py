"""Where a Synapse stream stands, from its database alone: each writer's position and the
persisted-upto position, computed as Synapse's ``MultiWriterIdGenerator`` computes it for a
process that reads the stream (docs/attach.md). Pure.

Synapse's rule, as its generator applies it when it loads a stream: the persisted-upto
position starts at the lowest writer's recorded position, then walks up over every ID stored in
the stream's tables while they follow without a gap (an ID handed out and never stored, a
rollback, stops it). A writer idle since long ago therefore does not hold it back when the
others' IDs follow on from its position; a gap does, exactly as it holds Synapse's own readers
back. With no recorded position (a generator without writers, such as ``caches``) the position
is the largest stored ID, at least 1.

This project's own rule (``streams/positions.py::linear_from_records``) reads the reservations
its writers record; Synapse records none (which IDs are in flight lives in its processes'
memory), so the walk over stored IDs takes their place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from synapse_attach.catalogue import StreamSpec
from synapse_attach.snapshot import PositionRow, TableFacts


def writer_positions(spec: StreamSpec, rows: Iterable[PositionRow]) -> dict[str, int]:
    """Each writer's recorded position of ``spec``'s stream, in tokens (backfill's negated)."""
    if spec.positions_name is None:
        return {}
    return {r.instance_name: r.stream_id * spec.sign for r in rows if r.stream_name == spec.positions_name}


def walk_base(positions: Mapping[str, int]) -> int | None:
    """Where the walk over stored IDs starts: the lowest writer's position (``None``: no writer
    recorded one, nothing to walk)."""
    return min(positions.values(), default=None)


@dataclass(frozen=True)
class PersistedUpto:
    """The persisted-upto position (everything at or below it is stored or will never be).

    ``base``: the lowest writer's position it walked up from (``None``: no positions, the
    largest stored ID). ``complete``: false when the walk reached the bound of the IDs read,
    so the true position may be higher.
    """

    position: int
    base: int | None
    complete: bool = True


def persisted_upto(positions: Mapping[str, int], tables: Sequence[TableFacts]) -> PersistedUpto:
    """The persisted-upto position from the writers' positions and the stored IDs (tokens)."""
    base = walk_base(positions)
    if base is None:
        return PersistedUpto(max([1, *(t.max_token for t in tables)]), None)
    # IDs beyond the lowest bound reached by a truncated read are unknown: stop there.
    bound = min((t.ids_from_base[-1] for t in tables if t.truncated and t.ids_from_base), default=None)
    upto = base
    for stream_id in sorted({i for t in tables for i in t.ids_from_base}):
        if bound is not None and stream_id > bound:
            break
        if stream_id <= upto:
            continue
        if stream_id != upto + 1:
            break
        upto = stream_id
    return PersistedUpto(upto, base, complete=bound is None or upto < bound)


def max_stored(tables: Sequence[TableFacts]) -> int:
    """The largest ID stored in any of the stream's tables, in tokens (0: none)."""
    return max((t.max_token for t in tables), default=0)

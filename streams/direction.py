"""Which way a stream's IDs go: the one place where a backwards stream's sign flips.

Every stream counts up where IDs are *counted*: the sequence, the position bookkeeping
(:mod:`streams.positions`) and the tokens on the wire (RDATA, POSITION, catch-up). A
backwards stream (Synapse's ``backfill``) *stores* its IDs negated: -1, -2, ... in the tables
and in ``stream_positions``, so that they sort below the forward stream sharing its table.
:meth:`IdDirection.to_wire` and :meth:`IdDirection.from_wire` convert between the two; the
SQL helpers say the same in queries over stored IDs. Pure: no Django, no database.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class IdDirection:
    backwards: bool

    def to_wire(self, stream_id: int) -> int:
        """The token (counting up) of a stored stream ID."""
        return -stream_id if self.backwards else stream_id

    def from_wire(self, token: int) -> int:
        """The stored stream ID of a token."""
        return -token if self.backwards else token

    # -- many at once (a writer's hot path: no call per ID) ----------------------------------

    def select_in_order(self, ids: Iterable[int], lo: int, hi: int) -> list[int]:
        """The stored IDs among ``ids`` whose token is in ``(lo, hi]``, in token order,
        compared and sorted in C (a writer takes its journal this way, every batch)."""
        if self.backwards:
            return sorted((i for i in ids if -hi <= i < -lo), reverse=True)
        return sorted(i for i in ids if lo < i <= hi)

    def pairs_to_wire(self, pairs: Sequence[tuple[int, T]]) -> Sequence[tuple[int, T]]:
        """``(to_wire(stored ID), value)`` of each pair: ``pairs`` itself going forwards."""
        if self.backwards:
            return [(-i, value) for i, value in pairs]
        return pairs

    # -- queries over stored IDs -----------------------------------------------------------

    def lookups(self, field: str, lo: int, hi: int) -> dict[str, int]:
        """Django lookups: stored ``field`` whose token is in ``(lo, hi]``."""
        if self.backwards:
            return {f"{field}__lt": -lo, f"{field}__gte": -hi}
        return {f"{field}__gt": lo, f"{field}__lte": hi}

    def ascending(self, field: str) -> str:
        """Django ``order_by`` of stored ``field`` in token order."""
        return f"-{field}" if self.backwards else field

    def highest_sql(self, column: str) -> str:
        """SQL for the highest token among stored ``column`` values."""
        return f"-MIN({column})" if self.backwards else f"MAX({column})"

    def behind_sql(self) -> str:
        """SQL comparison ``a {op} b``: stored ``a``'s token is below stored ``b``'s."""
        return ">" if self.backwards else "<"

    def from_token_sql(self) -> str:
        """SQL comparison ``a {op} b``: stored ``a``'s token is at or above stored ``b``'s."""
        return "<=" if self.backwards else ">="


FORWARDS = IdDirection(backwards=False)
BACKWARDS = IdDirection(backwards=True)


def direction(backwards: bool) -> IdDirection:
    return BACKWARDS if backwards else FORWARDS

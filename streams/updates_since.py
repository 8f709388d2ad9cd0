"""Reading a stream's rows back: ``get_updates_since``, the update function every sender
(RDATA after a write, catch-up over HTTP, legacy REPLICATE) uses, with the limits of Synapse's
``Stream.get_updates_since`` (``synapse/replication/tcp/streams/_base.py``; docs/replication.md,
"Catch-up").

Contract (Synapse's): the rows one writer wrote in ``(from_token, upto_token]``, sorted by
token, at most about ``limit`` of them. When limited, the returned bound is a token such that
*all* rows up to it were returned: rows sharing a token (one multi-row fact) are never split.
Tokens are in wire sign: backwards streams (``backfill``) use positive tokens, the negation of
their stream IDs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streams.direction import IdDirection
from streams.registry import BackingTable, StreamSpec

#: Synapse's ``_STREAM_UPDATE_TARGET_ROW_COUNT``.
TARGET_ROW_COUNT = 100


@dataclass(frozen=True)
class Updates:
    """``updates``: ``(token, wire row)`` sorted by token; ``upto_token``: how far they cover."""

    updates: list[tuple[int, list[Any]]]
    upto_token: int
    limited: bool


def _fetch(table: BackingTable, signs: IdDirection, instance: str, lo: int, hi: int, limit: int | None,
           using: str) -> list[tuple[int, list[Any]]]:
    """Rows of ``table`` by ``instance`` with wire token in ``(lo, hi]``, ordered."""
    model = table.model
    field = model.STREAM_ID_FIELD
    qs = (table.queryset(using).filter(instance_name=instance)
          .filter(**signs.lookups(field, lo, hi)).order_by(signs.ascending(field), "pk"))
    qs = qs.values_list(field, *table.fields)
    if limit is not None:
        qs = qs[:limit]
    return [(signs.to_wire(row[0]), table.to_wire(list(row[1:]))) for row in qs]


def get_updates_since(
    spec: StreamSpec,
    instance_name: str,
    from_token: int,
    upto_token: int,
    *,
    limit: int = TARGET_ROW_COUNT,
    using: str = "default",
) -> Updates:
    if from_token >= upto_token or not spec.db_backed:
        return Updates([], upto_token, False)
    signs = spec.direction
    bound = upto_token
    limited = False
    per_table: list[list[tuple[int, list[Any]]]] = []
    for table in spec.tables:
        rows = _fetch(table, signs, instance_name, from_token, bound, limit + 1, using)
        if len(rows) > limit:
            limited = True
            # The first row left out marks where this table's complete rows end.
            cut = rows[limit][0]
            rows = [r for r in rows if r[0] < cut]
            if rows:
                bound = min(bound, rows[-1][0])
            else:
                # More than `limit` rows share one token: take that token whole.
                rows = _fetch(table, signs, instance_name, cut - 1, cut, None, using)
                bound = min(bound, cut)
        per_table.append(rows)
    merged = [
        (token, index, row)
        for index, rows in enumerate(per_table)
        for token, row in rows
        if token <= bound
    ]
    # Per token, rows in table order (an event's ``ev`` row before its ``state`` rows).
    merged.sort(key=lambda item: (item[0], item[1]))
    return Updates([(token, row) for token, _, row in merged], bound, limited)



def get_all_writers_rows(spec: StreamSpec, from_token: int, upto_token: int, *,
                         using: str = "default") -> list[tuple[str, int, list[Any]]]:
    """Every writer's rows with wire token in ``(from_token, upto_token]``, as ``(writer,
    token, wire row)`` in token order (a token's rows in table order). Unpaged: callers keep
    the range short. The embedded endpoint reads what other local processes wrote with it."""
    if from_token >= upto_token or not spec.db_backed:
        return []
    signs = spec.direction
    merged: list[tuple[int, int, int, str, list[Any]]] = []
    for index, table in enumerate(spec.tables):
        model = table.model
        field = model.STREAM_ID_FIELD
        qs = table.queryset(using).filter(**signs.lookups(field, from_token, upto_token))
        for values in qs.values_list(field, "pk", "instance_name", *table.fields):
            merged.append((signs.to_wire(values[0]), index, values[1], values[2], table.to_wire(list(values[3:]))))
    merged.sort(key=lambda item: item[:3])
    return [(writer, token, row) for token, _, _, writer, row in merged]

"""Round-trip-frugal SQL helpers for the storage code (PostgreSQL).

A server-binding psycopg cursor on Django's own connection (so the same transaction) sends
whole columns as array parameters: one ``INSERT ... SELECT FROM unnest(...)`` per table and
batch, ``= ANY(%s)`` look-ups for any number of keys.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from django.db import connections


class StorageNeedsPostgres(RuntimeError):
    """The room event store runs on PostgreSQL (the full mode)."""


def check_postgres(using: str) -> None:
    vendor = connections[using].vendor
    if vendor != "postgresql":
        raise StorageNeedsPostgres(
            f"room event storage needs PostgreSQL (database {using!r} is {vendor}); set DATABASE_URL=postgres://..."
        )


@contextlib.contextmanager
def pg_cursor(using: str = "default") -> Iterator[Any]:
    """A server-binding cursor on the Django connection ``using`` (its current transaction)."""
    import psycopg

    check_postgres(using)
    connection = connections[using]
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        yield cursor


def insert_unnest(cursor: Any, table: str, columns: Sequence[str], types: Sequence[str],
                  rows: Sequence[Sequence[Any]], *, suffix: str = "") -> None:
    """Insert ``rows`` with one statement (nothing when there are none); arrays go in binary
    (no quoting pass over every text element)."""
    if not rows:
        return
    arrays = [list(col) for col in zip(*rows)]
    sql = "INSERT INTO {} ({}) SELECT * FROM unnest({}) {}".format(
        table, ", ".join(columns), ", ".join(f"%b::{t}[]" for t in types), suffix
    )
    cursor.execute(sql, arrays)

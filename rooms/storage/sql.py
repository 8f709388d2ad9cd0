"""The room event store's dialect boundary: where its SQL differs between PostgreSQL and
SQLite (``streams/dialect.py`` says where else the dialects differ).

* **PostgreSQL** (the full mode): a server-binding psycopg cursor on Django's own connection
  (so the same transaction) sends whole columns as binary array parameters: one
  ``INSERT ... SELECT FROM unnest(...)`` per table and batch, ``= ANY(%s)`` look-ups for any
  number of keys, ``DELETE ... USING unnest(...)``, and a pipeline for the writes of a batch;
  reads take their rows in binary (:func:`fetch_all`).
* **SQLite** (the embedded default): Django's cursor; a list of keys goes in as one JSON text
  parameter read with ``json_each`` (no limit on the number of keys, one statement text),
  inserts and deletes by ``executemany``. There is one writer per stream and the write
  transaction is ``IMMEDIATE`` (it holds the database's write lock from its first statement),
  so no row locks are needed.

Call sites build each statement from these helpers. A query is written twice only where the
dialects really differ, each such place asking :func:`is_sqlite` (and only these, a test
checks): the timelines and syncs of ``reads.py`` (PostgreSQL: ``LATERAL`` joins and
``DISTINCT ON`` over the visibility ranges, planned without bitmap scans; SQLite: one query
per room), the reach of chains and chain IDs of ``chain_cover.py`` (a sequence, or the largest
ID + 1), the state group IDs in ``state_groups.py`` (a sequence, or an ID table row) and its
cold read (each group's rows as joined strings, or row by row), and the
first membership per room and user in ``plan_loader.py`` (``DISTINCT ON``, or a window).
"""
from __future__ import annotations

import contextlib
import functools
import json
from typing import Any, Iterable, Iterator, Sequence

from django.db import connections

from streams.dialect import POSTGRESQL, SQLITE


class StorageUnsupported(RuntimeError):
    """The room event store runs on PostgreSQL or SQLite, not on this database."""


@functools.cache
def _postgres_cursor_class() -> Any:
    import psycopg

    class PostgresCursor(psycopg.Cursor):
        """A server-binding psycopg cursor that says which dialect it speaks."""

        vendor = POSTGRESQL

    return PostgresCursor


class SQLiteCursor:
    """Django's SQLite cursor (``%s`` and ``%(name)s`` placeholders), saying which dialect it speaks."""

    vendor = SQLITE

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor
        self.execute = cursor.execute
        self.executemany = cursor.executemany
        self.fetchone = cursor.fetchone
        self.fetchall = cursor.fetchall

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount


@contextlib.contextmanager
def store_cursor(using: str = "default") -> Iterator[Any]:
    """A cursor on the Django connection ``using`` (its current transaction), with ``vendor``."""
    connection = connections[using]
    vendor = connection.vendor
    if vendor == POSTGRESQL:
        connection.ensure_connection()
        with connection.wrap_database_errors, _postgres_cursor_class()(connection.connection) as cursor:
            yield cursor
    elif vendor == SQLITE:
        with connection.cursor() as cursor:
            yield SQLiteCursor(cursor)
    else:
        raise StorageUnsupported(f"room event storage needs PostgreSQL or SQLite (database {using!r} is {vendor})")


def is_sqlite(cursor: Any) -> bool:
    return cursor.vendor == SQLITE


# -- lists of keys ----------------------------------------------------------------------------

def in_array(cursor: Any, column: str, param: str = "%s") -> str:
    """SQL: ``column`` is one of the values of the list parameter ``param`` (see :func:`array`)."""
    if cursor.vendor == SQLITE:
        return f"{column} IN (SELECT value FROM json_each({param}))"
    return f"{column} = ANY({param})"


def array(cursor: Any, values: Iterable[Any]) -> Any:
    """A list parameter for :func:`in_array`."""
    if cursor.vendor == SQLITE:
        return json.dumps(list(values))
    return list(values)


#: what joins a list of strings sent as one parameter (:func:`text_list`)
_LIST_SEP = "\x1f"


def text_list(cursor: Any, values: Sequence[str], param: str = "%s") -> tuple[str, Any]:
    """A list of strings as one parameter: the SQL of the array it stands for (with ``param``
    for the parameter) and the parameter. On PostgreSQL the strings go joined into one and
    the server splits them: psycopg dumps a list element by element (a regular expression
    each), a sixth of a sync's own CPU for its ~2,000 event IDs. A list with the separator in
    a string goes as a list; on SQLite, as JSON (:func:`in_array`'s form: use that there)."""
    if cursor.vendor == SQLITE:
        return param, array(cursor, values)
    joined = _LIST_SEP.join(values)
    if values and joined.count(_LIST_SEP) == len(values) - 1:
        return f"string_to_array({param}, chr(31))", joined
    return f"CAST({param} AS text[])", list(values)


def fetch_all(cursor: Any, sql: str, params: Any) -> list[tuple[Any, ...]]:
    """The rows of a read; on PostgreSQL in binary: a ``bytea`` column (the events' JSON)
    comes hex-encoded in the text protocol -- twice its size, encoded by the server and
    decoded here -- and a big state's thousands of text rows skip the text parsing."""
    if cursor.vendor == SQLITE:
        cursor.execute(sql, params)
    else:
        cursor.execute(sql, params, binary=True)
    return cursor.fetchall()


def json_list(value: Any) -> list[Any]:
    """A JSON array column as read: decoded by psycopg, JSON text from SQLite."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


# -- writes -----------------------------------------------------------------------------------

def for_update(cursor: Any) -> str:
    """The row-lock clause (SQLite: none needed, the transaction holds the write lock)."""
    return "" if cursor.vendor == SQLITE else " FOR UPDATE"


def pipeline(cursor: Any) -> Any:
    """Send the statements of the block without waiting for each result (PostgreSQL)."""
    if cursor.vendor == SQLITE:
        return contextlib.nullcontext()
    return cursor.connection.pipeline()


def insert_rows(cursor: Any, table: str, columns: Sequence[str], types: Sequence[str],
                rows: Sequence[Sequence[Any]], *, suffix: str = "") -> None:
    """Insert ``rows`` (nothing when there are none). PostgreSQL: one statement, the columns as
    binary arrays of ``types`` (no quoting pass over every text element); SQLite: executemany.
    ``suffix`` (``ON CONFLICT ...``) is the same in both."""
    if not rows:
        return
    if cursor.vendor == SQLITE:
        sql = "INSERT INTO {} ({}) VALUES ({}) {}".format(
            table, ", ".join(columns), ", ".join(["%s"] * len(columns)), suffix)
        cursor.executemany(sql, rows)
        return
    arrays = [list(col) for col in zip(*rows)]
    sql = "INSERT INTO {} ({}) SELECT * FROM unnest({}) {}".format(
        table, ", ".join(columns), ", ".join(f"%b::{t}[]" for t in types), suffix
    )
    cursor.execute(sql, arrays)


def delete_rows(cursor: Any, table: str, columns: Sequence[str], types: Sequence[str],
                keys: Sequence[Sequence[Any]]) -> None:
    """Delete the rows of ``table`` whose ``columns`` equal one of ``keys``."""
    if not keys:
        return
    if cursor.vendor == SQLITE:
        cursor.executemany("DELETE FROM {} WHERE {}".format(table, " AND ".join(f"{c} = %s" for c in columns)),
                           keys)
        return
    cursor.execute(
        "DELETE FROM {t} d USING unnest({a}) AS k({c}) WHERE {w}".format(
            t=table, a=", ".join(f"%s::{t}[]" for t in types), c=", ".join(columns),
            w=" AND ".join(f"d.{c} = k.{c}" for c in columns)),
        [list(col) for col in zip(*keys)])


def delete_rows_after(cursor: Any, table: str, columns: Sequence[str], after: Sequence[str], types: Sequence[str],
                      keys: Sequence[Sequence[Any]]) -> None:
    """Delete the rows of ``table`` whose ``columns`` equal a key's first values and whose
    ``after`` columns, as a row, are greater than its last ones (an index on ``columns +
    after`` finds them)."""
    if not keys:
        return
    n = len(columns)
    if cursor.vendor == SQLITE:
        cursor.executemany("DELETE FROM {} WHERE {} AND ({}) > ({})".format(
            table, " AND ".join(f"{c} = %s" for c in columns), ", ".join(after), ", ".join(["%s"] * len(after))), keys)
        return
    names = [f"k{i}" for i in range(len(types))]
    cursor.execute(
        "DELETE FROM {t} d USING unnest({a}) AS k({c}) WHERE {w} AND ({d}) > ({k})".format(
            t=table, a=", ".join(f"%s::{t}[]" for t in types), c=", ".join(names),
            w=" AND ".join(f"d.{c} = k.{k}" for c, k in zip(columns, names)),
            d=", ".join(f"d.{c}" for c in after), k=", ".join(f"k.{k}" for k in names[n:])),
        [list(col) for col in zip(*keys)])

"""The jobs' thin I/O shell: tables in as DataFrames, results out through staging tables.

How rows travel (JDBC on PostgreSQL, Django's connection on SQLite) is the dialect's
(``dialect.py``). Results always land in a staging table
first; :func:`swap_in` then applies them in one transaction, so a job that fails at any
point before it leaves the live tables as they were.
"""
from __future__ import annotations

import contextvars
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from django.db import connections, transaction

from jobs.job_dialect import for_database


@dataclass(frozen=True)
class Query:
    """``SELECT <columns> FROM <source> [WHERE room_id IN rooms]`` with a Spark schema."""

    columns: Sequence[str]
    source: str  # a table, or a parenthesised subquery with an alias
    schema: str  # Spark DDL schema of the columns, in order
    partition_column: str | None = None
    #: a table whose partition column spans the rows' (``events``), when the bounds of
    #: ``source`` itself cost a scan of their own (a filter the database computes per row)
    bounds_source: str | None = None

    def sql(self, rooms: Sequence[str] | None, quote) -> str:
        return self.select(", ".join(self.columns), self.source, rooms, quote)

    def bounds_sql(self, rooms: Sequence[str] | None, quote) -> str | None:
        if not (self.bounds_source and self.partition_column):
            return None
        column = self.partition_column
        return self.select(f"min({column}), max({column})", self.bounds_source, rooms, quote)

    @staticmethod
    def select(what: str, source: str, rooms: Sequence[str] | None, quote) -> str:
        """``SELECT what FROM source``, only ``rooms``' rows if given."""
        text = f"SELECT {what} FROM {source}"
        if rooms is not None:
            text += f" WHERE room_id IN ({', '.join(quote(r) for r in rooms) or 'NULL'})"
        return text


def quote(value: str) -> str:
    """An SQL string literal (standard quoting: PostgreSQL with standard_conforming_strings, SQLite)."""
    if "\x00" in value:
        raise ValueError("room IDs cannot contain NUL")
    return "'" + value.replace("'", "''") + "'"


def consistent_cut(using: str = "default"):
    """A context in which every :func:`read` (and Django's connection, on SQLite) sees one
    snapshot of the database; it gives the cut, the largest stream ordering in it. A check
    compares the stored tables with its recomputation inside one: both sides then hold the
    same events, whatever is persisted while it runs. Every Spark action on what was read
    must run inside it (a read is lazy on PostgreSQL)."""
    return for_database(using).consistent_cut(using)


def scalar(sql: str, using: str = "default") -> Any:
    """The one value ``sql`` reads (a count), inside an open :func:`consistent_cut` from its
    snapshot, so a figure such as a check's ``rows_in`` describes the rows it compared."""
    return for_database(using).scalar(sql, using)


def read(spark, query: Query, rooms: Sequence[str] | None = None, *, using: str = "default",
         partitions: int | None = None):
    """The rows of ``query`` as a DataFrame (only ``rooms``' rows if given)."""
    return for_database(using).read(spark, query.sql(rooms, quote), query.columns, query.schema,
                                    query.partition_column, using, partitions, query.bounds_sql(rooms, quote))


def read_by_room(spark, query: Query, rooms: Sequence[str] | None = None, *, using: str = "default",
                 partitions: int | None = None):
    """As :func:`read`, in partitions that each hold whole rooms (one per core by default):
    per-room work runs on each partition as it is, with no shuffle."""
    partitions = partitions or max(1, spark.sparkContext.defaultParallelism)
    return for_database(using).read_by_room(spark, query.sql(rooms, quote), query.columns, query.schema,
                                            using, partitions)


#: the job whose run is making staging tables here (set by the runner while it holds the
#: job's lock): its tables are named after it, so a later run can drop a dead run's
staging_owner: contextvars.ContextVar[str | None] = contextvars.ContextVar("staging_owner", default=None)


def _owned_prefix(job: str) -> str:
    return f"job_staging_{job}__"


def drop_stale_staging(job: str, using: str = "default") -> list[str]:
    """Drop the staging tables of ``job``'s runs and return their names. Only for a caller
    holding ``job``'s lock: then no run of it is alive, and any table of its is a dead run's
    (a process killed between ``Staging.create`` and ``drop``: 81 MB per killed visibility
    run at 10 M events, left forever before)."""
    prefix = _owned_prefix(job)
    connection = connections[using]
    with connection.cursor() as cursor:
        stale = sorted(t for t in connection.introspection.table_names(cursor) if t.startswith(prefix))
        for table in stale:
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
    return stale


@dataclass
class Staging:
    """A staging table holding a job's result until it is swapped in."""

    name: str
    columns: Sequence[tuple[str, str]]  # (name, SQL type)
    using: str = "default"

    @classmethod
    def create(cls, job: str, columns: Sequence[tuple[str, str]], using: str = "default") -> "Staging":
        owner = staging_owner.get()
        prefix = _owned_prefix(owner) if owner else "job_staging_"
        stage = cls(f"{prefix}{job}_{uuid.uuid4().hex[:10]}", list(columns), using)
        cols = ", ".join(f"{n} {t}" for n, t in stage.columns)
        with connections[using].cursor() as cursor:
            cursor.execute(f"CREATE {for_database(using).staging_table} {stage.name} ({cols})")
        return stage

    def write(self, df) -> int:
        """Write ``df`` (with exactly this table's columns) into the staging table."""
        names = [n for n, _ in self.columns]
        return for_database(self.using).write(df.select(*names), self.name, names, self.using)

    def drop(self) -> None:
        with connections[self.using].cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {self.name}")


def swap_in(statements: Sequence[tuple[str, Sequence[Any]]], using: str = "default") -> list[int]:
    """Run ``statements`` (each reading a staging table) in one transaction; row counts."""
    counts = []
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params)
            counts.append(cursor.rowcount)
    return counts

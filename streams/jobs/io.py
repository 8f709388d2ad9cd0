"""The jobs' thin I/O shell: tables in as DataFrames, results out through staging tables.

Full mode reads and writes PostgreSQL over JDBC (Debian's driver; reads split into
partitions on a numeric column so every core pulls its share). On the embedded default the
rows come from SQLite through Django's connection. Results always land in a staging table
first; :func:`swap_in` then applies them in one transaction, so a job that fails at any
point before it leaves the live tables as they were.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from django.db import connections, transaction

from ..pg import connection_kwargs


@dataclass(frozen=True)
class Query:
    """``SELECT <columns> FROM <source> [WHERE room_id IN rooms]`` with a Spark schema."""

    columns: Sequence[str]
    source: str  # a table, or a parenthesised subquery with an alias
    schema: str  # Spark DDL schema of the columns, in order
    partition_column: str | None = None

    def sql(self, rooms: Sequence[str] | None, quote) -> str:
        text = f"SELECT {', '.join(self.columns)} FROM {self.source}"
        if rooms is not None:
            text += f" WHERE room_id IN ({', '.join(quote(r) for r in rooms) or 'NULL'})"
        return text


def jdbc_url(using: str = "default") -> tuple[str, dict[str, str]]:
    kw = connection_kwargs(using)
    url = f"jdbc:postgresql://{kw.get('host', 'localhost')}:{kw.get('port', 5432)}/{kw['dbname']}"
    props = {"driver": "org.postgresql.Driver"}
    if "user" in kw:
        props["user"] = kw["user"]
    if "password" in kw:
        props["password"] = kw["password"]
    return url, props


def quote(value: str) -> str:
    """An SQL string literal (standard quoting: PostgreSQL with standard_conforming_strings, SQLite)."""
    if "\x00" in value:
        raise ValueError("room IDs cannot contain NUL")
    return "'" + value.replace("'", "''") + "'"


def read(spark, query: Query, rooms: Sequence[str] | None = None, *, using: str = "default",
         partitions: int | None = None):
    """The rows of ``query`` as a DataFrame (only ``rooms``' rows if given)."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        url, props = jdbc_url(using)
        sql = query.sql(rooms, quote)
        reader = spark.read.format("jdbc").option("url", url).option("fetchsize", "10000")
        for k, v in props.items():
            reader = reader.option(k, v)
        partitions = partitions or max(2, spark.sparkContext.defaultParallelism * 2)
        if query.partition_column and partitions > 1:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT min({query.partition_column}), max({query.partition_column}) "
                               f"FROM ({sql}) AS bounds")
                low, high = cursor.fetchone()
            if low is not None and high > low:
                reader = (reader.option("partitionColumn", query.partition_column)
                          .option("lowerBound", str(low)).option("upperBound", str(high + 1))
                          .option("numPartitions", str(partitions)))
        df = reader.option("dbtable", f"({sql}) AS job_input").load()
        return df.select(*query.columns).to(spark.createDataFrame([], query.schema).schema)
    with connection.cursor() as cursor:
        cursor.execute(query.sql(rooms, quote))
        rows = cursor.fetchall()
    return spark.createDataFrame(rows, query.schema)


@dataclass
class Staging:
    """A staging table holding a job's result until it is swapped in."""

    name: str
    columns: Sequence[tuple[str, str]]  # (name, SQL type)
    using: str = "default"

    @classmethod
    def create(cls, job: str, columns: Sequence[tuple[str, str]], using: str = "default") -> "Staging":
        stage = cls(f"job_staging_{job}_{uuid.uuid4().hex[:10]}", list(columns), using)
        unlogged = "UNLOGGED " if connections[using].vendor == "postgresql" else ""
        cols = ", ".join(f"{n} {t}" for n, t in stage.columns)
        with connections[using].cursor() as cursor:
            cursor.execute(f"CREATE {unlogged}TABLE {stage.name} ({cols})")
        return stage

    def write(self, df) -> int:
        """Write ``df`` (with exactly this table's columns) into the staging table."""
        names = [n for n, _ in self.columns]
        df = df.select(*names)
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            url, props = jdbc_url(self.using)
            (df.write.format("jdbc").option("url", url).option("dbtable", self.name)
             .option("batchsize", "10000").option("rewriteBatchedInserts", "true")
             .options(**props).mode("append").save())
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM {self.name}")
                return cursor.fetchone()[0]
        sql = f"INSERT INTO {self.name} ({', '.join(names)}) VALUES ({', '.join('%s' for _ in names)})"
        n = 0
        batch: list[tuple[Any, ...]] = []
        with connection.cursor() as cursor:
            for row in df.toLocalIterator():
                batch.append(tuple(row))
                if len(batch) >= 10000:
                    cursor.executemany(sql, batch)
                    n += len(batch)
                    batch.clear()
            if batch:
                cursor.executemany(sql, batch)
                n += len(batch)
        return n

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

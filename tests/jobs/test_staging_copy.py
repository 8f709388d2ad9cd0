"""A job's result reaches its staging table unchanged on both databases (PostgreSQL: ``COPY``
of CSV from Spark's Python workers, where an empty string and a null look alike unless
quoted; SQLite: ``executemany`` through Django's connection)."""
from __future__ import annotations

import pytest
from django.db import connection

from jobs import io
from tests.rooms.storage.helpers import ON_BOTH_DATABASES  # noqa: F401

ROWS = [
    ("", 0, None),  # an empty string is not a null
    (None, None, 7),
    ('quote " and , comma', -1, 2**53 - 1),
    ("new\nline and \\N and \\. alone", 3, None),
    ("é ☃ \U0001f600", 4, 5),
] + [(f"row {i}", i, i * 2) for i in range(500)]  # several partitions


@ON_BOTH_DATABASES
def test_staged_rows_are_the_dataframe_rows(default_database, spark):
    df = spark.createDataFrame(ROWS, "name string, a long, b long").repartition(3)
    stage = io.Staging.create("copy_test", [("name", "text"), ("a", "bigint"), ("b", "bigint")])
    try:
        written = stage.write(df)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT name, a, b FROM {stage.name}")
            got = cursor.fetchall()
    finally:
        stage.drop()
    assert written == len(ROWS)
    key = lambda r: tuple((v is None, v) for v in r)  # noqa: E731
    assert sorted(got, key=key) == sorted(ROWS, key=key)

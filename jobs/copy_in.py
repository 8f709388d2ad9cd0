"""What a Spark Python worker runs to write a staging table with ``COPY``: no Django here, so
a worker imports only psycopg and pyarrow (a new worker pays every import; under load, seconds)."""
from __future__ import annotations

from typing import Any, Iterator


def copy_arrow_batches(batches: Iterator[Any], kwargs: dict[str, Any], copy_sql: str) -> Iterator[Any]:
    """Runs in a Python worker: COPY one partition's Arrow record batches into a table (one
    statement, so a failed task writes nothing) and yield one batch holding the row count.

    Every non-null value is quoted, so an empty string stays an empty string and only a
    null is NULL (PostgreSQL's CSV rule: an unquoted empty field)."""
    import io

    import psycopg
    import pyarrow as pa
    from pyarrow import csv

    options = csv.WriteOptions(include_header=False, quoting_style="all_valid")
    n = 0
    with psycopg.connect(**kwargs, autocommit=True, application_name="synapse_repl job staging") as conn:
        with conn.cursor() as cursor, cursor.copy(copy_sql) as copy:
            for batch in batches:
                if batch.num_rows:
                    buffer = io.BytesIO()
                    csv.write_csv(batch, buffer, options)
                    copy.write(buffer.getbuffer())
                    n += batch.num_rows
    yield pa.RecordBatch.from_pydict({"n": [n]})

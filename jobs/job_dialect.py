"""The batch jobs' dialect boundary: everything the jobs do differently on PostgreSQL (full
mode) and SQLite (the embedded default) is here, and nowhere else under ``jobs/``.

* **PostgreSQL**: Spark reads over JDBC (Debian's driver; reads split into partitions on a
  numeric column so every core pulls its share) and writes with ``COPY`` from its Python
  workers (psycopg, Arrow batches as CSV); staging tables are ``UNLOGGED``; a swap locks the
  tables it replaces (a persisting transaction waits for it, or it for them) and moves the
  chain-ID sequence on; one run per job holds a session advisory
  lock on a connection of its own; JSON fields are read as ``json``.
* **SQLite**: rows come and go through Django's connection; no table locks (the writing
  transaction holds the whole database), no sequences (a new chain ID is the largest + 1); the
  run's lock is an exclusive ``flock`` on a file in the state directory; JSON fields are read
  with ``json_extract``.

Both locks die with their holder (the server ends the session, the kernel drops the flock),
so a crashed run never blocks the next one.
"""
from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
from pathlib import Path
from typing import IO, Any, Iterator, Protocol, Sequence
from urllib.parse import quote as url_quote

from django.conf import settings
from django.db import connections

from jobs.copy_in import copy_arrow_batches
from streams.dialect import POSTGRESQL, SQLITE
from streams.pg import connection_kwargs, dedicated_connection


def try_flock(path: Path) -> IO[str] | None:
    """``path`` opened and locked exclusively (``flock``: the kernel lets go when the holder
    dies), or None if another process holds it."""
    file: IO[str] = open(path, "a+")
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        return None
    return file

#: the exported PostgreSQL snapshot every JDBC read of a check joins, while one is open
#: (:meth:`JobDialect.consistent_cut`)
_snapshot: contextvars.ContextVar[str | None] = contextvars.ContextVar("job_snapshot", default=None)
#: the connection holding the open cut's transaction (PostgreSQL), for the driver's own reads
_cut_connection: contextvars.ContextVar[Any] = contextvars.ContextVar("job_cut_connection", default=None)


def snapshot_init_statement(snapshot_id: str) -> str:
    """The statement each JDBC read opens its transaction with, to see exactly the snapshot
    ``snapshot_id`` exported (the reader runs it after turning autocommit off, before its
    query: ``SET TRANSACTION SNAPSHOT`` must come first in a REPEATABLE READ transaction)."""
    if not snapshot_id or not all(c.isascii() and (c.isalnum() or c == "-") for c in snapshot_id):
        raise ValueError(f"not a snapshot ID: {snapshot_id!r}")
    return f"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT '{snapshot_id}'"


class Closable(Protocol):
    def close(self) -> None: ...


class JobDialect:
    """What a job needs to know of its database; :func:`for_database` gives the one in use."""

    name: str
    #: SQL: the event's own declared depth, read from its stored JSON (column ``json``)
    declared_depth: str
    #: SQL: ``events`` as a subquery of ``room_id, event_id, stream_ordering,
    #: topological_ordering, depth`` (:attr:`declared_depth`), each event's JSON parsed once
    #: however often a query names ``depth``
    events_with_depth: str
    #: SQL: a history visibility event's ``content.history_visibility`` (column ``ev.json``)
    history_visibility: str
    #: SQL: a state event's ``auth_events`` as JSON text (column ``json``)
    auth_events: str
    #: SQL: the ``prev_events`` of event ``e`` as a JSON array (text), from ``event_edges``
    prev_events: str
    #: SQL: the base above which rebuilt chain IDs are moved (every chain ID in use or handed out)
    chain_id_base: str
    #: ``CREATE {staging_table} name (...)``
    staging_table: str

    def read(self, spark: Any, sql: str, columns: Sequence[str], schema: str, partition_column: str | None,
             using: str, partitions: int | None, bounds_sql: str | None = None) -> Any:
        """The rows of ``sql`` as a DataFrame of ``columns`` with the Spark ``schema``;
        ``bounds_sql``: the min and max of the partition column, if cheaper than over ``sql``."""
        raise NotImplementedError

    def read_by_room(self, spark: Any, sql: str, columns: Sequence[str], schema: str, using: str,
                     partitions: int) -> Any:
        """As :meth:`read`, in ``partitions`` partitions that each hold whole rooms (a room's
        rows never in two), so per-room work needs no shuffle."""
        raise NotImplementedError

    def write(self, df: Any, table: str, names: Sequence[str], using: str) -> int:
        """Append ``df`` (columns ``names``) to ``table``; the number of rows written."""
        raise NotImplementedError

    def lock_tables(self, tables: str) -> list[tuple[str, Sequence[Any]]]:
        """Statements that open a swap of ``tables`` so that persisting transactions wait."""
        return []

    def chain_id_catch_up(self) -> list[tuple[str, Sequence[Any]]]:
        """Statements that close a chain cover swap: the sequence continues after its IDs."""
        return []

    def rooms_filter(self, rooms: Sequence[str] | None) -> tuple[str, list[Any]]:
        """``WHERE`` clause and parameters of the job's stream bounds, for ``rooms``."""
        return "", []

    def scalar(self, sql: str, using: str) -> Any:
        """The one value ``sql`` reads: in the open consistent cut if there is one, else now.
        Here Django's connection, which holds the cut where the dialect opens it there."""
        with connections[using].cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()[0]

    def consistent_cut(self, using: str) -> contextlib.AbstractContextManager[int]:
        """Every read of the jobs inside sees one snapshot of the database: the committed
        events of one moment with exactly the state groups, ranges and chain rows written with
        them (the persist path writes those in its events' transaction). Gives the cut: the
        largest stream ordering in the snapshot (0 for none)."""
        raise NotImplementedError

    def try_lock(self, job: str, key: int, using: str) -> Closable | None:
        """Take the run lock of ``job`` (``key``: 64 bits of its name), or None if it is held.
        Closing what it returns releases the lock."""
        raise NotImplementedError

    def database_url(self, params: dict[str, Any]) -> str:
        """A ``DATABASE_URL`` naming the database of Django ``params`` (for a child process)."""
        raise NotImplementedError


class PostgresJobs(JobDialect):
    name = POSTGRESQL
    # \u0000 is valid JSON that PostgreSQL's jsonb refuses; read as json with it turned into
    # \u0001 (still valid wherever it stands, and event IDs never hold it) so one event
    # carrying it in its content cannot stop a job
    declared_depth = "(replace(convert_from(json, 'UTF8'), '\\u0000', '\\u0001')::json ->> 'depth')::bigint"
    # A column of a subquery that PostgreSQL pulls up is an expression again wherever the
    # outer query names it: the ordering jobs' filter named ``depth`` four times, and every
    # event's JSON was parsed four times (10.9 s of a backend's CPU per million events against
    # 3.2 s, docs/benchmarks.md). ``OFFSET 0`` keeps the lateral subquery from
    # being pulled up, so ``depth`` is computed once per row; ``events`` stays in the outer
    # query, so the partitions' stream bounds and the rooms' filter still reach its indexes.
    events_with_depth = ("(SELECT e.room_id, e.event_id, e.stream_ordering, e.topological_ordering, d.depth "
                         f"FROM events e CROSS JOIN LATERAL (SELECT {declared_depth} AS depth OFFSET 0) d)")
    history_visibility = ("replace(convert_from(ev.json, 'UTF8'), '\\u0000', '\\u0001')::json -> 'content' "
                          "->> 'history_visibility'")
    auth_events = "(replace(convert_from(json, 'UTF8'), '\\u0000', '\\u0001')::json -> 'auth_events')::text"
    prev_events = "(SELECT json_agg(x.prev_event_id)::text FROM event_edges x WHERE x.event_id = e.event_id)"
    chain_id_base = ("greatest((SELECT coalesce(max(chain_id), 0) FROM event_auth_chains), "
                     "(SELECT last_value FROM event_auth_chain_id))")
    staging_table = "UNLOGGED TABLE"

    def read(self, spark, sql, columns, schema, partition_column, using, partitions, bounds_sql=None):
        url, props = jdbc_url(using)
        reader = spark.read.format("jdbc").option("url", url).option("fetchsize", "10000")
        for k, v in {**props, **_joined_snapshot()}.items():
            reader = reader.option(k, v)
        # one partition per core: each pulls its share over its own backend at the same time
        partitions = partitions or max(2, spark.sparkContext.defaultParallelism)
        if partition_column and partitions > 1:
            with connections[using].cursor() as cursor:
                cursor.execute(bounds_sql or f"SELECT min({partition_column}), max({partition_column}) "
                                             f"FROM ({sql}) AS bounds")
                low, high = cursor.fetchone()
            if low is not None and high > low:
                reader = (reader.option("partitionColumn", partition_column)
                          .option("lowerBound", str(low)).option("upperBound", str(high + 1))
                          .option("numPartitions", str(partitions)))
        df = reader.option("dbtable", f"({sql}) AS job_input").load()
        return df.select(*columns).to(spark.createDataFrame([], schema).schema)

    def read_by_room(self, spark, sql, columns, schema, using, partitions):
        # one predicate per partition on the room's hash: each backend scans the table and
        # sends only its rooms, which stay together in one Spark partition
        url, props = jdbc_url(using)
        predicates = [f"mod(abs(hashtext(room_id)::bigint), {partitions}) = {k}" for k in range(partitions)]
        df = spark.read.jdbc(url, f"({sql}) AS job_input", predicates=predicates,
                             properties={**props, "fetchsize": "10000", **_joined_snapshot()})
        return df.select(*columns).to(spark.createDataFrame([], schema).schema)

    def write(self, df, table, names, using):
        # COPY from the executors' Python workers, each partition one COPY of Arrow batches
        # turned into CSV in C++: several times faster than JDBC's batched INSERTs
        kwargs = connection_kwargs(using)
        copy_sql = f"COPY {table} ({', '.join(names)}) FROM STDIN (FORMAT csv)"
        counts = df.mapInArrow(lambda batches: copy_arrow_batches(batches, kwargs, copy_sql), "n long").collect()
        return sum(row.n for row in counts)

    def lock_tables(self, tables):
        return [(f"LOCK TABLE {tables} IN SHARE ROW EXCLUSIVE MODE", ())]

    def chain_id_catch_up(self):
        return [("SELECT setval('event_auth_chain_id', greatest((SELECT coalesce(max(chain_id), 0) "
                 "FROM event_auth_chains), (SELECT last_value FROM event_auth_chain_id)))", ())]

    def rooms_filter(self, rooms):
        return ("WHERE room_id = ANY(%s)", [list(rooms)]) if rooms else ("", [])

    @contextlib.contextmanager
    def consistent_cut(self, using: str) -> Iterator[int]:
        # One REPEATABLE READ transaction, open for the whole check, exports its snapshot;
        # every JDBC partition (a backend each) starts its transaction in it. The reader
        # turns autocommit off because of its fetch size, so the init statement opens the
        # partition's transaction.
        conn = dedicated_connection("synapse_repl job snapshot", using)
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            snapshot_id = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
            cut = conn.execute("SELECT coalesce(max(stream_ordering), 0) FROM events").fetchone()[0]
            token, held = _snapshot.set(snapshot_id), _cut_connection.set(conn)
            try:
                yield cut
            finally:
                _cut_connection.reset(held)
                _snapshot.reset(token)
        finally:
            conn.close()  # the snapshot goes with its transaction

    def scalar(self, sql, using):
        # inside a cut, on the connection that holds its snapshot (Django's sees commits since)
        conn = _cut_connection.get()
        if conn is None:
            return super().scalar(sql, using)
        return conn.execute(sql).fetchone()[0]

    def try_lock(self, job, key, using):
        conn = dedicated_connection(f"synapse_repl job lock {job}", using)
        if conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            return conn  # closing it ends the session: the advisory lock goes with it
        conn.close()
        return None

    def database_url(self, params):
        auth = url_quote(params.get("USER") or "", safe="")
        if params.get("PASSWORD"):
            auth += ":" + url_quote(params["PASSWORD"], safe="")
        host = params.get("HOST") or "localhost"
        port = f":{params['PORT']}" if params.get("PORT") else ""
        return f"postgres://{auth + '@' if auth else ''}{host}{port}/{url_quote(params['NAME'], safe='')}"


class SQLiteJobs(JobDialect):
    name = SQLITE
    declared_depth = "CAST(json_extract(CAST(json AS TEXT), '$.depth') AS INTEGER)"
    events_with_depth = ("(SELECT room_id, event_id, stream_ordering, topological_ordering, "
                         f"{declared_depth} AS depth FROM events)")
    history_visibility = "json_extract(CAST(ev.json AS TEXT), '$.content.history_visibility')"
    auth_events = "json_extract(CAST(json AS TEXT), '$.auth_events')"
    prev_events = "(SELECT json_group_array(x.prev_event_id) FROM event_edges x WHERE x.event_id = e.event_id)"
    chain_id_base = "(SELECT coalesce(max(chain_id), 0) FROM event_auth_chains)"
    staging_table = "TABLE"

    def read(self, spark, sql, columns, schema, partition_column, using, partitions, bounds_sql=None):
        with connections[using].cursor() as cursor:
            cursor.execute(sql)
            rows = cursor.fetchall()
        return spark.createDataFrame(rows, schema)

    def read_by_room(self, spark, sql, columns, schema, using, partitions):
        return self.read(spark, sql, columns, schema, None, using, None).repartition(partitions, "room_id")

    @contextlib.contextmanager
    def consistent_cut(self, using: str) -> Iterator[int]:
        # One deferred read transaction on the connection the reads use: under WAL its
        # snapshot is fixed by its first read and the writer goes on beside it. Not Django's
        # atomic(): the connection's transactions begin IMMEDIATE, which takes the write lock.
        connection = connections[using]
        if connection.in_atomic_block:
            raise RuntimeError("a consistent cut needs a connection outside a transaction")
        with connection.cursor() as cursor:
            cursor.execute("BEGIN DEFERRED")
            try:
                cursor.execute("SELECT coalesce(max(stream_ordering), 0) FROM events")
                cut = cursor.fetchone()[0]
                yield cut
            finally:
                cursor.execute("ROLLBACK")  # it wrote nothing

    def write(self, df, table, names, using):
        sql = f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('%s' for _ in names)})"
        n = 0
        batch: list[tuple[Any, ...]] = []
        with connections[using].cursor() as cursor:
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

    def try_lock(self, job, key, using):
        path = Path(settings.STATE_DIR) / "locks" / f"job-{job}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        file = try_flock(path)
        if file is None:
            return None
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()}\n")
        file.flush()
        return file  # closing it drops the flock

    def database_url(self, params):
        return f"sqlite:///{params['NAME']}"


_DIALECTS: dict[str, JobDialect] = {POSTGRESQL: PostgresJobs(), SQLITE: SQLiteJobs()}


def for_database(using: str = "default") -> JobDialect:
    """The dialect of Django's database ``using``."""
    vendor = connections[using].vendor
    try:
        return _DIALECTS[vendor]
    except KeyError:
        raise RuntimeError(f"the batch jobs need PostgreSQL or SQLite (database {using!r} is {vendor})") from None


def _joined_snapshot() -> dict[str, str]:
    """The JDBC options that make a read join the open cut's snapshot (none outside one)."""
    snapshot_id = _snapshot.get()
    return {"sessionInitStatement": snapshot_init_statement(snapshot_id)} if snapshot_id else {}


def jdbc_url(using: str = "default") -> tuple[str, dict[str, str]]:
    """The JDBC URL and properties of PostgreSQL database ``using``."""
    kw = connection_kwargs(using)
    url = f"jdbc:postgresql://{kw.get('host', 'localhost')}:{kw.get('port', 5432)}/{kw['dbname']}"
    props = {"driver": "org.postgresql.Driver"}
    if "user" in kw:
        props["user"] = kw["user"]
    if "password" in kw:
        props["password"] = kw["password"]
    return url, props

"""Synapse's own database as the audit jobs read it (docs/jobs.md, "Synapse audits"): the
thin I/O shell under ``synapse_audit_jobs``, read-only by construction.

* **Where**: ``SYNAPSE_DATABASE_URL`` (``settings.SYNAPSE_ATTACH["DATABASE_URL"]``, the
  setting ``synapse_attach`` reads too) and, when Synapse keeps its ``state_group*`` tables
  apart, ``SYNAPSE_STATE_DATABASE_URL``. Never a Django database: no migration or ORM write
  can reach it.
* **Read-only three times over**: the role the operator gives is meant to have SELECT only;
  every JDBC connection is opened read-only (pgjdbc's ``readOnly=true`` with
  ``readOnlyMode=always``, which also covers autocommit statements) and with
  ``default_transaction_read_only=on`` in its start-up ``options``; the snapshot's own psycopg
  connection gets the same option and runs one ``REPEATABLE READ READ ONLY`` transaction.
* **One consistent cut**: a psycopg connection per database opens that transaction and
  exports its snapshot (``pg_export_snapshot()``), holding it open until the audit's last
  Spark action; every JDBC partition starts its own transaction in it (``SET TRANSACTION
  SNAPSHOT``), so every table of a database is read as of one instant. Two databases cannot
  share a snapshot: the main database's cut is taken first, then the state database's, so the
  state cut holds every group an event of the main cut names (Synapse writes a group before
  the event that refers to it); groups newer than that are judged by no audit
  (:attr:`SynapseCut.newest_referenced_group`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator
from urllib.parse import parse_qsl, unquote, urlsplit

from common.url_redaction import redact_text, redact_url

#: what the audit connections call themselves in ``pg_stat_activity``
APPLICATION_NAME = "synapse_repl audit (read-only)"
#: libpq start-up options of every audit connection: no transaction of theirs may write
READ_ONLY_OPTIONS = "-c default_transaction_read_only=on"

MAIN = "main"
STATE = "state"


class SynapseSourceError(RuntimeError):
    """A mistake an operator can fix (a setting unset or malformed, a database unreachable, a
    grant missing): its message says what to do, in one line."""


@dataclass(frozen=True)
class SynapseDatabases:
    """Where Synapse's tables are: the main database, and the state database if apart."""

    main_url: str
    state_url: str = ""

    @classmethod
    def from_settings(cls) -> "SynapseDatabases":
        from django.conf import settings

        values = getattr(settings, "SYNAPSE_ATTACH", {}) or {}
        url = values.get("DATABASE_URL", "")
        if not url:
            raise SynapseSourceError("SYNAPSE_DATABASE_URL is not set: point it at Synapse's database, as a "
                                     "role with SELECT only (docs/attach.md)")
        state = values.get("STATE_DATABASE_URL", "")
        for name, value in (("SYNAPSE_DATABASE_URL", url), ("SYNAPSE_STATE_DATABASE_URL", state)):
            if value and not value.startswith(("postgres://", "postgresql://")):
                raise SynapseSourceError(f"{name}={redact_url(value)}: expected "
                                         "postgres://user:password@host/database (Synapse's PostgreSQL)")
        return cls(url, state)

    def url(self, database: str) -> str:
        return self.state_url if database == STATE and self.state_url else self.main_url


def jdbc_options(url: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties of the PostgreSQL URL ``url``, read-only."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    shown_host = f"[{host}]" if ":" in host else host
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise SynapseSourceError(f"{redact_url(url)}: the URL names no database")
    props = {"driver": "org.postgresql.Driver", "readOnly": "true", "readOnlyMode": "always",
             "options": READ_ONLY_OPTIONS, "ApplicationName": APPLICATION_NAME}
    if parts.username:
        props["user"] = unquote(parts.username)
    if parts.password:
        props["password"] = unquote(parts.password)
    for key, value in parse_qsl(parts.query):
        if key in ("sslmode", "sslrootcert", "sslcert", "sslkey"):
            props[key] = value
    return f"jdbc:postgresql://{shown_host}:{parts.port or 5432}/{database}", props


def connect_read_only(url: str) -> Any:
    """A psycopg connection to ``url`` on which no transaction can write."""
    import psycopg

    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10, application_name=APPLICATION_NAME,
                               options=READ_ONLY_OPTIONS)
    except psycopg.Error as e:
        raise SynapseSourceError(f"cannot connect to Synapse's database at {redact_url(url)}: "
                                 f"{redact_text(' '.join(str(e).split()))}") from None


def _snapshot_statement(snapshot_id: str) -> str:
    if not snapshot_id or not all(c.isascii() and (c.isalnum() or c == "-") for c in snapshot_id):
        raise ValueError(f"not a snapshot ID: {snapshot_id!r}")
    return ("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION READ ONLY; "
            f"SET TRANSACTION SNAPSHOT '{snapshot_id}'")


@dataclass
class SynapseCut:
    """The open snapshot of each database: every :meth:`read` and :meth:`rows` sees it."""

    databases: SynapseDatabases
    connections: dict[str, Any] = field(default_factory=dict)
    snapshots: dict[str, str] = field(default_factory=dict)
    #: the largest state group an event of the main cut refers to (0: none); a split state
    #: database's cut may hold newer groups, written for events the main cut does not have
    newest_referenced_group: int = 0

    def read(self, spark: Any, sql: str, schema: str, *, database: str = MAIN,
             partition_column: str | None = None, partitions: int | None = None) -> Any:
        """The rows of ``sql`` as a DataFrame with the Spark DDL ``schema`` (its columns in
        order), read over JDBC inside the cut; split on ``partition_column`` (numeric) between
        its bounds, one partition per core, so each core pulls its share over its own backend."""
        url, props = jdbc_options(self.databases.url(database))
        props = {**props, "fetchsize": "10000", "sessionInitStatement": _snapshot_statement(self.snapshots[database])}
        reader = spark.read.format("jdbc").option("url", url)
        for key, value in props.items():
            reader = reader.option(key, value)
        partitions = partitions or max(2, spark.sparkContext.defaultParallelism)
        if partition_column and partitions > 1:
            low, high = self.rows(f"SELECT min({partition_column}), max({partition_column}) FROM ({sql}) AS b",
                                  database=database)[0]
            if low is not None and high > low:
                reader = (reader.option("partitionColumn", partition_column).option("lowerBound", str(low))
                          .option("upperBound", str(high + 1)).option("numPartitions", str(partitions)))
        df = reader.option("dbtable", f"({sql}) AS audit_input").load()
        target = spark.createDataFrame([], schema).schema
        return df.select(*target.fieldNames()).to(target)

    def rows(self, sql: str, *params: Any, database: str = MAIN) -> list[tuple[Any, ...]]:
        """A small read on the driver, inside the cut (counts, bounds)."""
        import psycopg

        conn = self.connections[database if database in self.connections else MAIN]
        try:
            return list(conn.execute(sql, params or None).fetchall())
        except psycopg.Error as e:
            raise read_error(e) from None


def read_error(e: Exception) -> SynapseSourceError:
    """A failed read as the operator can act on it (a missing grant, not Synapse's schema)."""
    import psycopg

    message = redact_text(" ".join(str(e).split()) or type(e).__name__)
    if isinstance(e, psycopg.errors.InsufficientPrivilege):
        return SynapseSourceError(f"reading Synapse's database: {message}; grant the role read access: "
                                  "GRANT SELECT ON ALL TABLES IN SCHEMA public TO <role>;")
    if isinstance(e, psycopg.errors.UndefinedTable):
        return SynapseSourceError(f"reading Synapse's database: {message} (is this the database of "
                                  "Synapse 1.163.2? SYNAPSE_STATE_DATABASE_URL if its state is apart)")
    return SynapseSourceError(f"reading Synapse's database: {message}")


def _open(url: str) -> tuple[Any, str]:
    conn = connect_read_only(url)
    try:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        (snapshot_id,) = conn.execute("SELECT pg_export_snapshot()").fetchone()
    except Exception as e:
        conn.close()
        raise read_error(e) from None
    return conn, str(snapshot_id)


@contextlib.contextmanager
def synapse_cut(databases: SynapseDatabases | None = None) -> Iterator[SynapseCut]:
    """One consistent cut of Synapse's database(s), held open while the block runs: every
    Spark action on what was read must run inside it (a JDBC read is lazy)."""
    databases = databases or SynapseDatabases.from_settings()
    cut = SynapseCut(databases)
    try:
        cut.connections[MAIN], cut.snapshots[MAIN] = _open(databases.main_url)
        if databases.state_url:
            cut.connections[STATE], cut.snapshots[STATE] = _open(databases.state_url)
        else:
            cut.snapshots[STATE] = cut.snapshots[MAIN]
        cut.newest_referenced_group = int(cut.rows(
            "SELECT coalesce(max(state_group), 0) FROM event_to_state_groups")[0][0])
        yield cut
    finally:
        for conn in cut.connections.values():
            with contextlib.suppress(Exception):
                conn.close()  # the snapshot goes with its transaction; nothing was written


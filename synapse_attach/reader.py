"""The I/O shell: connections to Synapse's database that cannot write, and one consistent read
of everything the core needs (docs/attach.md).

Read-only by construction: these connections are psycopg's own, never a Django database (no
migration, no ORM save can reach them), and each is opened with
``default_transaction_read_only=on`` and a statement timeout in its start-up options, which
override any ``options`` the URL carries. The snapshot is one ``REPEATABLE READ READ ONLY``
transaction, so positions, sequences and tables are all of one instant. A URL appears in an
error only with its password masked.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors, sql

from common.error_text import one_line
from common.url_redaction import redact_text, redact_url
from synapse_attach.catalogue import CHECKED_SEQUENCES, StreamSpec, generators
from synapse_attach.progress import walk_base, writer_positions
from synapse_attach.snapshot import PositionRow, SequenceState, Snapshot, TableFacts

#: IDs read per table for the persisted-upto walk: a writer whose recorded position is far
#: behind (idle since long ago) would otherwise make one read scan the whole stream.
WALK_READ_LIMIT = 100_000

#: What to grant, named in the error when the role cannot read something.
GRANT_HINT = ("grant the role read access: GRANT SELECT ON ALL TABLES IN SCHEMA public TO <role>; "
              "GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO <role>;")


class AttachError(Exception):
    """A mistake an operator can fix (unset variable, unreachable database, missing grant):
    shown as one line, never a traceback."""


@dataclass(frozen=True)
class AttachSettings:
    database_url: str
    state_database_url: str = ""
    statement_timeout_seconds: float = 10.0
    connect_timeout_seconds: int = 5

    @classmethod
    def from_settings(cls, values: dict[str, Any]) -> "AttachSettings":
        url = values.get("DATABASE_URL", "")
        if not url:
            raise AttachError("SYNAPSE_DATABASE_URL is not set: point it at Synapse's database, as a role "
                              "with SELECT only (docs/attach.md)")
        for name, value in (("SYNAPSE_DATABASE_URL", url),
                            ("SYNAPSE_STATE_DATABASE_URL", values.get("STATE_DATABASE_URL", ""))):
            if value and not value.startswith(("postgres://", "postgresql://")):
                raise AttachError(f"{name}={redact_url(value)}: expected postgres://user:password@host/database "
                                  "(Synapse's PostgreSQL)")
        return cls(url, values.get("STATE_DATABASE_URL", ""),
                   float(values.get("STATEMENT_TIMEOUT_SECONDS", 10.0)),
                   int(values.get("CONNECT_TIMEOUT_SECONDS", 5)))


def connect_read_only(url: str, *, statement_timeout_seconds: float = 10.0,
                      connect_timeout_seconds: int = 5) -> psycopg.Connection[Any]:
    """A connection to Synapse's database on which every transaction is read-only."""
    timeout_ms = max(1, int(statement_timeout_seconds * 1000))
    try:
        return psycopg.connect(
            url, autocommit=True, connect_timeout=connect_timeout_seconds,
            application_name="synapse_repl attach (read-only)",
            options=f"-c default_transaction_read_only=on -c statement_timeout={timeout_ms}")
    except psycopg.Error as e:
        raise AttachError(f"cannot connect to Synapse's database at {redact_url(url)}: "
                          f"{redact_text(one_line(e))}") from None


def _read_error(e: psycopg.Error, what: str) -> AttachError:
    message = redact_text(one_line(e))
    if isinstance(e, errors.InsufficientPrivilege):
        return AttachError(f"reading {what}: {message}; {GRANT_HINT}")
    if isinstance(e, errors.UndefinedTable):
        return AttachError(f"reading {what}: {message} (is this the main database of Synapse 1.163.2?)")
    if isinstance(e, errors.QueryCanceled):
        return AttachError(f"reading {what}: {message} (SYNAPSE_STATEMENT_TIMEOUT_SECONDS)")
    return AttachError(f"reading {what}: {message}")


def _one(conn: psycopg.Connection[Any], query: sql.Composable | str, what: str, *params: Any) -> Any:
    try:
        return conn.execute(query, params or None).fetchone()
    except psycopg.Error as e:
        raise _read_error(e, what) from None


def _sequence(conn: psycopg.Connection[Any], name: str) -> SequenceState:
    last_value, is_called = _one(conn, sql.SQL("SELECT last_value, is_called FROM {}").format(
        sql.Identifier(name)), f"sequence {name}")
    return SequenceState(name, int(last_value), bool(is_called))


def _table_max(conn: psycopg.Connection[Any], table: str, column: str, positive: bool) -> int:
    aggregate = "MAX" if positive else "-MIN"
    (value,) = _one(conn, sql.SQL("SELECT GREATEST({agg}({col}), 0) FROM {table}").format(
        agg=sql.SQL(aggregate), col=sql.Identifier(column), table=sql.Identifier(table)), f"table {table}")
    return int(value)


def _ids_from(conn: psycopg.Connection[Any], table: str, column: str, positive: bool, base: int,
              limit: int) -> tuple[tuple[int, ...], bool]:
    """The distinct IDs (tokens) at or above ``base``, ascending, at most ``limit``."""
    if positive:
        query = sql.SQL("SELECT DISTINCT {col} FROM {table} WHERE {col} >= %s ORDER BY {col} LIMIT %s")
        bound = base
    else:  # stored negated: tokens >= base are stored IDs <= -base
        query = sql.SQL("SELECT DISTINCT {col} FROM {table} WHERE {col} <= %s ORDER BY {col} DESC LIMIT %s")
        bound = -base
    try:
        rows = conn.execute(query.format(col=sql.Identifier(column), table=sql.Identifier(table)),
                            (bound, limit)).fetchall()
    except psycopg.Error as e:
        raise _read_error(e, f"table {table}") from None
    sign = 1 if positive else -1
    return tuple(int(r[0]) * sign for r in rows), len(rows) >= limit


def _stream_tables(conn: psycopg.Connection[Any], spec: StreamSpec, positions: tuple[PositionRow, ...],
                   limit: int) -> tuple[TableFacts, ...]:
    base = walk_base(writer_positions(spec, positions))
    facts = []
    for t in spec.tables:
        max_token = _table_max(conn, t.table, t.column, spec.positive)
        ids: tuple[int, ...] = ()
        truncated = False
        if base is not None and max_token >= base:
            ids, truncated = _ids_from(conn, t.table, t.column, spec.positive, base, limit)
        facts.append(TableFacts(t, max_token, ids, truncated))
    return tuple(facts)


def _end(conn: psycopg.Connection[Any]) -> None:
    """End the read transaction (nothing was written; a broken connection is closed anyway)."""
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        pass


def read_snapshot(conn: psycopg.Connection[Any], state_conn: psycopg.Connection[Any] | None = None, *,
                  walk_limit: int = WALK_READ_LIMIT) -> Snapshot:
    """Everything the core needs from Synapse's main database, in one REPEATABLE READ READ ONLY
    transaction (and the state database's sequence, when it is apart, in one of its own)."""
    try:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    except psycopg.Error as e:  # the connection dropped since it was opened
        raise _read_error(e, "a snapshot") from None
    try:
        (version,) = _one(conn, "SHOW server_version", "the server version")
        try:
            rows = conn.execute("SELECT stream_name, instance_name, stream_id FROM stream_positions").fetchall()
        except psycopg.Error as e:
            raise _read_error(e, "table stream_positions") from None
        positions = tuple(PositionRow(str(s), str(i), int(v)) for s, i, v in rows)
        sequences: dict[str, SequenceState] = {}
        stream_tables: dict[str, tuple[TableFacts, ...]] = {}
        for spec in generators():
            assert spec.sequence is not None
            sequences[spec.sequence] = _sequence(conn, spec.sequence)
            stream_tables[spec.name] = _stream_tables(conn, spec, positions, walk_limit)
        checked_tables: dict[str, int] = {}
        for checked in CHECKED_SEQUENCES:
            if checked.database == "state" and state_conn is not None:
                continue
            sequences[checked.sequence] = _sequence(conn, checked.sequence)
            checked_tables[checked.sequence] = _table_max(conn, checked.table.table, checked.table.column, True)
    finally:
        _end(conn)
    if state_conn is not None:
        for checked in CHECKED_SEQUENCES:
            if checked.database != "state":
                continue
            state_conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                sequences[checked.sequence] = _sequence(state_conn, checked.sequence)
                checked_tables[checked.sequence] = _table_max(state_conn, checked.table.table,
                                                              checked.table.column, True)
            finally:
                _end(state_conn)
    return Snapshot(positions, sequences, stream_tables, checked_tables, str(version))


def take_snapshot(settings: AttachSettings) -> Snapshot:
    """Connect (read-only), read one snapshot, close."""
    def connect(url: str) -> psycopg.Connection[Any]:
        return connect_read_only(url, statement_timeout_seconds=settings.statement_timeout_seconds,
                                 connect_timeout_seconds=settings.connect_timeout_seconds)

    with connect(settings.database_url) as conn:
        if not settings.state_database_url:
            return read_snapshot(conn)
        with connect(settings.state_database_url) as state_conn:
            return read_snapshot(conn, state_conn)

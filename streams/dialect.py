"""The streams' dialect boundary: what the stream machinery (writers, ID stores, the
endpoint, the commands, start-up) does differently on PostgreSQL and SQLite.

The dialects differ in three modules and nowhere else (tests/test_layout.py checks it):
this one, ``storage/sql.py`` (the room event store's SQL, and the list of its queries written
twice) and ``jobs/job_dialect.py`` (the batch jobs' reads, writes and locks); besides these,
``synapse_repl/settings.py`` sets SQLite's connection options (write lock at ``BEGIN``).

* **PostgreSQL** (full mode): any number of processes share the database, so a stream may
  have several writers and a writer several threads; stream IDs come from a sequence
  (``id_store.PostgresIdStore``); a writer's batch goes in by ``COPY``.
* **SQLite** (the embedded default): one file on this machine and one writing transaction
  at a time, so one writer per stream and one writing thread; stream IDs come from an ID
  table (``id_store.SQLiteIdStore``); rows go in by ``executemany``. Without Redis, the
  endpoint learns of other local processes' writes by reading the file
  (``replication/endpoint/local_scan.py``).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from django.db import connections

from streams.id_store import PostgresIdStore, SQLiteIdStore

if TYPE_CHECKING:
    from streams.id_store import IdStore

POSTGRESQL = "postgresql"
SQLITE = "sqlite"


def _vendor(using: str) -> str:
    vendor = connections[using].vendor
    if vendor not in (POSTGRESQL, SQLITE):
        raise RuntimeError(f"synapse_repl needs PostgreSQL or SQLite (database {using!r} is {vendor})")
    return vendor


def bounded_settings(using: str, timeout: float) -> dict[str, Any]:
    """A copy of database ``using``'s settings whose connection gives up within ``timeout``
    (the health checks'): on PostgreSQL a connect timeout (whole seconds, at least 2) and a
    statement timeout, on SQLite a busy timeout; never a pool (the checks' connection is
    closed after them)."""
    return bounded_settings_for(_vendor(using), connections[using].settings_dict, timeout)


def bounded_settings_for(vendor: str, settings_dict: dict[str, Any], timeout: float) -> dict[str, Any]:
    """:func:`bounded_settings` of a vendor and settings (pure)."""
    options = {k: v for k, v in settings_dict.get("OPTIONS", {}).items() if k != "pool"}
    if vendor == POSTGRESQL:
        options["connect_timeout"] = max(2, math.ceil(timeout))
        options["options"] = " ".join(filter(None, [
            options.get("options", ""), f"-c statement_timeout={int(timeout * 1000)}"]))
    elif vendor == SQLITE:
        options["timeout"] = timeout
    return {**settings_dict, "OPTIONS": options, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False}


def is_local_file(using: str = "default") -> bool:
    """The database is a file on this machine (SQLite): every process that writes it runs
    here, and a failed connection means a missing or unwritable directory."""
    return connections[using].vendor == SQLITE


def several_writers(using: str = "default") -> bool:
    """Several processes, or threads, may write at once (PostgreSQL); SQLite has one writing
    transaction at a time."""
    return _vendor(using) == POSTGRESQL


def commits_in_one_pipeline(using: str = "default") -> bool:
    """The writer may send a transaction's statements and its COMMIT as one pipeline on the
    raw connection (psycopg 3 on PostgreSQL); SQLite's writer goes through Django's atomic."""
    return connections[using].vendor == POSTGRESQL


def vendor_allows_several_writers(vendor: str) -> bool:
    """:func:`several_writers` of a database named by its Django vendor (a test's choice)."""
    return vendor == POSTGRESQL


def id_store_for(using: str, **kwargs: Any) -> "IdStore":
    """The ID store of a stream on database ``using`` (``kwargs``: the store's arguments)."""

    return PostgresIdStore(using=using, **kwargs) if _vendor(using) == POSTGRESQL else SQLiteIdStore(
        using=using, **kwargs)


def bulk_insert_sql(using: str, table: str, columns: Sequence[str],
                    types: Callable[[], Sequence[str]]) -> tuple[str, str] | None:
    """A writer's statements for many rows of ``table`` (quoted ``table`` and ``columns``;
    ``types``: their SQL types): ``(COPY ... FROM STDIN, INSERT ... SELECT FROM unnest(...))``
    on PostgreSQL (the second inside a pipeline, where COPY is not allowed); None on SQLite,
    whose writer uses ``executemany``."""
    if _vendor(using) != POSTGRESQL:
        return None
    copy_sql = "COPY {} ({}) FROM STDIN".format(table, ", ".join(columns))
    unnest_sql = "INSERT INTO {} ({}) SELECT * FROM unnest({})".format(
        table, ", ".join(columns), ", ".join(f"%b::{t}[]" for t in types()))
    return copy_sql, unnest_sql

"""The one write path of a stream: reserve IDs, insert the rows in one transaction, complete.

Design notes: docs/streams.md. ``StreamWriter.append`` is what ``write_facts``, the
benchmarks and (later) ``persist_events`` use. It inserts without model instances, because
the writer is a hot path: on PostgreSQL one ``INSERT ... SELECT * FROM unnest(arrays)`` per
table and transaction (one statement to parse and plan, values bound server-side, not quoted
into the SQL text), elsewhere ``executemany`` of one ``INSERT``.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from django.db import connections, transaction

from .id_generator import MultiWriterIdGenerator
from .models.base import FactModel
from .registry import StreamSpec

#: A row of a fact: the backing model and its field values (stream ID and writer excluded).
Row = tuple[type[FactModel], Mapping[str, Any]]


_REQUIRED = object()


@dataclass
class _InsertPlan:
    sql: str
    #: PostgreSQL only: the same insert taking one array per column.
    unnest_sql: str | None
    #: per column after the stream ID and writer: (field name, default, converter or None)
    columns: list[tuple[str, Any, Any]]
    #: the wire row of a written row: positions of the wire fields among ``columns``, and
    #: the table's row format
    wire_index: list[int]
    to_wire: Any


class WireJournal:
    """The wire rows of this writer's completed facts, until the replication streamer takes
    them: RDATA is built from what was written, without reading it back.

    Keyed by stream ID (external sign); a rolled-back fact is recorded with no rows.
    """

    def __init__(self) -> None:
        self._facts: dict[int, list[list[Any]]] = {}
        self._lock = threading.Lock()

    def record(self, ids: Sequence[int], rows: Mapping[int, list[list[Any]]]) -> None:
        with self._lock:
            for stream_id in ids:
                self._facts[stream_id] = rows.get(stream_id, [])

    def take(self, ids_after: int, ids_upto: int, factor: int = 1) -> list[tuple[int, list[list[Any]]]]:
        """Remove and return the facts with ``ids_after < factor * id <= ids_upto``, in order."""
        with self._lock:
            keys = sorted(k for k in self._facts if ids_after < factor * k <= ids_upto)
            return [(k, self._facts.pop(k)) for k in sorted(keys, key=lambda k: factor * k)]

    def __len__(self) -> int:
        return len(self._facts)


class StreamWriter:
    """Writes facts to one stream as this process's writer instance."""

    def __init__(self, spec: StreamSpec, generator: MultiWriterIdGenerator, *, using: str = "default") -> None:
        self.spec = spec
        self.generator = generator
        self.using = using
        self._plans: dict[type[FactModel], _InsertPlan] = {}
        #: set by the replication streamer: then every transaction records its wire rows
        self.journal: WireJournal | None = None
        self._local = threading.local()

    @contextlib.contextmanager
    def transaction(self, n_facts: int = 1) -> Iterator[list[int]]:
        """Reserve ``n_facts`` stream IDs and open the transaction that writes them.

        The IDs complete when the block ends, whether it commits or raises. Rows must be
        written with :meth:`insert_rows` (that is how replication learns them).
        """
        with self.generator.get_next_mult(n_facts) as ids:
            journal = self.journal
            wire: dict[int, list[list[Any]]] = {}
            self._local.wire = wire if journal is not None else None
            try:
                with transaction.atomic(using=self.using):
                    yield ids
            except BaseException:
                if journal is not None:
                    journal.record(ids, {})  # rolled back: facts with zero rows
                raise
            else:
                if journal is not None:
                    journal.record(ids, wire)
            finally:
                self._local.wire = None

    def append(self, facts: Sequence[Sequence[Row]]) -> list[int]:
        """Write ``facts`` (each a list of rows sharing one stream ID) in one transaction."""
        if not facts:
            return []
        with self.transaction(len(facts)) as ids:
            self.insert_rows(ids, facts)
        return ids

    def insert_rows(self, ids: Sequence[int], facts: Sequence[Sequence[Row]]) -> None:
        """Insert the rows of ``facts`` at ``ids`` inside the caller's open transaction."""
        if len(ids) != len(facts):
            raise ValueError(f"{len(facts)} facts but {len(ids)} stream IDs")
        by_model: dict[type[FactModel], list[list[Any]]] = {}
        instance = self.generator.instance_name
        wire: dict[int, list[list[Any]]] | None = getattr(self._local, "wire", None)
        for stream_id, rows in zip(ids, facts):
            for model, values in rows:
                plan = self._plan(model)
                params = [stream_id, instance]
                raw = []
                for name, default, prep in plan.columns:
                    v = values[name] if name in values else default
                    if v is _REQUIRED:
                        raise ValueError(f"{model.__name__}.{name} is required")
                    raw.append(v)
                    params.append(prep(v) if prep is not None and v is not None else v)
                by_model.setdefault(model, []).append(params)
                if wire is not None:
                    wire.setdefault(stream_id, []).append(plan.to_wire([raw[i] for i in plan.wire_index]))
        connection = connections[self.using]
        for model, params_list in by_model.items():
            plan = self._plans[model]
            if plan.unnest_sql is not None and len(params_list) > 1:
                self._insert_unnest(connection, plan.unnest_sql, params_list)
            else:
                with connection.cursor() as cursor:
                    cursor.executemany(plan.sql, params_list)

    @staticmethod
    def _insert_unnest(connection: Any, sql: str, rows: list[list[Any]]) -> None:
        import psycopg

        connection.ensure_connection()
        arrays = [list(column) for column in zip(*rows)]
        # Django's own cursor binds client-side; a server-binding cursor on the same
        # connection (and so the same transaction) sends the arrays as parameters.
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(sql, arrays)

    def _plan(self, model: type[FactModel]) -> _InsertPlan:
        plan = self._plans.get(model)
        if plan is not None:
            return plan
        if not any(t.model is model for t in self.spec.tables):
            raise ValueError(f"{model.__name__} is not a backing table of stream {self.spec.name}")
        connection = connections[self.using]
        meta = model._meta
        id_field = meta.get_field(model.STREAM_ID_FIELD)
        writer_field = meta.get_field("instance_name")
        fields = [
            f for f in meta.concrete_fields
            if not f.primary_key and f is not id_field and f is not writer_field
        ]
        columns = [id_field.column, writer_field.column, *(f.column for f in fields)]
        qn = connection.ops.quote_name
        sql = "INSERT INTO {} ({}) VALUES ({})".format(
            qn(meta.db_table), ", ".join(qn(c) for c in columns), ", ".join(["%s"] * len(columns))
        )

        def converter(field: Any) -> Any:
            internal = field.get_internal_type()
            if internal in ("CharField", "TextField", "BigIntegerField", "IntegerField", "BooleanField"):
                return None  # the driver takes these as they are
            return lambda v, f=field: f.get_db_prep_save(v, connection)

        def default(field: Any) -> Any:
            if field.has_default():
                return field.get_default()
            return None if field.null else _REQUIRED

        unnest_sql = None
        if connection.vendor == "postgresql":
            types = [id_field.db_type(connection), writer_field.db_type(connection),
                     *(f.db_type(connection) for f in fields)]
            unnest_sql = "INSERT INTO {} ({}) SELECT * FROM unnest({})".format(
                qn(meta.db_table), ", ".join(qn(c) for c in columns),
                ", ".join(f"%b::{t}[]" for t in types),
            )
        table = next(t for t in self.spec.tables if t.model is model)
        names = [f.name for f in fields]
        plan = _InsertPlan(sql, unnest_sql, [(f.name, default(f), converter(f)) for f in fields],
                           [names.index(name) for name in table.fields], table.to_wire)
        self._plans[model] = plan
        return plan

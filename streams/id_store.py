"""The database side of a stream ID generator: the sequence, the visible reservations and
``stream_positions``. Design notes: docs/streams.md.

* :class:`PostgresIdStore` reserves IDs with ``nextval`` and records the reservation in
  ``stream_reservations`` in the same statement, a transaction of its own committed before
  the rows are written: every process can see which IDs are pending, by whom and since when,
  even after the writer died. It runs on a connection of the store's own in autocommit
  (:meth:`PostgresIdStore.reserve`), or, when ``StreamWriter.append`` owns its transaction,
  in the writer's own pipeline ahead of it (:meth:`IdStore.reserve_statement`,
  :class:`PipelinedReservation`: no round trip of its own).
* :class:`SQLiteIdStore` stands in for the sequence with an ID table (``stream_sequences``);
  SQLite has one writer per stream, so the reservation runs on the Django connection before
  the writing transaction opens.

Which of the two a stream gets is chosen in ``streams/dialect.py``.

Both answer the start-up questions of docs/streams.md, "Start-up and recovery" (:meth:`load_state`).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

from django.db import connections, transaction

from streams.direction import IdDirection, direction
from streams.models import StreamPosition
from streams.pg import dedicated_connection

logger = logging.getLogger(__name__)

POSITIONS = "stream_positions"
RESERVATIONS = "stream_reservations"
SEQUENCES = "stream_sequences"


@dataclass(frozen=True)
class TableRef:
    """A backing table as the ID machinery sees it."""

    table: str
    id_column: str
    instance_column: str = "instance_name"


@dataclass(frozen=True)
class Reservation:
    reservation_id: int
    stream_ids: list[int]


@dataclass(frozen=True)
class PipelinedReservation:
    """One stream ID reserved and completed in the writer's own pipeline (one round trip):

    ``BEGIN; <reserve_sql>; COMMIT; <rows, with id_sql as their stream ID, as WITH clauses
    of completion_sql>``. The reservation commits (visible to every process) before the
    statement writing the rows starts; that statement deletes it and records the position
    in the same commit as the rows. ``id_sql`` and ``completion_sql`` find the ID and the
    reservation with ``currval``: they are this session's last ones.
    """

    reserve_sql: str
    reserve_params: tuple[Any, ...]
    id_sql: str
    completion_sql: str
    completion_params: tuple[Any, ...]


@dataclass(frozen=True)
class LoadedState:
    """What the database says at start-up (all values in the internal, positive sign)."""

    positions: dict[str, int]
    persisted_upto: int
    rows: list[tuple[str, int]]


class IdStore:
    """Common start-up logic; subclasses talk to one kind of database."""

    def __init__(
        self,
        *,
        stream_name: str,
        sequence: str,
        tables: Sequence[TableRef],
        instance_name: str,
        backwards: bool = False,
        using: str = "default",
    ) -> None:
        self.stream_name = stream_name
        self.sequence = sequence
        self.tables = list(tables)
        self.instance_name = instance_name
        self.direction = direction(backwards)
        self.using = using

    # -- implemented per database ------------------------------------------------------------

    def ensure_sequence(self, cursor: Any) -> None:
        raise NotImplementedError

    def sequence_last_value(self, cursor: Any) -> int:
        """The last ID handed out (0 if none)."""
        raise NotImplementedError

    def sequence_raw_last_value(self, cursor: Any) -> int:
        """The sequence's ``last_value`` as stored (Synapse reads it so, ignoring is_called)."""
        return self.sequence_last_value(cursor)

    def sequence_set_at_least(self, cursor: Any, value: int) -> None:
        raise NotImplementedError

    def reserve(self, n: int) -> Reservation:
        raise NotImplementedError

    def complete(self, reservation: Reservation, position: int | None) -> None:
        """Drop the reservation; record ``position`` (external sign) in stream_positions."""
        raise NotImplementedError

    def completion_statement(self, reservation: Reservation, position: int | None) -> tuple[str, tuple[Any, ...]] | None:
        """SQL and parameters that do :meth:`complete` inside the writer's own transaction,
        or ``None`` where completion must stay outside it. One statement (a writer may add
        its inserts as WITH clauses in front, so it runs all in one autocommit statement)."""
        return None

    def reserve_statement(self, n: int) -> tuple[str, tuple[Any, ...]] | None:
        """SQL and parameters that reserve ``n`` IDs as :meth:`reserve` does, for the writer
        to run in a transaction of its own on its own connection, committed before the
        transaction writing the rows begins (:meth:`reservation_from_row` reads its answer);
        ``None`` where reservations must go through :meth:`reserve`."""
        return None

    def reservation_from_row(self, row: Sequence[Any]) -> Reservation:
        raise NotImplementedError

    def pipelined_reservation(self, position_floor: int | None) -> PipelinedReservation | None:
        """The statements that reserve one ID and complete it in the writer's own pipeline
        (:class:`PipelinedReservation`), or ``None`` where there are none."""
        return None

    def raise_recorded_position(self, position: int) -> None:
        """Move this writer's existing stream_positions entry up to ``position`` (external
        sign); a writer with no entry yet gets one with its first write."""
        raise NotImplementedError

    def own_position_from_sequence(self) -> bool:
        return False

    # -- shared -----------------------------------------------------------------------------

    def _table_extreme(self, cursor: Any, ref: TableRef) -> int:
        cursor.execute(f"SELECT COALESCE({self.direction.highest_sql(ref.id_column)}, 0) FROM {ref.table}")
        return max(int(cursor.fetchone()[0]), 0)

    def _check_consistency(self, cursor: Any) -> None:
        """Never hand out an ID that is already in a table or a recorded position.

        Synapse refuses to start when ``stream_positions`` is ahead of the sequence (after a
        failover, a restore, a hard kill); we repair the sequence instead and say so.
        """
        highest = 0
        for ref in self.tables:
            highest = max(highest, self._table_extreme(cursor, ref))
        cursor.execute(
            f"SELECT {self.direction.highest_sql('stream_id')} FROM {POSITIONS} WHERE stream_name = %s",
            [self.stream_name],
        )
        recorded = cursor.fetchone()[0]
        if recorded is not None:
            highest = max(highest, int(recorded))
        # Read the sequence only now: every ID in the tables and positions read above came
        # from it, so while other writers run it can only be ahead of them, never behind.
        last = self.sequence_last_value(cursor)
        if highest > last:
            logger.warning(
                "stream %s: sequence %s was at %d, behind the tables/positions at %d; moved it on",
                self.stream_name, self.sequence, last, highest,
            )
            self.sequence_set_at_least(cursor, highest)

    def load_state(self, writers: Sequence[str] | None) -> LoadedState:
        """Read what start-up needs (docs/streams.md): positions, the linear start, rows above it."""
        connection = connections[self.using]
        with transaction.atomic(using=self.using), connection.cursor() as cursor:
            self.ensure_sequence(cursor)
            self._check_consistency(cursor)
            positions: dict[str, int] = {}
            if writers is not None:
                # Rows of instances outside this process's writers are another process's
                # record (its STREAM_WRITERS may be the right one): left alone, only ignored
                # here; the dashboard warns that the configured writers disagree.
                cursor.execute(
                    f"SELECT instance_name, stream_id FROM {POSITIONS} WHERE stream_name = %s",
                    [self.stream_name],
                )
                recorded = cursor.fetchall()
                positions = {inst: self.direction.to_wire(int(sid)) for inst, sid in recorded if inst in writers}
                others = sorted(inst for inst, _ in recorded if inst not in writers)
                if others:
                    logger.warning(
                        "stream %s: positions recorded for %s, not in this process's writers (%s); "
                        "left as they are: check STREAM_WRITERS agrees across processes",
                        self.stream_name, ", ".join(others), ", ".join(writers),
                    )
                if self.instance_name in writers and self.own_position_from_sequence():
                    # A writer is at the end of the stream: whatever it reserved before a
                    # restart has completed (committed, rolled back or died with it).
                    positions[self.instance_name] = self.sequence_raw_last_value(cursor)
            rows: list[tuple[str, int]] = []
            if not positions:
                persisted_upto = max([1, *(self._table_extreme(cursor, ref) for ref in self.tables)])
            else:
                persisted_upto = min(positions.values())
                cmp = self.direction.from_token_sql()
                for ref in self.tables:
                    cursor.execute(
                        f"SELECT {ref.instance_column}, {ref.id_column} FROM {ref.table} "
                        f"WHERE {ref.id_column} {cmp} %s",
                        [self.direction.from_wire(persisted_upto)],
                    )
                    rows.extend((inst, self.direction.to_wire(int(sid))) for inst, sid in cursor.fetchall())
            # This writer starts with nothing pending: reservations left by an earlier run of
            # it (killed mid-transaction) are over.
            dropped = self.drop_left_reservations(cursor)
            if dropped:
                logger.warning(
                    "stream %s: dropped %d reservation(s) left by an earlier run of %s",
                    self.stream_name, dropped, self.instance_name,
                )
        return LoadedState(positions=positions, persisted_upto=persisted_upto, rows=rows)

    def record_clean_exit(self) -> None:
        """This process stops writing with nothing pending: say so on its position row (only
        if the row is still this process's: a later process of the same name may have
        written since), so the pages tell a finished writer from one that died."""

        try:
            StreamPosition.objects.using(self.using).filter(
                stream_name=self.stream_name, instance_name=self.instance_name, pid=os.getpid(),
                host=socket.gethostname(),
            ).update(exited_at=datetime.now(timezone.utc))
        except Exception as e:  # closing: the database may be gone; the row then reads "died"
            logger.warning("stream %s: could not record %s's clean exit: %s", self.stream_name,
                           self.instance_name, e)

    def drop_left_reservations(self, cursor: Any) -> int:
        """Drop the reservations an earlier run of this writer left; how many."""
        cursor.execute(
            f"DELETE FROM {RESERVATIONS} WHERE stream_name = %s AND instance_name = %s",
            [self.stream_name, self.instance_name],
        )
        return cursor.rowcount

    def close(self) -> None:
        pass


class PostgresIdStore(IdStore):
    """IDs from a PostgreSQL sequence, reserved on a dedicated autocommit connection or in the
    writer's own pipeline."""

    # The reservation, on the dedicated connection (reserve) or the writer's own
    # (reserve_statement), whose commits wait for the WAL flush; this one need not (the
    # dedicated connection does not either). The IDs come back unordered: sorted in
    # reservation_from_row.
    _RESERVE_SQL = f"""
        WITH fast AS (SELECT set_config('synchronous_commit', 'off', true)),
            ids AS (SELECT nextval(%s) AS id FROM generate_series(1, %s))
        INSERT INTO {RESERVATIONS} (stream_name, instance_name, stream_ids, reserved_at, pid)
        SELECT %s, %s, to_jsonb(array_agg(id)), now(), %s FROM ids, fast
        RETURNING id, stream_ids
    """

    # The reservation of PipelinedReservation: on the writer's own connection, whose commits
    # wait for the WAL flush; this one need not (as on the dedicated connection).
    # It returns the ID as a number (no JSON to parse on the hot path).
    _PIPELINED_RESERVE_SQL = f"""
        WITH fast AS (SELECT set_config('synchronous_commit', 'off', true))
        INSERT INTO {RESERVATIONS} (stream_name, instance_name, stream_ids, reserved_at, pid)
        SELECT %s, %s, jsonb_build_array(nextval(%s)), now(), %s FROM fast
        RETURNING id, (stream_ids->>0)::bigint
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lock = threading.Lock()
        self._reservation_sequence: str | None = None
        #: the SQL of :meth:`pipelined_reservation` (built once: it is the hot path)
        self._pipelined_sql: tuple[str, str, str] | None = None
        self._conn: Any = None
        self._conn_pid = 0
        self._upsert_sql = _upsert_position_sql(self.direction)
        self._complete_sql = f"WITH gone AS (DELETE FROM {RESERVATIONS} WHERE id = %s) {self._upsert_sql}"
        self._delete_sql = f"DELETE FROM {RESERVATIONS} WHERE id = %s"

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed or self._conn_pid != os.getpid():
            self._conn = dedicated_connection(f"synapse_repl ids {self.instance_name}", self.using)
            # A reservation lost in a database crash costs nothing: the writer's own
            # transaction is lost too. Don't wait for the WAL flush.
            self._conn.execute("SET synchronous_commit TO off")
            self._conn_pid = os.getpid()
        return self._conn

    def _run(self, sql: str, params: Sequence[Any]) -> Any:
        import psycopg

        with self._lock:
            for attempt in (1, 2):
                try:
                    cur = self._connection().execute(sql, params)
                    return cur.fetchone() if cur.description else None
                except psycopg.OperationalError:
                    # The connection broke (server restart, network): reconnect once.
                    self._drop()
                    if attempt == 2:
                        raise

    def _drop(self) -> None:
        try:
            if self._conn is not None:
                self._conn.close()
        finally:
            self._conn = None

    def ensure_sequence(self, cursor: Any) -> None:
        # Serialise creation across processes; consume ID 1 at once (Synapse: never START
        # WITH 2, issue #18712): the first ID handed out is 2, position 1 counts as persisted.
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"stream-seq:{self.sequence}"])
        cursor.execute("SELECT 1 FROM pg_class WHERE relkind = 'S' AND relname = %s", [self.sequence])
        if cursor.fetchone() is None:
            cursor.execute(f"CREATE SEQUENCE {self.sequence}")
            cursor.execute("SELECT nextval(%s)", [self.sequence])

    def sequence_last_value(self, cursor: Any) -> int:
        cursor.execute(f"SELECT last_value, is_called FROM {self.sequence}")
        last_value, is_called = cursor.fetchone()
        return int(last_value) if is_called else int(last_value) - 1

    def sequence_raw_last_value(self, cursor: Any) -> int:
        cursor.execute(f"SELECT last_value FROM {self.sequence}")
        return int(cursor.fetchone()[0])

    def sequence_set_at_least(self, cursor: Any, value: int) -> None:
        cursor.execute(
            f"SELECT setval(%s, GREATEST(%s, (SELECT last_value FROM {self.sequence})))",
            [self.sequence, value],
        )

    def own_position_from_sequence(self) -> bool:
        return True

    def reserve(self, n: int) -> Reservation:
        return self.reservation_from_row(self._run(*self.reserve_statement(n)))

    def reserve_statement(self, n: int) -> tuple[str, tuple[Any, ...]]:
        return self._RESERVE_SQL, (self.sequence, n, self.stream_name, self.instance_name, os.getpid())

    def reservation_from_row(self, row: Sequence[Any]) -> Reservation:
        reservation_id, ids = row
        if isinstance(ids, str):  # Django's connections load jsonb as its text
            ids = json.loads(ids)
        # JSON integers load as ints; sorted here, not in SQL (an ORDER BY in the aggregate
        # cost the server ~10 us per reservation), and nearly free on an ordered list
        ids.sort()
        return Reservation(int(reservation_id), ids)

    def complete(self, reservation: Reservation, position: int | None) -> None:
        self._run(*self.completion_statement(reservation, position))

    def completion_statement(self, reservation: Reservation, position: int | None) -> tuple[str, tuple[Any, ...]]:
        """Run by the writer's connection as the last statement of the transaction writing
        the rows: the reservation disappears in the very commit that makes the rows visible
        (a reader sees one or the other, never neither), and a transaction that never
        commits (rolled back, writer killed) leaves it in place."""
        if position is None:
            return self._delete_sql, (reservation.reservation_id,)
        return self._complete_sql, (reservation.reservation_id, self.stream_name, self.instance_name, position,
                                    *_recorder())

    def pipelined_reservation(self, position_floor: int | None) -> PipelinedReservation | None:
        """``position_floor``: the writer's position is recorded as the greater of it and
        the ID (``None``: only the reservation is deleted). Forward streams only."""
        if self.direction.backwards:
            return None
        if self._pipelined_sql is None:
            if self._reservation_sequence is None:
                (name,) = self._run("SELECT pg_get_serial_sequence(%s, 'id')", (RESERVATIONS,))
                self._reservation_sequence = name
            current_id = f"currval('{self.sequence}')"
            gone = f"DELETE FROM {RESERVATIONS} WHERE id = currval('{self._reservation_sequence}')"
            self._pipelined_sql = (current_id, gone, f"WITH gone AS ({gone}) " + _upsert_position_sql(
                self.direction, stream_id_sql=f"GREATEST(%s, {current_id})"))
        current_id, gone_sql, record_sql = self._pipelined_sql
        if position_floor is None:
            completion_sql, completion_params = gone_sql, ()
        else:
            completion_sql = record_sql
            completion_params = (self.stream_name, self.instance_name, position_floor, *_recorder())
        return PipelinedReservation(
            self._PIPELINED_RESERVE_SQL, (self.stream_name, self.instance_name, self.sequence, os.getpid()),
            current_id, completion_sql, completion_params,
        )

    def raise_recorded_position(self, position: int) -> None:
        self._run(_raise_position_sql(self.direction),
                  (position, *_recorder(), self.stream_name, self.instance_name, position))

    def close(self) -> None:
        with self._lock:
            self._drop()


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` is a running process on this host (a reservation's or a status row's
    writer; on SQLite every writer is local)."""
    if not pid or pid < 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SQLiteIdStore(IdStore):
    """IDs from an ID table; one writer per stream, reserving outside its transaction."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lock = threading.Lock()
        self._upsert_sql = _upsert_position_sql(self.direction)

    def ensure_sequence(self, cursor: Any) -> None:
        cursor.execute(
            f"INSERT OR IGNORE INTO {SEQUENCES} (name, last_value) VALUES (%s, 1)", [self.sequence]
        )

    def drop_left_reservations(self, cursor: Any) -> int:
        """Only those of dead processes: on the embedded default several local processes
        write under one name (the service, its demo, ``write_facts`` in another shell), and
        a reservation of a live one is in flight; dropping it would let the endpoint read
        past it (local_scan.py). A dead process's SQLite transaction rolled back with it."""
        cursor.execute(
            f"SELECT id, pid FROM {RESERVATIONS} WHERE stream_name = %s AND instance_name = %s",
            [self.stream_name, self.instance_name],
        )
        left = [rid for rid, pid in cursor.fetchall() if not pid_alive(pid)]
        for rid in left:
            cursor.execute(f"DELETE FROM {RESERVATIONS} WHERE id = %s", [rid])
        return len(left)

    def sequence_last_value(self, cursor: Any) -> int:
        cursor.execute(f"SELECT last_value FROM {SEQUENCES} WHERE name = %s", [self.sequence])
        row = cursor.fetchone()
        return int(row[0]) if row else 0

    def sequence_set_at_least(self, cursor: Any, value: int) -> None:
        cursor.execute(
            f"UPDATE {SEQUENCES} SET last_value = MAX(last_value, %s) WHERE name = %s",
            [value, self.sequence],
        )

    def reserve(self, n: int) -> Reservation:
        import json
        from datetime import datetime, timezone

        connection = connections[self.using]
        if connection.in_atomic_block:
            raise RuntimeError(
                f"stream {self.stream_name}: reserve stream IDs before opening the transaction "
                "that writes them (SQLite has one writer; the reservation commits on its own)"
            )
        with self._lock, transaction.atomic(using=self.using), connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {SEQUENCES} SET last_value = last_value + %s WHERE name = %s RETURNING last_value",
                [n, self.sequence],
            )
            last = int(cursor.fetchone()[0])
            ids = list(range(last - n + 1, last + 1))
            cursor.execute(
                f"INSERT INTO {RESERVATIONS} (stream_name, instance_name, stream_ids, reserved_at, pid) "
                "VALUES (%s, %s, %s, %s, %s) RETURNING id",
                [self.stream_name, self.instance_name, json.dumps(ids),
                 connection.ops.adapt_datetimefield_value(datetime.now(timezone.utc)), os.getpid()],
            )
            return Reservation(int(cursor.fetchone()[0]), ids)

    def complete(self, reservation: Reservation, position: int | None) -> None:
        connection = connections[self.using]
        with self._lock, transaction.atomic(using=self.using), connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {RESERVATIONS} WHERE id = %s", [reservation.reservation_id])
            if position is not None:
                cursor.execute(self._upsert_sql, [self.stream_name, self.instance_name, position,
                                                  *_recorder(connection)])

    def raise_recorded_position(self, position: int) -> None:
        connection = connections[self.using]
        with self._lock, transaction.atomic(using=self.using), connection.cursor() as cursor:
            cursor.execute(_raise_position_sql(self.direction),
                           [position, *_recorder(connection), self.stream_name, self.instance_name, position])


_HOST = socket.gethostname()


def _recorder(connection: Any = None) -> tuple[Any, int, str]:
    """When, and by which process (pid, host), a position is recorded: the dashboard shows
    each writer's last write and whether the process that made it still runs."""
    now = datetime.now(timezone.utc)
    return (connection.ops.adapt_datetimefield_value(now) if connection is not None else now,
            os.getpid(), _HOST)


def _upsert_position_sql(direction: IdDirection, stream_id_sql: str = "%s") -> str:
    """Monotonic upsert of a writer's position (counting down for backwards streams), with
    when and by which process it advanced."""
    cmp = direction.behind_sql()
    return f"""
        INSERT INTO {POSITIONS} (stream_name, instance_name, stream_id, recorded_at, pid, host)
        VALUES (%s, %s, {stream_id_sql}, %s, %s, %s)
        ON CONFLICT (stream_name, instance_name) DO UPDATE SET stream_id = excluded.stream_id,
            recorded_at = excluded.recorded_at, pid = excluded.pid, host = excluded.host
        WHERE {POSITIONS}.stream_id {cmp} excluded.stream_id
    """


def _raise_position_sql(direction: IdDirection) -> str:
    cmp = direction.behind_sql()
    return (
        f"UPDATE {POSITIONS} SET stream_id = %s, recorded_at = %s, pid = %s, host = %s "
        f"WHERE stream_name = %s AND instance_name = %s AND stream_id {cmp} %s"
    )


def table_refs(tables: Iterable[Any]) -> list[TableRef]:
    return [TableRef(t.table, t.id_column) for t in tables]

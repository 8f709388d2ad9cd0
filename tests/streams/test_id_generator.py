"""MultiWriterIdGenerator against real databases: the vectors of Synapse's
``tests/storage/test_id_generators.py``
(Synapse's tests/storage/test_id_generators.py) and the worked example of streams.md.

Harness as in Synapse: table(s) ``foobar(stream_id, instance_name, data)``, sequence
``foobar_seq``, stream ``test_stream``. "insert N rows as X" = N x (nextval, insert row,
upsert stream_positions[X]).
"""
from __future__ import annotations

import pytest
from django.db import connections

from streams.dialect import id_store_for
from streams.id_generator import MultiWriterIdGenerator, NotAWriter
from streams.id_store import TableRef

STREAM = "test_stream"


class Harness:
    def __init__(self, using: str, tables=("foobar",)) -> None:
        self.using = using
        self.conn = connections[using]
        self.tables = tables
        self.pg = self.conn.vendor == "postgresql"
        with self.conn.cursor() as c:
            for t in tables:
                c.execute(f"CREATE TABLE {t} (stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL, data TEXT)")
            if self.pg:
                c.execute("CREATE SEQUENCE foobar_seq")
            else:
                c.execute("INSERT INTO stream_sequences (name, last_value) VALUES ('foobar_seq', 0)")
        self.gens: list[MultiWriterIdGenerator] = []

    def drop(self) -> None:
        for g in self.gens:
            g.close()
        with self.conn.cursor() as c:
            for t in self.tables:
                c.execute(f"DROP TABLE IF EXISTS {t}")
            if self.pg:
                c.execute("DROP SEQUENCE IF EXISTS foobar_seq")
            else:
                c.execute("DELETE FROM stream_sequences WHERE name = 'foobar_seq'")
            c.execute("DELETE FROM stream_positions WHERE stream_name = %s", [STREAM])
            c.execute("DELETE FROM stream_reservations WHERE stream_name = %s", [STREAM])

    def _nextval(self, c) -> int:
        if self.pg:
            c.execute("SELECT nextval('foobar_seq')")
            return c.fetchone()[0]
        c.execute("UPDATE stream_sequences SET last_value = last_value + 1 WHERE name = 'foobar_seq' RETURNING last_value")
        return c.fetchone()[0]

    def _upsert_position(self, c, instance: str, stream_id: int) -> None:
        c.execute(
            "INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES (%s, %s, %s) "
            "ON CONFLICT (stream_name, instance_name) DO UPDATE SET stream_id = excluded.stream_id",
            [STREAM, instance, stream_id],
        )

    def insert_rows(self, instance: str, n: int, table: str = "foobar", update_positions: bool = True) -> None:
        with self.conn.cursor() as c:
            for _ in range(n):
                sid = self._nextval(c)
                c.execute(f"INSERT INTO {table} VALUES (%s, %s, 'x')", [sid, instance])
                if update_positions:
                    self._upsert_position(c, instance, sid)

    def insert_row_with_id(self, instance: str, stream_id: int) -> None:
        assert self.pg
        with self.conn.cursor() as c:
            c.execute("INSERT INTO foobar VALUES (%s, %s, 'x')", [stream_id, instance])
            c.execute("SELECT setval('foobar_seq', %s)", [stream_id])
            self._upsert_position(c, instance, stream_id)

    def gen(self, instance: str = "master", writers=("master",), backwards: bool = False,
            tables=None, notifier=None) -> MultiWriterIdGenerator:
        store = id_store_for(
            self.using, stream_name=STREAM, sequence="foobar_seq",
            tables=[TableRef(t, "stream_id") for t in (tables or self.tables)],
            instance_name=instance, backwards=backwards,
        )
        g = MultiWriterIdGenerator(
            stream_name=STREAM, instance_name=instance, store=store,
            writers=None if writers is None else list(writers), backwards=backwards, notifier=notifier,
        )
        self.gens.append(g)
        return g

    def write(self, g: MultiWriterIdGenerator, n: int = 1, table: str = "foobar") -> list[int]:
        """Reserve n IDs through the generator and insert a row for each."""
        with g.get_next_mult(n) as ids:
            with self.conn.cursor() as c:
                for sid in ids:
                    c.execute(f"INSERT INTO {table} VALUES (%s, %s, 'x')", [sid, g.instance_name])
        return ids


def replicate_all(*gens: MultiWriterIdGenerator) -> None:
    for g in gens:
        for other in gens:
            if other is not g:
                other.advance(g.instance_name, g.get_current_token_for_writer(g.instance_name))


BOTH = pytest.mark.parametrize("using", ["default", "sqlite"])


@pytest.fixture
def harness_factory(transactional_db, django_db_blocker):
    made: list[Harness] = []

    def make(using: str = "default", tables=("foobar",)) -> Harness:
        h = Harness(using, tables)
        made.append(h)
        return h

    yield make
    for h in made:
        h.drop()


pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


class Step:
    """Hold a reservation open, complete it later (to complete IDs out of order)."""

    def __init__(self, g: MultiWriterIdGenerator) -> None:
        self.cm = g.get_next()
        self.id = self.cm.__enter__()

    def complete(self, exc: bool = False) -> None:
        if exc:
            self.cm.__exit__(RuntimeError, RuntimeError("rolled back"), None)
        else:
            self.cm.__exit__(None, None, None)


# --- single process: SQLite and PostgreSQL ----------------------------------------------------

@BOTH
def test_empty(harness_factory, using):
    h = harness_factory(using)
    g = h.gen()
    assert g.get_positions() == {"master": 1}
    assert g.get_current_token_for_writer("master") == 1


@BOTH
def test_single_gen_next(harness_factory, using):
    h = harness_factory(using)
    h.insert_rows("master", 7)
    g = h.gen()
    assert g.get_positions() == {"master": 7}
    assert g.get_current_token_for_writer("master") == 7
    with g.get_next() as sid:
        assert sid == 8
        assert g.get_current_token_for_writer("master") == 7
        assert g.get_current_token() == 7
    assert g.get_current_token_for_writer("master") == 8
    assert g.get_current_token() == 8


@BOTH
def test_out_of_order_completion(harness_factory, using):
    h = harness_factory(using)
    h.insert_rows("master", 7)
    g = h.gen()
    steps = [Step(g) for _ in range(4)]
    assert [s.id for s in steps] == [8, 9, 10, 11]
    s8, s9, s10, s11 = steps
    s9.complete()
    assert g.get_current_token_for_writer("master") == 7
    s8.complete()
    assert g.get_current_token_for_writer("master") == 9
    s11.complete()
    assert g.get_current_token_for_writer("master") == 9
    s10.complete()
    assert g.get_current_token_for_writer("master") == 11
    assert g.get_current_token() == 11


@BOTH
def test_next_in_transaction(harness_factory, using):
    """Position moves only once the writing transaction has ended."""
    from django.db import transaction

    h = harness_factory(using)
    h.insert_rows("master", 7)
    g = h.gen()
    with g.get_next() as sid:
        with transaction.atomic(using=using):
            with h.conn.cursor() as c:
                c.execute("INSERT INTO foobar VALUES (%s, 'master', 'x')", [sid])
            assert sid == 8
            assert g.get_current_token_for_writer("master") == 7
    assert g.get_current_token_for_writer("master") == 8


@BOTH
def test_rollback_completes(harness_factory, using):
    """A rolled-back fact is a fact with zero rows: it completes like a commit."""
    h = harness_factory(using)
    h.insert_rows("master", 7)
    g = h.gen()
    first, second = Step(g), Step(g)
    second.complete()
    first.complete(exc=True)
    assert g.get_current_token_for_writer("master") == 9
    with h.conn.cursor() as c:
        c.execute("SELECT stream_id FROM foobar WHERE stream_id > 7")
        assert c.fetchall() == []  # nothing written by either


@BOTH
def test_restart_mid_out_of_order(harness_factory, using):
    h = harness_factory(using)
    h.insert_rows("master", 7)
    g = h.gen()
    s8, s9 = Step(g), Step(g)
    s9.complete()
    worker = h.gen("worker", writers=("master",))
    assert worker.get_positions() == {"master": 7}
    assert worker.get_current_token_for_writer("master") == 7
    s8.complete()
    assert g.get_current_token_for_writer("master") == 9
    worker.advance("master", 9)
    assert worker.get_positions() == {"master": 9}
    assert worker.get_current_token_for_writer("master") == 9


@BOTH
def test_worked_example_from_streams_md(harness_factory, using):
    """Reserve 2, 3; complete 3 -> 1; complete 2 -> 3; reserve 4,5,6; complete 5 -> 3;
    complete 4 -> 5 (6 pending); complete 6 -> 6."""
    h = harness_factory(using)
    h.insert_rows("master", 1)
    g = h.gen()
    assert g.get_current_token() == 1
    s2, s3 = Step(g), Step(g)
    assert (s2.id, s3.id) == (2, 3)
    s3.complete()
    assert g.get_current_token() == 1
    s2.complete()
    assert g.get_current_token() == 3
    s4, s5, s6 = Step(g), Step(g), Step(g)
    s5.complete()
    assert g.get_current_token() == 3
    s4.complete()
    assert g.get_current_token() == 5
    s6.complete()
    assert g.get_current_token() == 6


@BOTH
def test_non_writer_cannot_reserve(harness_factory, using):
    h = harness_factory(using)
    g = h.gen("worker", writers=("master",))
    with pytest.raises(NotAWriter):
        with g.get_next():
            pass


@BOTH
def test_pending_is_visible_in_process_and_database(harness_factory, using):
    from streams.models import StreamReservation

    h = harness_factory(using)
    g = h.gen()
    s = Step(g)
    assert [p.stream_id for p in g.pending()] == [s.id]
    rows = list(StreamReservation.objects.using(using).filter(stream_name=STREAM).values_list("instance_name", "stream_ids"))
    assert rows == [("master", [s.id])]
    s.complete()
    assert g.pending() == []
    assert not StreamReservation.objects.using(using).filter(stream_name=STREAM).exists()


@BOTH
def test_restart_drops_own_stale_reservations(harness_factory, using):
    """A writer killed mid-transaction leaves its reservation visible until it restarts."""
    from streams.models import StreamReservation

    h = harness_factory(using)
    g = h.gen()
    held = Step(g)  # never completed: the process "dies" here  # noqa: F841 (kept alive)
    assert StreamReservation.objects.using(using).filter(stream_name=STREAM).count() == 1
    # The reservation's process is gone (SQLite checks: its writers are all on this host).
    StreamReservation.objects.using(using).filter(stream_name=STREAM).update(pid=dead_pid())
    h.gen()  # restart
    assert StreamReservation.objects.using(using).filter(stream_name=STREAM).count() == 0


def test_sqlite_restart_keeps_reservations_of_live_processes(harness_factory):
    """On the embedded default the service, its demo and write_facts in another shell write
    under one name: one of them starting must not drop another's reservation in flight (the
    endpoint would read past that ID and never send its rows)."""
    from streams.models import StreamReservation

    h = harness_factory("sqlite")
    g = h.gen()
    held = Step(g)  # in flight in a live process (this one)  # noqa: F841
    h.gen()  # another process of the same name starts
    assert StreamReservation.objects.using("sqlite").filter(stream_name=STREAM).count() == 1


def dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- several writers: PostgreSQL only ----------------------------------------------------------

def test_persisted_upto_position(harness_factory):
    h = harness_factory()
    h.insert_row_with_id("first", 3)
    h.insert_row_with_id("second", 5)
    g = h.gen("worker", writers=("first", "second"))
    assert g.get_positions() == {"first": 3, "second": 5}
    assert g.get_persisted_upto_position() == 3
    g.advance("first", 6)
    assert g.get_persisted_upto_position() == 6
    g.advance("second", 7)
    assert g.get_persisted_upto_position() == 7
    g.advance("second", 9)
    assert g.get_persisted_upto_position() == 7
    g.advance("first", 8)
    assert g.get_persisted_upto_position() == 9
    g.advance("first", 11)
    g.advance("second", 15)
    assert g.get_persisted_upto_position() == 11


def test_persisted_upto_position_get_next(harness_factory):
    h = harness_factory()
    h.insert_row_with_id("first", 3)
    h.insert_row_with_id("second", 5)
    g = h.gen("first", writers=("first", "second"))
    assert g.get_positions() == {"first": 5, "second": 5}
    assert g.get_persisted_upto_position() == 5
    with g.get_next() as sid:
        assert sid == 6
        assert g.get_persisted_upto_position() == 5
    assert g.get_persisted_upto_position() == 6


def test_multi_instance(harness_factory):
    h = harness_factory()
    h.insert_rows("first", 3)
    first = h.gen("first", writers=("first", "second"))
    h.insert_rows("second", 4)
    second = h.gen("second", writers=("first", "second"))
    replicate_all(first, second)
    for g in (first, second):
        assert g.get_positions() == {"first": 3, "second": 7}
        assert g.get_current_token_for_writer("first") == 7
        assert g.get_current_token_for_writer("second") == 7
    with first.get_next() as sid:
        assert sid == 8
        assert first.get_positions() == {"first": 3, "second": 7}
        assert first.get_persisted_upto_position() == 7
    assert first.get_positions() == {"first": 8, "second": 7}
    assert second.get_positions() == {"first": 3, "second": 7}
    with second.get_next() as sid:
        assert sid == 9
    assert second.get_positions() == {"first": 3, "second": 9}
    second.advance("first", 8)
    assert second.get_positions() == {"first": 8, "second": 9}


def test_empty_writer_moves_along(harness_factory):
    h = harness_factory()
    writers = ("first", "second", "third")
    h.insert_rows("first", 3)
    first = h.gen("first", writers=writers)
    h.insert_rows("second", 4)
    second = h.gen("second", writers=writers)
    third = h.gen("third", writers=writers)
    replicate_all(first, second, third)
    for g in (first, second, third):
        assert g.get_positions() == {"first": 3, "second": 7, "third": 7}
        for w in writers:
            assert g.get_current_token_for_writer(w) == 7
    with third.get_next() as sid:
        assert sid == 8
        assert third.get_positions() == {"first": 3, "second": 7, "third": 7}
        assert third.get_persisted_upto_position() == 7
    assert third.get_positions() == {"first": 3, "second": 7, "third": 8}


def test_writer_config_change(harness_factory):
    h = harness_factory()
    h.insert_row_with_id("first", 3)
    h.insert_row_with_id("second", 5)
    worker = h.gen("worker", writers=("first", "second"))
    assert worker.get_persisted_upto_position() == 3
    assert worker.get_current_token_for_writer("first") == 3
    assert worker.get_current_token_for_writer("second") == 5

    second = h.gen("second", writers=("second",))
    assert second.get_persisted_upto_position() == 5
    assert second.get_current_token_for_writer("second") == 5

    third = h.gen("third", writers=("third",))
    assert third.get_persisted_upto_position() == 5
    assert third.get_current_token_for_writer("third") == 5

    fourth = h.gen("fourth", writers=("third",))
    assert fourth.get_current_token_for_writer("third") == 5

    with third.get_next() as sid:
        assert sid == 6
    assert third.get_persisted_upto_position() == 6

    # The processes above disagreed about the writers, and none deleted another's row
    # (the other process may hold the right STREAM_WRITERS). So "first" is back
    # with the position it recorded: the linear position waits at it until "first" writes.
    five = h.gen("five", writers=("first", "third"))
    assert five.get_persisted_upto_position() == 3
    assert five.get_current_token_for_writer("first") == 3
    assert five.get_current_token_for_writer("third") == 6
    first = h.gen("first", writers=("first", "third"))
    with first.get_next() as sid:
        assert sid == 7
    assert first.get_current_token_for_writer("first") == 7
    assert first.get_persisted_upto_position() == 7  # it wrote: the linear position moves on


def test_sequence_behind_table_is_repaired(harness_factory):
    h = harness_factory()
    h.insert_row_with_id("master", 3)
    with h.conn.cursor() as c:
        c.execute("INSERT INTO foobar VALUES (26, 'master', 'x')")  # sequence not touched
    g = h.gen()
    with g.get_next() as sid:
        assert sid == 27


def test_sequence_behind_positions_is_repaired(harness_factory):
    """Synapse refuses to start here (IncorrectDatabaseSetup); we move the sequence on."""
    h = harness_factory()
    h.insert_row_with_id("master", 3)
    with h.conn.cursor() as c:
        c.execute("UPDATE stream_positions SET stream_id = 40 WHERE stream_name = %s", [STREAM])
    g = h.gen()
    with g.get_next() as sid:
        assert sid == 41


def test_minimal_local_token(harness_factory):
    h = harness_factory()
    h.insert_rows("first", 3)
    first = h.gen("first", writers=("first", "second"))
    h.insert_rows("second", 4)
    second = h.gen("second", writers=("first", "second"))
    replicate_all(first, second)
    assert first.get_positions() == {"first": 3, "second": 7}
    assert first.get_minimal_local_current_token() == 3
    assert second.get_positions() == {"first": 3, "second": 7}
    assert second.get_minimal_local_current_token() == 7


def test_current_token_gap(harness_factory):
    h = harness_factory()
    writers = ("first", "second", "third")
    h.insert_rows("first", 3)
    h.insert_rows("second", 4)
    first = h.gen("first", writers=writers)
    second = h.gen("second", writers=writers)
    third = h.gen("third", writers=writers)
    replicate_all(first, second, third)
    assert second.get_current_token_for_writer("first") == 7
    assert second.get_current_token_for_writer("second") == 7
    assert second.get_current_token() == 7

    with first.get_next_mult(2) as ids:
        assert ids == [8, 9]
    second.advance("first", 9)
    assert second.get_current_token_for_writer("first") == 9
    assert second.get_current_token_for_writer("second") == 9  # idle writer moves along
    assert second.get_current_token() == 7  # third still 7

    with first.get_next_mult(2) as ids:
        assert ids == [10, 11]
    held = Step(second)
    assert held.id == 12
    second.advance("first", 11)
    assert second.get_current_token_for_writer("first") == 11
    assert second.get_current_token_for_writer("second") == 9  # in flight blocks the move
    assert second.get_current_token() == 7
    held.complete()
    assert second.get_current_token_for_writer("second") == 12
    assert second.get_current_token_for_writer("first") == 11
    assert second.get_current_token() == 7


def test_backwards_single(harness_factory):
    h = harness_factory()
    g = h.gen(backwards=True)
    h.write(g)
    assert g.get_positions() == {"master": -1}
    assert g.get_current_token_for_writer("master") == -1
    assert g.get_persisted_upto_position() == -1
    h.write(g, 3)
    assert g.get_positions() == {"master": -4}
    assert g.get_current_token_for_writer("master") == -4
    assert g.get_persisted_upto_position() == -4
    g2 = h.gen(backwards=True)
    assert g2.get_positions() == {"master": -4}
    assert g2.get_current_token_for_writer("master") == -4
    assert g2.get_persisted_upto_position() == -4


def test_backwards_multi(harness_factory):
    h = harness_factory()
    writers = ("first", "second")
    first = h.gen("first", writers=writers, backwards=True)
    second = h.gen("second", writers=writers, backwards=True)
    h.write(first)
    replicate_all(first, second)
    for g in (first, second):
        assert g.get_positions() == {"first": -1, "second": -1}
        assert g.get_persisted_upto_position() == -1
    h.write(second)
    replicate_all(first, second)
    for g in (first, second):
        assert g.get_positions() == {"first": -1, "second": -2}
        assert g.get_persisted_upto_position() == -2


def test_load_from_several_tables(harness_factory):
    h = harness_factory(tables=("foobar1", "foobar2"))
    writers = ("first", "second")
    h.insert_rows("first", 3, table="foobar1")
    first = h.gen("first", writers=writers)
    h.insert_rows("second", 3, table="foobar2")
    h.insert_rows("second", 1, table="foobar2", update_positions=False)
    second = h.gen("second", writers=writers)
    replicate_all(first, second)
    for g in (first, second):
        assert g.get_positions() == {"first": 3, "second": 7}
        assert g.get_current_token_for_writer("first") == 7
        assert g.get_current_token_for_writer("second") == 7
        assert g.get_persisted_upto_position() == 7


def test_advances_reach_subscribers_in_order_when_transactions_complete_at_once(harness_factory):
    """Two transactions of one writer completing in two threads at the same moment: the
    subscriber (the replication streamer) still sees (start, a] before (a, b]."""
    import threading

    from streams.notifier import PositionNotifier

    h = harness_factory("default")
    notifier = PositionNotifier()
    g = h.gen(notifier=notifier)
    h.write(g, 2)  # past the ID the position starts at
    start = g.get_current_token_for_writer("master")
    a, b = Step(g), Step(g)
    seen = []
    other = threading.Thread(target=b.complete)

    def subscriber(advance):
        if not seen and not other.is_alive() and advance.new_token == a.id:
            # While the first advance is on its way, the other transaction completes.
            other.start()
            other.join(timeout=2)
        seen.append((advance.prev_token, advance.new_token))

    notifier.subscribe(subscriber)
    assert start < a.id < b.id
    a.complete()
    other.join(timeout=30)
    assert seen == [(start, a.id), (a.id, b.id)]

"""Migration 0011: the link tables lose their ``id`` columns, keep every row, and get
their natural keys -- from a database holding rows at 0009, on PostgreSQL and SQLite, and back."""
from __future__ import annotations

import pytest
from django.db import IntegrityError, connections, transaction
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

BEFORE = ("streams", "0009_stream_position_writer")
AFTER = ("streams", "0011_natural_keys")

ROWS = {
    "event_edges": (("event_id", "prev_event_id", "room_id"),
                    [("$b", "$a", "!r"), ("$c", "$b", "!r"), ("$c", "$x", "!r")]),
    "event_to_state_groups": (("event_id", "state_group"), [("$a", 1), ("$b", 2), ("$c", 2)]),
    "state_group_edges": (("state_group", "prev_state_group"), [(2, 1), (3, 2)]),
    "state_groups_state": (("state_group", "room_id", "type", "state_key", "event_id"),
                           [(1, "!r", "m.room.create", "", "$a"), (1, "!r", "m.room.member", "@u", "$b"),
                            (2, "!r", "m.room.member", "@u", "$c")]),
    "event_auth": (("event_id", "auth_id", "room_id"), [("$b", "$a", "!r"), ("$c", "$a", "!r"), ("$c", "$b", "!r")]),
}

#: after 0011: (primary key columns or None, the other indexes' columns)
KEYS = {
    "event_edges": (["event_id", "prev_event_id"], [["prev_event_id"]]),
    "event_to_state_groups": (["event_id"], []),
    "state_group_edges": (["state_group", "prev_state_group"], [["prev_state_group"]]),
    "state_groups_state": (None, [["state_group"]]),
    "event_auth": (None, [["event_id"]]),
}


def _migrate(connection, target) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([target])


def _migrate_to_latest(connection) -> None:
    """Back to where the other tests expect the database: every migration applied."""
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def _rows(connection, table):
    columns, _ = ROWS[table]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table}")
        return sorted(tuple(r) for r in cursor.fetchall())


def _shape(connection, table):
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
        columns = [c.name for c in connection.introspection.get_table_description(cursor, table)]
    primary = [c["columns"] for c in constraints.values() if c["primary_key"]]
    others = sorted(c["columns"] for c in constraints.values() if c["index"] and not c["primary_key"])
    return columns, (primary[0] if primary else None), others


def test_rows_survive_0009_to_0011_and_back(default_database):
    connection = connections["default"]
    _migrate(connection, BEFORE)
    try:
        with connection.cursor() as cursor:
            for table, (columns, rows) in ROWS.items():
                cursor.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                                   f"({', '.join(['%s'] * len(columns))})", rows)
        assert all("id" in _shape(connection, t)[0] for t in ROWS)

        _migrate(connection, AFTER)
        for table, (columns, rows) in ROWS.items():
            assert _rows(connection, table) == sorted(rows), table
            names, primary, others = _shape(connection, table)
            assert names == list(columns), table  # no id
            assert (primary, others) == KEYS[table], table
        # the natural keys hold where the database keeps them
        with pytest.raises(IntegrityError), transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("INSERT INTO event_edges (event_id, prev_event_id, room_id) VALUES ('$b', '$a', '!r')")
        with pytest.raises(IntegrityError), transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("INSERT INTO event_to_state_groups (event_id, state_group) VALUES ('$a', 5)")

        _migrate(connection, BEFORE)
        for table, (_, rows) in ROWS.items():
            assert _rows(connection, table) == sorted(rows), table
            assert _shape(connection, table)[0][0] == "id", table
        with connection.cursor() as cursor:  # the surrogate ids are handed out again
            cursor.execute("INSERT INTO event_auth (event_id, auth_id, room_id) VALUES ('$d', '$c', '!r')")
            cursor.execute("SELECT count(DISTINCT id) FROM event_auth")
            assert cursor.fetchone()[0] == 4
    finally:
        _migrate_to_latest(connection)


def test_the_orm_reads_the_rebuilt_tables(default_database):
    """The models' declared keys work for what the admin panels ask (by event, by group)."""
    from rooms.models import EventAuth, EventEdge, EventToStateGroup, StateGroupEdge, StateGroupState

    EventEdge.objects.create(event_id="$b", prev_event_id="$a", room_id="!r")
    EventAuth.objects.create(event_id="$b", auth_id="$a", room_id="!r")
    EventToStateGroup.objects.create(event_id="$b", state_group=7)
    StateGroupEdge.objects.create(state_group=7, prev_state_group=6)
    StateGroupState.objects.create(state_group=7, room_id="!r", type="m.room.member", state_key="@u", event_id="$b")
    assert list(EventEdge.objects.filter(prev_event_id="$a").values_list("event_id", flat=True)) == ["$b"]
    assert list(EventAuth.objects.filter(event_id="$b").values_list("auth_id", flat=True)) == ["$a"]
    assert EventToStateGroup.objects.get(pk="$b").state_group == 7
    assert StateGroupEdge.objects.filter(state_group=7).first().prev_state_group == 6
    assert StateGroupState.objects.filter(state_group=7).count() == 1

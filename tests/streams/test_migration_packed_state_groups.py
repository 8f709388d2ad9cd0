"""Migration 0012: the groups already stored with at least 10,000 rows get their
packed copy on PostgreSQL -- unless a key or ID holds the separator -- and read back as their
rows; SQLite keeps the table empty."""
from __future__ import annotations

import pytest
from django.db import connections

from rooms.storage.sql import store_cursor
from rooms.storage.state_groups import read_state
from tests.streams.test_migration_natural_keys import _migrate, _migrate_to_latest

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

BEFORE = ("streams", "0011_natural_keys")
AFTER = ("streams", "0012_packed_state_groups")


def _group(group: int, n: int, odd: str = "") -> list[tuple]:
    rows = [(group, "!r", "m.room.member", f"@u{i}:hs", f"$m{i}") for i in range(n)]
    rows += [(group, "!r", "m.room.create", "", "$c"), (group, "!r", "m.room.name", "", f"$n{odd}")]
    return rows


def test_big_groups_stored_before_0012_are_packed_from_their_rows(default_database):
    connection = connections["default"]
    _migrate(connection, BEFORE)
    try:
        groups = {1: _group(1, 9_998), 2: _group(2, 10_000), 3: _group(3, 12_000, odd="\x1f"),
                  4: [(4, "!r", "m.room.topic", "", "$t")]}  # 10,000 rows, 10,002, 12,002 (a separator), 1
        with connection.cursor() as cursor:
            for rows in groups.values():
                cursor.executemany("INSERT INTO state_groups_state (state_group, room_id, type, state_key, event_id) "
                                   "VALUES (%s, %s, %s, %s, %s)", rows)
            cursor.execute("INSERT INTO state_group_edges (state_group, prev_state_group) VALUES (4, 2)")
        _migrate(connection, AFTER)
        with connection.cursor() as cursor:
            cursor.execute("SELECT state_group, members_count, others_count FROM state_groups_packed ORDER BY 1")
            packed = cursor.fetchall()
        if default_database == "sqlite":
            assert packed == []
        else:
            assert packed == [(1, 9_998, 2), (2, 10_000, 2)]
        with store_cursor() as cur:
            for g, rows in groups.items():
                expected = {(t, k): e for _, _, t, k, e in rows}
                if g == 4:
                    expected = {(t, k): e for _, _, t, k, e in groups[2]} | expected
                assert read_state(cur, g) == expected, g
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute("DELETE FROM state_groups_state")
            cursor.execute("DELETE FROM state_group_edges")
        _migrate_to_latest(connection)

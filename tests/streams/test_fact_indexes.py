"""The indexes of the fact tables on PostgreSQL: only what queries use (each one is paid for on
every inserted row), and the queries that need them do use them."""
from __future__ import annotations

import random

import pytest
from django.db import connection

from rooms.models import CurrentStateDelta, Event
from streams.models import AccountData, CacheInvalidation, DeviceInbox, Receipt
from streams.registry import get_stream
from streams.updates_since import get_updates_since

pytestmark = pytest.mark.django_db(transaction=True)

FACT_TABLES = [m._meta.db_table for m in (AccountData, CacheInvalidation, CurrentStateDelta, DeviceInbox, Event, Receipt)]


def _indexes(table: str) -> dict[str, str]:
    with connection.cursor() as cur:
        cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        return dict(cur.fetchall())


def _indexed_columns(table: str) -> list[str]:
    """Each index as its column list, e.g. ``(instance_name, stream_id)``."""
    return sorted(d[d.rindex("(", 0, d.rindex(")")):] for d in _indexes(table).values())


@pytest.mark.parametrize("table", FACT_TABLES)
def test_no_like_copies(table):
    assert not [name for name, d in _indexes(table).items() if "pattern_ops" in d]


def test_receipts_have_four_indexes():
    assert _indexed_columns("receipts_linearized") == [
        "(id)", "(instance_name, stream_id)", "(room_id)", "(stream_id)",
    ]


def test_events_keep_what_storage_reads_use():
    cols = _indexed_columns("events")
    for needed in ("(event_id)", "(stream_ordering)", "(instance_name, stream_ordering)",
                   "(room_id, stream_ordering)", "(room_id, topological_ordering, stream_ordering)"):
        assert needed in cols
    unique = [d for d in _indexes("events").values() if "(event_id)" in d]
    assert len(unique) == 1 and "UNIQUE" in unique[0]


def _plan(sql: str, params: list) -> str:
    with connection.cursor() as cur:
        cur.execute("ANALYZE receipts_linearized")
        cur.execute("SET enable_seqscan TO off")
        try:
            cur.execute("EXPLAIN " + sql, params)
            return "\n".join(r[0] for r in cur.fetchall())
        finally:
            cur.execute("RESET enable_seqscan")


def test_catch_up_page_uses_the_writer_index():
    rng = random.Random(3)
    Receipt.objects.bulk_create(
        [Receipt(stream_id=i, instance_name="w1" if i % 100 == 1 else "w0", **Receipt.synthetic(rng, i)) for i in range(1, 3001)]
    )
    spec = get_stream("receipts")
    # A writer with few rows among many (one that lagged): its page must not scan the others'.
    updates = get_updates_since(spec, "w1", 10, 3000, limit=50)
    assert [t for t, _ in updates.updates] == [i for i in range(11, 3001) if i % 100 == 1]
    qs = (Receipt.objects.filter(instance_name="w1", stream_id__gt=10, stream_id__lte=3000)
          .order_by("stream_id", "pk").values_list("stream_id")[:50])
    sql, params = qs.query.sql_with_params()
    assert "receipts_writer_id" in _plan(sql, list(params))

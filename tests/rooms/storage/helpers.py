"""Shared pieces of the storage tests: a stream runtime on the test database, PostgreSQL and
then SQLite (``default_database`` in tests/conftest.py runs each test on both)."""
from __future__ import annotations

import pytest
from django.db import connection

from rooms.storage import persist_events
from rooms.storage.caches import storage_caches
from streams.conf import stream_writers
from streams.runtime import StreamRuntime

#: the mark of every test using ``store``: both test databases, committed for real
ON_BOTH_DATABASES = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


class Store:
    """persist_events bound to one runtime (as one writer process)."""

    def __init__(self, runtime: StreamRuntime, vendor: str) -> None:
        self.runtime = runtime
        self.vendor = vendor

    def persist(self, *events, backfill=False):
        return persist_events(list(events), backfill=backfill, runtime=self.runtime)


def rows(sql, *params):
    """The rows of a query on the store's database (``default``)."""
    with connection.cursor() as c:
        c.execute(sql, params)
        return c.fetchall()


@pytest.fixture
def store(default_database):
    assert connection.vendor == default_database  # the code under test sees this database
    storage_caches().forget()  # the reads' (the process runtime's): group IDs start again
    rt = StreamRuntime(instance_name="master", writers=stream_writers("", vendor=default_database), using="default")
    yield Store(rt, default_database)
    rt.close()
    storage_caches().forget()

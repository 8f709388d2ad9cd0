"""Shared pieces of the storage tests: a stream runtime on the test PostgreSQL database."""
from __future__ import annotations

import pytest

from streams.conf import stream_writers
from streams.runtime import StreamRuntime
from streams.storage import persist_events
from streams.storage.reads import forget_caches


class Store:
    """persist_events bound to one runtime (as one writer process)."""

    def __init__(self, runtime: StreamRuntime) -> None:
        self.runtime = runtime

    def persist(self, *events, backfill=False):
        return persist_events(list(events), backfill=backfill, runtime=self.runtime)


@pytest.fixture
def store(transactional_db):
    forget_caches()
    rt = StreamRuntime(instance_name="master", writers=stream_writers("", vendor="postgresql"), using="default")
    yield Store(rt)
    rt.close()
    forget_caches()

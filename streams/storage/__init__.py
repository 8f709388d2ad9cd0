"""The room event store: lossless events, the room DAG, state groups as deltas, orderings,
visibility ranges, and the reads built on them (docs/storage.md).

One module per concept: ``events`` (incoming events), ``persist`` (the write path),
``state_groups``, ``visibility``, ``redactions``, ``tokens``, ``change_cache``, ``reads``.
"""
from streams.storage.events import BadEvent, IncomingEvent
from streams.storage.persist import PersistedEvent, persist_events
from streams.storage.sql import StorageUnsupported
from streams.storage.tokens import BadToken, RoomStreamToken

__all__ = ["BadEvent", "BadToken", "IncomingEvent", "PersistedEvent", "RoomStreamToken", "StorageUnsupported",
           "persist_events"]

"""The room event store: lossless events, the room DAG, state groups as deltas, orderings,
visibility ranges, and the reads built on them (docs/storage.md).

One module per concept: ``events`` (incoming events), ``persist`` (the write path),
``state_groups``, ``visibility``, ``redactions``, ``tokens``, ``change_cache``, ``reads``.
"""
from rooms.storage.incoming_events import BadEvent, IncomingEvent
from rooms.storage.persist import PersistedEvent, persist_events
from rooms.storage.sql import StorageUnsupported
from rooms.storage.tokens import BadToken, RoomStreamToken

__all__ = ["BadEvent", "BadToken", "IncomingEvent", "PersistedEvent", "RoomStreamToken", "StorageUnsupported",
           "persist_events"]

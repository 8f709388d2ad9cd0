"""The stream catalogue: one declaration per stream.

A declaration says which tables back the stream (and which column holds the stream ID), the
row format sent on the wire (Synapse's field order, its ``synapse/replication/tcp/streams/``),
whether several writers are allowed, and which PostgreSQL sequence hands out its IDs.
Adding a stream = one :func:`declare` call here plus its model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from streams.direction import IdDirection, direction
from streams.models import AccountData, CacheInvalidation, DeviceInbox, FactModel, Receipt


@dataclass(frozen=True)
class BackingTable:
    """A table holding rows of a stream, keyed by the stream ID in ``id_column``."""

    #: a FactModel, or a derived table the stream also reads (``ex_outlier_stream``)
    model: type[Any]
    wire_fields: Sequence[str] | None = None
    wire_row: Callable[[Sequence[Any]], list[Any]] | None = None
    #: the rows to read for the wire, given the database alias (default: the model's)
    rows: Callable[[str], Any] | None = None

    def queryset(self, using: str) -> Any:
        return self.rows(using) if self.rows is not None else self.model.objects.using(using)

    @property
    def table(self) -> str:
        return self.model._meta.db_table

    @property
    def id_column(self) -> str:
        return self.model._meta.get_field(self.model.STREAM_ID_FIELD).column

    @property
    def fields(self) -> Sequence[str]:
        return self.wire_fields if self.wire_fields is not None else self.model.WIRE_FIELDS

    def to_wire(self, values: Sequence[Any]) -> list[Any]:
        return (self.wire_row or self.model.wire_row)(values)


@dataclass(frozen=True)
class StreamSpec:
    """What the system knows about one stream."""

    name: str
    tables: tuple[BackingTable, ...] = ()
    #: PostgreSQL sequence (or SQLite ID-table entry) that hands out the stream IDs.
    sequence: str | None = None
    #: Whether more than one writer instance may be configured.
    multi_writer: bool = False
    #: Backfill-style stream: IDs go -1, -2, ... (the sequence still counts up).
    backwards: bool = False
    #: False when any process may write without being configured (Synapse's ``caches``).
    has_writer_list: bool = True
    #: Take the writer list of another stream (``backfill`` is written by the events writers).
    writers_from: str | None = None
    #: Wire row fields of an in-memory stream (database streams take them from their tables).
    memory_row_fields: tuple[str, ...] = ()
    description: str = field(default="", compare=False)

    @property
    def db_backed(self) -> bool:
        return bool(self.tables)

    @property
    def direction(self) -> IdDirection:
        return direction(self.backwards)

    def to_wire(self, stream_id: int) -> int:
        """The wire token of a stored stream ID (``backfill`` stores its IDs negated)."""
        return self.direction.to_wire(stream_id)

    def from_wire(self, token: int) -> int:
        return self.direction.from_wire(token)

    @property
    def primary_model(self) -> type[FactModel]:
        return self.tables[0].model

    @property
    def row_fields(self) -> tuple[str, ...]:
        if not self.tables:
            return self.memory_row_fields
        return tuple(self.tables[0].fields)


STREAMS: dict[str, StreamSpec] = {}


#: Synapse's registration order (its ``STREAMS_MAP``): ``STREAMS`` keeps it whichever app declares
#: a stream first (the order of POSITION commands, status tables and catch-up).
SYNAPSE_ORDER = ("events", "backfill", "presence", "presence_federation", "typing", "receipts",
                 "push_rules", "pushers", "caches", "device_lists", "to_device", "federation",
                 "account_data", "thread_subscriptions", "un_partial_stated_room", "un_partial_stated_event")


def declare(spec: StreamSpec) -> StreamSpec:
    """Add a stream to the catalogue: the engine declares the streams of its own fact tables,
    each other app the streams of its tables (``rooms``: events and backfill) when Django loads it."""
    if spec.name in STREAMS:
        raise ValueError(f"stream {spec.name!r} is declared twice")
    if spec.db_backed and not spec.sequence:
        raise ValueError(f"database-backed stream {spec.name!r} needs a sequence")
    STREAMS[spec.name] = spec
    rank = {name: n for n, name in enumerate(SYNAPSE_ORDER)}
    ordered = sorted(STREAMS.items(), key=lambda item: rank.get(item[0], len(rank)))
    STREAMS.clear()
    STREAMS.update(ordered)
    return spec


def get_stream(name: str) -> StreamSpec:
    try:
        return STREAMS[name]
    except KeyError:
        raise KeyError(f"unknown stream {name!r}; known streams: {', '.join(STREAMS)}") from None


# In Synapse's registration order (STREAMS_MAP); ``events`` and ``backfill`` are declared by the
# room event store, whose tables they are (rooms/event_streams.py).
declare(StreamSpec(
    "typing",
    memory_row_fields=("room_id", "user_ids"),
    description="who is typing in a room; in memory, resets when its writer restarts",
))
declare(StreamSpec(
    "receipts",
    tables=(BackingTable(Receipt),),
    sequence="receipts_sequence",
    multi_writer=True,
    description="read receipts",
))
declare(StreamSpec(
    "caches",
    tables=(BackingTable(CacheInvalidation),),
    sequence="cache_invalidation_stream_seq",
    multi_writer=True,
    has_writer_list=False,
    description="cache invalidations; every process may write",
))
declare(StreamSpec(
    "to_device",
    tables=(BackingTable(DeviceInbox),),
    sequence="device_inbox_sequence",
    description="to-device messages for local inboxes",
))
declare(StreamSpec(
    "account_data",
    tables=(BackingTable(AccountData),),
    sequence="account_data_sequence",
    description="global and per-room account data",
))

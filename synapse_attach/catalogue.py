"""Every stream of the pinned Synapse (1.163.2) and where its IDs live (docs/attach.md).

Written from Synapse's source, as data: the replication streams in the order of its
``STREAMS_MAP``, and for each the ID generator behind it (the ``stream_name`` it writes to
``stream_positions``, which is not always the replication name), the PostgreSQL sequence that
hands out its IDs and the tables (and ID column) its rows are stored in. Streams kept in a
process's memory (typing, federation, presence_federation) have none of these. The other
sequences Synapse checks at start-up (an ID generator that is no replication stream, and plain
sequences) are listed beside them, since the same drift stops or repairs them.
"""
from __future__ import annotations

from dataclasses import dataclass

#: The Synapse release this catalogue is read from (testing/synapse_homeserver.py pins it too).
SYNAPSE_VERSION = "1.163.2"


@dataclass(frozen=True)
class StreamTable:
    """A table holding a stream's rows: its name and the column with the stream ID."""

    table: str
    column: str


@dataclass(frozen=True)
class StreamSpec:
    """One stream as Synapse stores it.

    ``positions_name`` is the generator's name in ``stream_positions`` (``None``: the stream
    lives in memory only). ``positive`` is false for backfill, whose IDs are stored negated
    (rows and ``stream_positions`` alike) while its sequence counts up. ``records_positions``
    is false for generators built with no writers (``caches``): any process may write them,
    and none records a position. ``replicated`` is false for a generator that is no
    replication stream (it still has Synapse's start-up checks).
    """

    name: str
    positions_name: str | None = None
    sequence: str | None = None
    tables: tuple[StreamTable, ...] = ()
    positive: bool = True
    records_positions: bool = True
    replicated: bool = True
    database: str = "main"

    @property
    def in_memory(self) -> bool:
        return self.sequence is None

    @property
    def sign(self) -> int:
        """What a stored ID is multiplied by to give the stream's token (counting up)."""
        return 1 if self.positive else -1


@dataclass(frozen=True)
class CheckedSequence:
    """A plain sequence Synapse compares with its table at start-up (no stream, no writers)."""

    sequence: str
    table: StreamTable
    database: str = "main"


def _t(*pairs: str) -> tuple[StreamTable, ...]:
    """``_t("events.stream_ordering", ...)``: the tables, written as ``table.column``."""
    return tuple(StreamTable(*pair.split(".", 1)) for pair in pairs)


#: The replication streams, in ``STREAMS_MAP``'s order.
STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("events", "events", "events_stream_seq",
               _t("events.stream_ordering", "current_state_delta_stream.stream_id",
                  "ex_outlier_stream.event_stream_ordering")),
    StreamSpec("backfill", "backfill", "events_backfill_stream_seq",
               _t("events.stream_ordering", "ex_outlier_stream.event_stream_ordering"), positive=False),
    StreamSpec("presence", "presence_stream", "presence_stream_sequence", _t("presence_stream.stream_id")),
    StreamSpec("presence_federation"),
    StreamSpec("typing"),
    StreamSpec("receipts", "receipts", "receipts_sequence", _t("receipts_linearized.stream_id")),
    StreamSpec("push_rules", "push_rules_stream", "push_rules_stream_sequence", _t("push_rules_stream.stream_id")),
    StreamSpec("pushers", "pushers", "pushers_sequence", _t("pushers.id", "deleted_pushers.stream_id")),
    StreamSpec("caches", "caches", "cache_invalidation_stream_seq",
               _t("cache_invalidation_stream_by_instance.stream_id"), records_positions=False),
    StreamSpec("device_lists", "device_lists_stream", "device_lists_sequence",
               _t("device_lists_stream.stream_id", "user_signature_stream.stream_id",
                  "device_lists_outbound_pokes.stream_id", "device_lists_changes_in_room.stream_id",
                  "device_lists_remote_pending.stream_id",
                  "device_lists_changes_converted_stream_position.stream_id")),
    StreamSpec("to_device", "to_device", "device_inbox_sequence",
               _t("device_inbox.stream_id", "device_federation_outbox.stream_id")),
    StreamSpec("federation"),
    StreamSpec("account_data", "account_data", "account_data_sequence",
               _t("room_account_data.stream_id", "room_tags_revisions.stream_id", "account_data.stream_id")),
    StreamSpec("profile_updates", "profile_updates", "profile_updates_sequence", _t("profile_updates.stream_id")),
    StreamSpec("sticky_events", "sticky_events", "sticky_events_sequence", _t("sticky_events.stream_id")),
    StreamSpec("thread_subscriptions", "thread_subscriptions", "thread_subscriptions_sequence",
               _t("thread_subscriptions.stream_id")),
    StreamSpec("un_partial_stated_room", "un_partial_stated_room_stream", "un_partial_stated_room_stream_sequence",
               _t("un_partial_stated_room_stream.stream_id")),
    StreamSpec("un_partial_stated_event", "un_partial_stated_event_stream",
               "un_partial_stated_event_stream_sequence", _t("un_partial_stated_event_stream.stream_id")),
    StreamSpec("quarantined_media", "quarantined_media", "quarantined_media_id_seq",
               _t("quarantined_media_changes.stream_id")),
)

#: ID generators that are no replication stream but get the same start-up checks.
OTHER_GENERATORS: tuple[StreamSpec, ...] = (
    StreamSpec("e2e_cross_signing_keys", "e2e_cross_signing_keys", "e2e_cross_signing_keys_sequence",
               _t("e2e_cross_signing_keys.stream_id"), records_positions=False, replicated=False),
)

#: Plain sequences checked against their table when Synapse starts.
CHECKED_SEQUENCES: tuple[CheckedSequence, ...] = (
    CheckedSequence("event_auth_chain_id", StreamTable("event_auth_chains", "chain_id")),
    CheckedSequence("application_services_txn_id_seq", StreamTable("application_services_txns", "txn_id")),
    # With a separate state database (data_stores: ["state"]) this one lives there.
    CheckedSequence("state_group_id_seq", StreamTable("state_groups", "id"), database="state"),
)


def generators() -> tuple[StreamSpec, ...]:
    """Every stream with an ID generator (a sequence and tables), replicated or not."""
    return tuple(s for s in STREAMS + OTHER_GENERATORS if not s.in_memory)

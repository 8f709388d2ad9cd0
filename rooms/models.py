"""The room event store's tables (Synapse's names): events, the DAG, state groups as
deltas, current state, memberships, redactions, visibility ranges and the auth chain cover index."""
from __future__ import annotations

import json
import random
from typing import Any, ClassVar, Sequence

from django.db import models
from django.utils.translation import gettext_lazy as _

from streams.models import FactModel

# Backing tables of the ``events`` and ``backfill`` streams (Synapse's ``events`` and
# ``current_state_delta_stream``). Backfilled events carry negative stream orderings.

class Event(FactModel):
    """One persisted event: the exact JSON received, plus indexed columns."""

    STREAM_ID_FIELD = "stream_ordering"
    WIRE_FIELDS = (
        "event_id", "room_id", "type", "state_key", "redacts", "relates_to", "membership",
        "rejected", "outlier",
    )
    BACKFILL_WIRE_FIELDS = ("event_id", "room_id", "type", "state_key", "redacts", "relates_to")

    stream_ordering = models.BigIntegerField(_("stream ordering"), unique=True)
    topological_ordering = models.BigIntegerField(_("topological ordering"), default=0)
    depth = models.BigIntegerField(_("depth"), default=0)
    # Text columns are indexed in Meta, not with unique/db_index: no "like" copies.
    event_id = models.CharField(_("event ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255)
    type = models.CharField(_("type"), max_length=255)
    state_key = models.CharField(_("state key"), max_length=255, null=True, blank=True)
    sender = models.CharField(_("sender"), max_length=255)
    membership = models.CharField(_("membership"), max_length=32, null=True, blank=True)
    redacts = models.CharField(_("redacts"), max_length=255, null=True, blank=True)
    relates_to = models.CharField(_("relates to"), max_length=255, null=True, blank=True)
    rejected = models.BooleanField(_("rejected"), default=False)
    outlier = models.BooleanField(_("outlier"), default=False)
    received_ts = models.BigIntegerField(_("received at (ms)"), default=0)
    json = models.BinaryField(_("event JSON, exactly as received"))
    #: The one column of a fact that may change: set when a redaction of the event is
    #: persisted (rooms.storage.redactions, the only writer). The JSON is kept; reads prune.
    redacted = models.BooleanField(_("redacted"), default=False)

    class Meta:
        db_table = "events"
        verbose_name = _("event")
        verbose_name_plural = _("events")
        constraints = [models.UniqueConstraint(fields=["event_id"], name="events_event_id_unique")]
        # room_id alone is served by the room indexes, instance_name alone by events_writer_order.
        indexes = [
            models.Index(fields=["instance_name", "stream_ordering"], name="events_writer_order"),
            models.Index(fields=["room_id", "topological_ordering", "stream_ordering"], name="events_order_room"),
            models.Index(fields=["room_id", "stream_ordering"], name="events_room_stream"),
            models.Index(fields=["type"], name="events_type"),
            models.Index(fields=["sender"], name="events_sender"),
        ]

    def __str__(self) -> str:
        return self.event_id

    @classmethod
    def wire_row(cls, values: Sequence[Any]) -> list[Any]:
        return ["ev", list(values)]

    @classmethod
    def synthetic(cls, rng: random.Random, n: int) -> dict[str, Any]:
        room = f"!room{rng.randrange(50)}:localhost"
        sender = f"@user{rng.randrange(500)}:localhost"
        event_id = f"${rng.getrandbits(96):024x}{n:x}"
        body = {"msgtype": "m.text", "body": f"synthetic message {n} " + "x" * rng.randrange(40, 120)}
        event = {"type": "m.room.message", "room_id": room, "sender": sender, "content": body,
                 "origin_server_ts": 1_700_000_000_000 + n}
        return {
            "event_id": event_id, "room_id": room, "type": "m.room.message", "state_key": None,
            "sender": sender, "membership": None, "redacts": None, "relates_to": None,
            "rejected": False, "outlier": False, "received_ts": 1_700_000_000_000 + n,
            "topological_ordering": 0, "depth": 0,
            "json": json.dumps(event, separators=(",", ":")).encode(),
        }


class CurrentStateDelta(FactModel):
    """A change to a room's current state (``state`` rows of the events stream)."""

    WIRE_FIELDS = ("room_id", "type", "state_key", "event_id")

    stream_id = models.BigIntegerField(_("stream ID"))
    room_id = models.CharField(_("room ID"), max_length=255)
    type = models.CharField(_("type"), max_length=255)
    state_key = models.CharField(_("state key"), max_length=255)
    event_id = models.CharField(_("event ID (null: state removed)"), max_length=255, null=True)
    prev_event_id = models.CharField(_("previous event ID"), max_length=255, null=True)

    class Meta:
        db_table = "current_state_delta_stream"
        verbose_name = _("current state delta")
        verbose_name_plural = _("current state deltas")
        indexes = [
            models.Index(fields=["stream_id"], name="state_delta_stream_id"),
            models.Index(fields=["instance_name", "stream_id"], name="state_delta_writer_id"),
            models.Index(fields=["room_id"], name="state_delta_room_id"),
        ]

    def __str__(self) -> str:
        return f"{self.room_id} {self.type}/{self.state_key} @ {self.stream_id}"

    @classmethod
    def wire_row(cls, values: Sequence[Any]) -> list[Any]:
        return ["state", list(values)]


# Tables of the room event store that sit beside the ``events`` fact table.
#
# Indexes are declared in ``Meta`` (not ``db_index``/``unique`` on text fields), so PostgreSQL
# gets no extra ``varchar_pattern_ops`` "like" index per column: nothing here is searched by
# prefix, and every index is paid for on each persisted batch.
#
# Names and columns follow Synapse (its schema, ``synapse/storage/schema/``) where Synapse has the
# table, so Synapse tools and SQL read them unchanged. These are derived tables, written only by
# ``rooms.storage.persist`` (and, for visibility, by the batch jobs); they are not
# facts of a stream, so they are plain models.

class Room(models.Model):
    """Per-room bookkeeping of the persist path: where the room's history ends, its current
    state group (null while the room has several forward extremities), and its last change."""

    room_id = models.CharField(_("room ID"), max_length=255, primary_key=True)
    #: the highest (topological, stream) key of an accepted event in the room
    head_topological = models.BigIntegerField(_("head topological ordering"), default=0)
    head_stream = models.BigIntegerField(_("head stream ordering"), default=0)
    #: the highest positive stream ordering of the room (the "last change", for syncs)
    last_stream = models.BigIntegerField(_("last live stream ordering"), default=0, db_index=True)
    current_state_group = models.BigIntegerField(_("current state group"), null=True)
    min_depth = models.BigIntegerField(_("minimum depth"), null=True)
    #: from the create event's ``content.room_version`` (absent: "1"); null until it is stored
    room_version = models.CharField(_("room version"), max_length=64, null=True)
    #: the highest stream ordering a persisted event put behind an earlier one: lower in
    #: (topological, stream) than an event before it in the stream (a fork, a late or
    #: de-outliered event, one of several writers' events stored out of stream order). Null:
    #: none. Only up to it can an event of the room sit before one older in the stream, so an
    #: incremental sync from a later token skips ``*shared``'s walks and bounds each range's
    #: walk by stream ordering (``reads._visible_in_stream_order``). Never lowered; the
    #: ordering job sets the maximum.
    late_stream = models.BigIntegerField(_("last out-of-order stream ordering"), null=True)
    #: the create event was a full PDU (hashes, auth_events): every event of the room is then
    #: parsed per its room version and authorized; false for the older unsigned test format
    authorized = models.BooleanField(_("events are authorized"), default=False)

    class Meta:
        db_table = "rooms"
        verbose_name = _("room")
        verbose_name_plural = _("rooms")

    def __str__(self) -> str:
        return self.room_id


class EventEdge(models.Model):
    """One ``prev_events`` link of the room DAG (event -> an event before it). The key is the
    pair (Synapse's unique index); no surrogate ``id`` (30 MB per million events less)."""

    pk = models.CompositePrimaryKey("event_id", "prev_event_id")
    event_id = models.CharField(_("event ID"), max_length=255)
    prev_event_id = models.CharField(_("previous event ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255)

    class Meta:
        db_table = "event_edges"
        indexes = [models.Index(fields=["prev_event_id"], name="ev_edges_prev_id")]


class ForwardExtremity(models.Model):
    """The newest accepted events of a room that no accepted event references yet."""

    event_id = models.CharField(_("event ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255)

    class Meta:
        db_table = "event_forward_extremities"
        constraints = [models.UniqueConstraint(fields=["event_id", "room_id"], name="event_fwd_ext_event_room")]
        indexes = [models.Index(fields=["room_id"], name="event_fwd_ext_room")]


class BackwardExtremity(models.Model):
    """Events referenced as prev_events that we do not have: where backfill continues."""

    event_id = models.CharField(_("event ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255)

    class Meta:
        db_table = "event_backward_extremities"
        constraints = [models.UniqueConstraint(fields=["event_id", "room_id"], name="event_bwd_ext_event_room")]
        indexes = [models.Index(fields=["room_id"], name="event_bwd_ext_room")]


class StateGroup(models.Model):
    """A room state: a full snapshot (no edge) or a delta against one earlier group.

    ``chain_length`` counts the groups from this one to its snapshot, inclusive (1 for a
    snapshot; 2 for a base delta, whose parent is its chain's snapshot), so the persist path
    knows when a chain is full (next: a base delta or a snapshot, docs/storage.md) without a walk.
    """

    id = models.BigIntegerField(primary_key=True)
    room_id = models.CharField(_("room ID"), max_length=255)
    event_id = models.CharField(_("computed for event"), max_length=255)
    chain_length = models.IntegerField(_("groups to the snapshot"), default=1)

    class Meta:
        db_table = "state_groups"
        indexes = [models.Index(fields=["room_id"], name="state_groups_room_id_idx")]


class StateGroupEdge(models.Model):
    """A delta group's parent. The pair is the key (Synapse's unique index), with no surrogate
    ``id``."""

    pk = models.CompositePrimaryKey("state_group", "prev_state_group")
    state_group = models.BigIntegerField()
    prev_state_group = models.BigIntegerField()

    class Meta:
        db_table = "state_group_edges"
        indexes = [models.Index(fields=["prev_state_group"], name="state_group_edges_prev_idx")]


class StateGroupState(models.Model):
    """One (type, state_key) -> event row of a group: all of a snapshot, the added or
    overwritten keys of a delta.

    As in Synapse, the table has no primary key and no unique index: ``(state_group, type,
    state_key)`` is the row's key (the planner writes each key once per group), declared here
    because Django needs one, but the database holds only the index on ``state_group`` --
    every read takes a group's rows whole (``state_groups.read_state``), and that index, with
    PostgreSQL's deduplication, is a small fraction of the unique one over the three columns
    and the ``id`` primary key it replaces (migration ``0011_natural_keys``, which makes the
    table)."""

    pk = models.CompositePrimaryKey("state_group", "type", "state_key")
    state_group = models.BigIntegerField()
    room_id = models.CharField(max_length=255)
    type = models.CharField(max_length=255)
    state_key = models.CharField(max_length=255)
    event_id = models.CharField(max_length=255)

    class Meta:
        db_table = "state_groups_state"
        indexes = [models.Index(fields=["state_group"], name="state_groups_state_group")]


class PackedStateGroup(models.Model):
    """A big group's rows again, packed into two strings: its members' ``state_key``,
    ``event_id`` pairs and its other rows' ``type``, ``state_key``, ``event_id`` triples, each
    joined by ``\\x1f``, with their counts. Written beside ``state_groups_state`` (PostgreSQL
    only, in the same transaction) for a group of at least ``PACKED_MIN_ROWS`` rows -- a big
    room's snapshot -- whose keys and IDs hold no separator: a cold read of an 80,000-key
    state takes one row (compressed with lz4) instead of aggregating 80,000 rows on the server
    (``state_groups.read_state``). Never the only copy: the rows stay the truth,
    which the jobs read."""

    state_group = models.BigIntegerField(primary_key=True)
    members_count = models.IntegerField()
    members = models.TextField(null=True)  # null: no rows of that kind
    others_count = models.IntegerField()
    others = models.TextField(null=True)

    class Meta:
        db_table = "state_groups_packed"


class EventToStateGroup(models.Model):
    """The state after an event (before it, for a rejected event); outliers have no row."""

    #: the key (no surrogate ``id``); no index on ``state_group``: nothing looks events up by
    #: their group
    event_id = models.CharField(max_length=255, primary_key=True)
    state_group = models.BigIntegerField()

    class Meta:
        db_table = "event_to_state_groups"


class CurrentStateEvent(models.Model):
    """A room's current state, one row per key; for members also the membership, which makes
    it the current-membership table too (``rooms for user``)."""

    room_id = models.CharField(max_length=255)
    type = models.CharField(max_length=255)
    state_key = models.CharField(max_length=255)
    event_id = models.CharField(max_length=255)
    membership = models.CharField(max_length=32, null=True)
    event_stream_ordering = models.BigIntegerField()

    class Meta:
        db_table = "current_state_events"
        constraints = [models.UniqueConstraint(fields=["room_id", "type", "state_key"],
                                               name="current_state_events_room_type_key")]
        indexes = [
            models.Index(fields=["state_key", "membership"], name="current_state_members_user",
                         condition=models.Q(type="m.room.member")),
        ]


class RoomMembership(models.Model):
    """Every accepted ``m.room.member`` event: the membership history of a room."""

    event_id = models.CharField(max_length=255)
    user_id = models.CharField(max_length=255)
    sender = models.CharField(max_length=255)
    room_id = models.CharField(max_length=255)
    membership = models.CharField(max_length=32)
    event_stream_ordering = models.BigIntegerField()
    topological_ordering = models.BigIntegerField()

    class Meta:
        db_table = "room_memberships"
        constraints = [models.UniqueConstraint(fields=["event_id"], name="room_memberships_event")]
        indexes = [
            models.Index(fields=["user_id", "event_stream_ordering"], name="room_memberships_user_stream"),
            models.Index(fields=["room_id", "user_id"], name="room_memberships_room_user"),
        ]


class Redaction(models.Model):
    """An ``m.room.redaction``: ``redacts`` is its target (which may arrive later)."""

    event_id = models.CharField(max_length=255)
    redacts = models.CharField(max_length=255)
    received_ts = models.BigIntegerField()

    class Meta:
        db_table = "redactions"
        constraints = [models.UniqueConstraint(fields=["event_id"], name="redactions_event")]
        indexes = [models.Index(fields=["redacts"], name="redactions_redacts")]


class EventAuth(models.Model):
    """One ``auth_events`` link (event -> an event it cites as its authority), as Synapse's
    ``event_auth``; rejected events and outliers have theirs too.

    As Synapse's, the table has no primary key and one index, on ``event_id`` (the admin's
    auth events panel; nothing looks events up by ``auth_id``). Django needs a key, so
    ``(event_id, auth_id)`` is declared; the database does not hold it (migration
    ``0011_natural_keys`` makes the table)."""

    pk = models.CompositePrimaryKey("event_id", "auth_id")
    event_id = models.CharField(_("event ID"), max_length=255)
    auth_id = models.CharField(_("auth event ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255)

    class Meta:
        db_table = "event_auth"
        indexes = [models.Index(fields=["event_id"], name="event_auth_event_id")]


class ExOutlier(models.Model):
    """An outlier that became a full event (Synapse's ``ex_outlier_stream``): the event keeps
    its ``events.stream_ordering``; this row takes a new position of the events stream so
    workers hear of it: the stream sends it as an ``ev`` row (the event's fields, now with
    ``outlier`` false) at that position, as Synapse's events stream does. Written by the
    persist path with the SQL of the other derived tables, not by a stream writer."""

    STREAM_ID_FIELD: ClassVar[str] = "event_stream_ordering"

    event_stream_ordering = models.BigIntegerField(_("stream position"), primary_key=True)
    event_id = models.CharField(_("event ID"), max_length=255)
    state_group = models.BigIntegerField(_("state group"))
    instance_name = models.CharField(_("writer"), max_length=255)

    class Meta:
        db_table = "ex_outlier_stream"

    @classmethod
    def with_event_fields(cls, using: str) -> Any:
        """The rows, each annotated with its event's wire fields (``Event.WIRE_FIELDS``) read
        from the ``events`` row: what the events stream sends for it."""

        event = Event.objects.using(using).filter(event_id=models.OuterRef("event_id"))
        return cls.objects.using(using).annotate(**{
            name: models.Subquery(event.values(name)[:1]) for name in Event.WIRE_FIELDS if name != "event_id"})


class Rejection(models.Model):
    """Why an event was rejected (it is stored, never shown, and changes no state)."""

    event_id = models.CharField(max_length=255)
    reason = models.TextField()
    last_check = models.CharField(max_length=32)

    class Meta:
        db_table = "rejections"
        constraints = [models.UniqueConstraint(fields=["event_id"], name="rejections_event")]


class VisibilityRange(models.Model):
    """Who may see which events of a room: a range of the room's ordering
    ``(topological_ordering, stream_ordering)``, bounds inclusive, an open end (null) while the
    user still sees each new event. ``user_id`` ``*`` is anyone (world_readable history);
    ``*shared`` holds the shared-history eras, which a user sees up to their latest join (the
    reads clip them there; a user's own rows hold only what their membership grants). Written
    by the persist path and by the visibility batch job alike; read by every read
    (docs/storage.md)."""

    room_id = models.CharField(max_length=255)
    user_id = models.CharField(max_length=255)
    start_topological = models.BigIntegerField()
    start_stream = models.BigIntegerField()
    end_topological = models.BigIntegerField(null=True)
    end_stream = models.BigIntegerField(null=True)

    class Meta:
        db_table = "room_visibility_ranges"
        indexes = [
            models.Index(fields=["room_id", "user_id", "start_topological", "start_stream"],
                         name="visibility_room_user_start"),
            models.Index(fields=["user_id"], name="visibility_user"),
        ]


# The chain cover index of the rooms' auth graphs (``rooms.storage.chain_index_store``;
# docs/storage.md, "The chain cover index"). Names and columns follow Synapse's tables, plus ``room_id``
# so the batch job can rebuild and check rooms one at a time.

class EventAuthChain(models.Model):
    """A state event's position: the ``sequence_number``-th event of chain ``chain_id``."""

    event_id = models.CharField(_("event ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255)
    chain_id = models.BigIntegerField(_("chain"))
    sequence_number = models.BigIntegerField(_("sequence number"))

    class Meta:
        db_table = "event_auth_chains"
        constraints = [models.UniqueConstraint(fields=["event_id"], name="event_auth_chains_event"),
                       models.UniqueConstraint(fields=["chain_id", "sequence_number"],
                                               name="event_auth_chains_c_seq")]
        indexes = [models.Index(fields=["room_id"], name="event_auth_chains_room")]


class EventAuthChainLink(models.Model):
    """The origin position reaches the target position (and so everything below it)."""

    room_id = models.CharField(_("room ID"), max_length=255)
    origin_chain_id = models.BigIntegerField(_("origin chain"))
    origin_sequence_number = models.BigIntegerField(_("origin sequence number"))
    target_chain_id = models.BigIntegerField(_("target chain"))
    target_sequence_number = models.BigIntegerField(_("target sequence number"))

    class Meta:
        db_table = "event_auth_chain_links"
        indexes = [
            models.Index(fields=["origin_chain_id", "target_chain_id"], name="event_auth_chain_links_idx"),
            models.Index(fields=["room_id"], name="event_auth_chain_links_room"),
        ]


class EventAuthChainToCalculate(models.Model):
    """A state event not indexed yet: one of its auth events has no position (typically an
    out-of-band membership whose auth chain we do not have). Placed when it arrives."""

    event_id = models.CharField(_("event ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255)
    type = models.CharField(_("type"), max_length=255)
    state_key = models.CharField(_("state key"), max_length=255)

    class Meta:
        db_table = "event_auth_chain_to_calculate"
        constraints = [models.UniqueConstraint(fields=["event_id"], name="event_auth_chain_to_calc_event")]
        indexes = [models.Index(fields=["room_id"], name="event_auth_chain_to_calc_room")]

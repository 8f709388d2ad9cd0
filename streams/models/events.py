"""Backing tables of the ``events`` and ``backfill`` streams (Synapse's ``events`` and
``current_state_delta_stream``). Backfilled events carry negative stream orderings."""
from __future__ import annotations

import json
import random
from typing import Any, Sequence

from django.db import models
from django.utils.translation import gettext_lazy as _

from streams.models.base import FactModel


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
    #: persisted (streams.storage.redactions, the only writer). The JSON is kept; reads prune.
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

"""The stream-ID engine's tables: the append-only fact tables (``FactModel``) of the streams
that are no room events, and the tables that track where each stream stands."""
from __future__ import annotations

import random
from typing import Any, ClassVar, Sequence

from django.db import models
from django.utils.translation import gettext_lazy as _

# The base of every fact table: rows are inserted once and never changed or deleted.

class FactsAreAppendOnly(Exception):
    """Raised on any attempt to change or delete a fact: facts never change."""


class FactQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise FactsAreAppendOnly(f"{self.model.__name__} rows are facts and cannot be updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise FactsAreAppendOnly(f"{self.model.__name__} rows are facts and cannot be deleted")

    def bulk_update(self, objs: Any, fields: Any, batch_size: Any = None) -> int:
        raise FactsAreAppendOnly(f"{self.model.__name__} rows are facts and cannot be updated")

    def update_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise FactsAreAppendOnly(f"{self.model.__name__} rows are facts and cannot be updated")


class FactModel(models.Model):
    """A row of a stream's backing table.

    Subclasses name the column holding the stream ID (``STREAM_ID_FIELD``) and the fields
    sent on the wire, in Synapse's order (``WIRE_FIELDS``). Rows are written only through a
    :class:`streams.writer.StreamWriter`, which reserves the stream ID first.
    """

    STREAM_ID_FIELD: ClassVar[str] = "stream_id"
    WIRE_FIELDS: ClassVar[Sequence[str]] = ()

    #: Not ``db_index``: on PostgreSQL that adds a second, ``varchar_pattern_ops`` "like"
    #: index nothing uses. Each table declares ``(instance_name, <stream ID>)`` in its Meta:
    #: the one index catch-up pages (one writer's rows in a token range) and the admin's
    #: writer filter need. Every index is paid for on each inserted row.
    instance_name = models.CharField(_("writer"), max_length=255)

    objects = FactQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise FactsAreAppendOnly(f"{type(self).__name__} rows are facts and cannot be updated")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise FactsAreAppendOnly(f"{type(self).__name__} rows are facts and cannot be deleted")

    @classmethod
    def wire_row(cls, values: Sequence[Any]) -> list[Any]:
        """The RDATA row for the ``WIRE_FIELDS`` values of one database row."""
        return list(values)

    @classmethod
    def synthetic(cls, rng: random.Random, n: int) -> dict[str, Any]:
        """Field values of a synthetic fact number ``n`` (for ``write_facts``)."""
        raise NotImplementedError


# Backing tables of the smaller database-backed streams (Synapse's table names).
#
# Indexes are declared in ``Meta`` (not ``db_index`` on text fields: on PostgreSQL that adds a
# ``varchar_pattern_ops`` "like" copy, and nothing here is searched by prefix). Each table has
# ``stream_id`` (start-up: the highest ID, rows above a position), ``(instance_name,
# stream_id)`` (catch-up pages of one writer, the admin's writer filter) and what the admin's
# filters look up by.

_PAD = "abcdefghijklmnopqrstuvwxyz0123456789"


def _padding(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(_PAD) for _ in range(size))


class CacheInvalidation(FactModel):
    """``caches`` stream: "invalidate this cache at these keys" (null keys: the whole cache)."""

    WIRE_FIELDS = ("cache_func", "keys", "invalidation_ts")

    stream_id = models.BigIntegerField(_("stream ID"))
    cache_func = models.CharField(_("cache"), max_length=255)
    keys = models.JSONField(_("keys"), null=True)
    invalidation_ts = models.BigIntegerField(_("invalidated at (ms)"))

    class Meta:
        db_table = "cache_invalidation_stream_by_instance"
        verbose_name = _("cache invalidation")
        verbose_name_plural = _("cache invalidations")
        indexes = [
            models.Index(fields=["stream_id"], name="cache_inval_stream_id"),
            models.Index(fields=["instance_name", "stream_id"], name="cache_inval_writer_id"),
        ]

    def __str__(self) -> str:
        return f"{self.cache_func} @ {self.stream_id}"

    @classmethod
    def synthetic(cls, rng: random.Random, n: int) -> dict[str, Any]:
        return {
            "cache_func": rng.choice(["get_user_by_id", "get_room_version", "get_users_in_room"]),
            "keys": [f"@user{rng.randrange(10_000)}:localhost"],
            "invalidation_ts": 1_700_000_000_000 + n,
        }


class AccountData(FactModel):
    """``account_data`` stream: a user's global (room null) or per-room account data."""

    WIRE_FIELDS = ("user_id", "room_id", "account_data_type")

    stream_id = models.BigIntegerField(_("stream ID"))
    user_id = models.CharField(_("user ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255, null=True, blank=True)
    account_data_type = models.CharField(_("type"), max_length=255)
    content = models.JSONField(_("content"))

    class Meta:
        db_table = "account_data"
        verbose_name = _("account data")
        verbose_name_plural = _("account data")
        indexes = [
            models.Index(fields=["stream_id"], name="account_data_stream_id"),
            models.Index(fields=["instance_name", "stream_id"], name="account_data_writer_id"),
            models.Index(fields=["user_id"], name="account_data_user_id"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} {self.account_data_type} @ {self.stream_id}"

    @classmethod
    def synthetic(cls, rng: random.Random, n: int) -> dict[str, Any]:
        room = f"!room{rng.randrange(50)}:localhost" if rng.random() < 0.5 else None
        return {
            "user_id": f"@user{rng.randrange(500)}:localhost",
            "room_id": room,
            "account_data_type": "m.tag" if room else "im.vector.setting",
            "content": {"n": n, "note": _padding(rng, 40)},
        }


class DeviceInbox(FactModel):
    """``to_device`` stream: a message waiting in a local device's inbox."""

    WIRE_FIELDS = ("user_id",)

    stream_id = models.BigIntegerField(_("stream ID"))
    user_id = models.CharField(_("user ID"), max_length=255)
    device_id = models.CharField(_("device ID"), max_length=255)
    message_json = models.TextField(_("message JSON"))

    class Meta:
        db_table = "device_inbox"
        verbose_name = _("to-device message")
        verbose_name_plural = _("to-device messages")
        indexes = [
            models.Index(fields=["stream_id"], name="device_inbox_stream_id"),
            models.Index(fields=["instance_name", "stream_id"], name="device_inbox_writer_id"),
            models.Index(fields=["user_id"], name="device_inbox_user_id"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id}/{self.device_id} @ {self.stream_id}"

    @classmethod
    def synthetic(cls, rng: random.Random, n: int) -> dict[str, Any]:
        return {
            "user_id": f"@user{rng.randrange(500)}:localhost",
            "device_id": f"DEV{rng.randrange(5)}",
            "message_json": '{"type":"m.room_key_request","content":{"n":%d}}' % n,
        }


class Receipt(FactModel):
    """``receipts`` stream: a read receipt (linearized, as Synapse's ``receipts_linearized``)."""

    WIRE_FIELDS = ("room_id", "receipt_type", "user_id", "event_id", "thread_id", "data")

    stream_id = models.BigIntegerField(_("stream ID"))
    room_id = models.CharField(_("room ID"), max_length=255)
    receipt_type = models.CharField(_("receipt type"), max_length=255)
    user_id = models.CharField(_("user ID"), max_length=255)
    event_id = models.CharField(_("event ID"), max_length=255)
    thread_id = models.CharField(_("thread ID"), max_length=255, null=True, blank=True)
    data = models.JSONField(_("data"))

    class Meta:
        db_table = "receipts_linearized"
        verbose_name = _("receipt")
        verbose_name_plural = _("receipts")
        indexes = [
            models.Index(fields=["stream_id"], name="receipts_stream_id"),
            models.Index(fields=["instance_name", "stream_id"], name="receipts_writer_id"),
            models.Index(fields=["room_id"], name="receipts_room_id"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} {self.receipt_type} {self.event_id}"

    @classmethod
    def synthetic(cls, rng: random.Random, n: int) -> dict[str, Any]:
        # About 300 bytes per row with the fixed columns: the benchmark's fact size.
        return {
            "room_id": f"!room{rng.randrange(50)}:localhost",
            "receipt_type": "m.read",
            "user_id": f"@user{rng.randrange(500)}:localhost",
            "event_id": f"${rng.getrandbits(128):032x}",
            "thread_id": None,
            "data": {"ts": 1_700_000_000_000 + n, "pad": _padding(rng, 190)},
        }


# Tables that track where each stream stands (not facts: these rows do change).

class StreamPosition(models.Model):
    """Synapse's ``stream_positions``: the last position each writer recorded, plus when and
    by which process it last advanced (null on rows from before that was recorded)."""

    stream_name = models.CharField(_("stream"), max_length=255)
    instance_name = models.CharField(_("writer"), max_length=255)
    stream_id = models.BigIntegerField(_("position"))
    recorded_at = models.DateTimeField(_("last write"), null=True, blank=True)
    pid = models.IntegerField(_("process ID"), null=True, blank=True)
    host = models.CharField(_("host"), max_length=255, null=True, blank=True)
    #: when the process that last wrote as this writer closed it cleanly (nothing pending);
    #: null while it runs, and for a process that died or was killed
    exited_at = models.DateTimeField(_("exited cleanly at"), null=True, blank=True)

    class Meta:
        db_table = "stream_positions"
        verbose_name = _("stream position")
        verbose_name_plural = _("stream positions")
        constraints = [
            models.UniqueConstraint(fields=["stream_name", "instance_name"], name="stream_positions_idx")
        ]

    def __str__(self) -> str:
        return f"{self.stream_name}/{self.instance_name} @ {self.stream_id}"


class StreamReservation(models.Model):
    """Stream IDs a writer has reserved and not yet completed.

    Written in the same round trip that reserves the IDs and removed when they complete, so
    the pending set of every writer is visible to every process, and an ID whose writer died
    mid-transaction stays visible (and is reported as stuck) until that writer restarts.
    """

    stream_name = models.CharField(_("stream"), max_length=255)
    instance_name = models.CharField(_("writer"), max_length=255)
    stream_ids = models.JSONField(_("stream IDs"))
    reserved_at = models.DateTimeField(_("reserved at"))
    pid = models.IntegerField(_("process ID"))

    class Meta:
        db_table = "stream_reservations"
        verbose_name = _("pending stream ID reservation")
        verbose_name_plural = _("pending stream ID reservations")
        indexes = [models.Index(fields=["stream_name", "instance_name"], name="stream_reservations_idx")]

    def __str__(self) -> str:
        return f"{self.stream_name}/{self.instance_name} {self.stream_ids}"


class StreamSequence(models.Model):
    """The ID table that stands in for a PostgreSQL sequence on SQLite (one writer)."""

    name = models.CharField(_("sequence"), max_length=255, primary_key=True)
    last_value = models.BigIntegerField(_("last value"))

    class Meta:
        db_table = "stream_sequences"
        verbose_name = _("stream ID table (SQLite)")
        verbose_name_plural = _("stream ID tables (SQLite)")

    def __str__(self) -> str:
        return f"{self.name} = {self.last_value}"

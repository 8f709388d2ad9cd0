"""Backing tables of the smaller database-backed streams (Synapse's table names).

Indexes are declared in ``Meta`` (not ``db_index`` on text fields: on PostgreSQL that adds a
``varchar_pattern_ops`` "like" copy, and nothing here is searched by prefix). Each table has
``stream_id`` (start-up: the highest ID, rows above a position), ``(instance_name,
stream_id)`` (catch-up pages of one writer, the admin's writer filter) and what the admin's
filters look up by.
"""
from __future__ import annotations

import random
from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _

from streams.models.base import FactModel

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

"""Fact tables in the Django admin: read-only, because facts never change."""
from django.contrib import admin

from .models import (
    AccountData, CacheInvalidation, CurrentStateDelta, DeviceInbox, Event, Receipt,
    StreamPosition, StreamReservation,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("stream_ordering", "event_id", "room_id", "type", "sender", "instance_name")
    list_filter = ("type", "instance_name", "outlier")
    search_fields = ("event_id", "room_id", "sender")
    ordering = ("-stream_ordering",)


@admin.register(CurrentStateDelta)
class CurrentStateDeltaAdmin(ReadOnlyAdmin):
    list_display = ("stream_id", "room_id", "type", "state_key", "event_id", "instance_name")
    search_fields = ("room_id", "event_id")
    ordering = ("-stream_id",)


@admin.register(Receipt)
class ReceiptAdmin(ReadOnlyAdmin):
    list_display = ("stream_id", "room_id", "receipt_type", "user_id", "event_id", "instance_name")
    list_filter = ("receipt_type", "instance_name")
    search_fields = ("room_id", "user_id", "event_id")
    ordering = ("-stream_id",)


@admin.register(CacheInvalidation)
class CacheInvalidationAdmin(ReadOnlyAdmin):
    list_display = ("stream_id", "cache_func", "keys", "instance_name")
    list_filter = ("cache_func", "instance_name")
    ordering = ("-stream_id",)


@admin.register(AccountData)
class AccountDataAdmin(ReadOnlyAdmin):
    list_display = ("stream_id", "user_id", "room_id", "account_data_type", "instance_name")
    search_fields = ("user_id", "room_id")
    ordering = ("-stream_id",)


@admin.register(DeviceInbox)
class DeviceInboxAdmin(ReadOnlyAdmin):
    list_display = ("stream_id", "user_id", "device_id", "instance_name")
    search_fields = ("user_id",)
    ordering = ("-stream_id",)


@admin.register(StreamPosition)
class StreamPositionAdmin(ReadOnlyAdmin):
    list_display = ("stream_name", "instance_name", "stream_id")
    list_filter = ("stream_name",)


@admin.register(StreamReservation)
class StreamReservationAdmin(ReadOnlyAdmin):
    list_display = ("stream_name", "instance_name", "stream_ids", "reserved_at", "pid")
    list_filter = ("stream_name", "instance_name")

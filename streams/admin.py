"""Fact tables in the Django admin: read-only, because facts never change.

Every fact table can be searched and filtered by room, sender (or user), type, stream ID
(from/to, or a number typed in the search box) and writer; the other apps' admins (room
events, job runs, user IPs) build on ``ReadOnlyAdmin`` and ``FactAdmin`` here. The
stream-positions and pending-IDs pages carry the live panel of the dashboard (same WebSocket
feed). In every list, text columns (IDs, types, names) wrap only after their own separators
(``common.breakable``), never mid-word.
"""
from __future__ import annotations

import datetime
from typing import Any, Callable

from django.contrib import admin, messages
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import Q
from django.http import HttpResponseBadRequest, QueryDict
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.text import smart_split
from django.utils.translation import gettext_lazy as _

from common.breakable import breakable
from streams.identifiers import fits_stream_id
from streams.models import AccountData, CacheInvalidation, DeviceInbox, Receipt, StreamPosition, StreamReservation


class InputFilter(admin.SimpleListFilter):
    """A sidebar filter with a text box: ``lookup`` = the typed value."""

    template = "admin/input_filter.html"
    lookup = ""
    integer = False

    def lookups(self, request, model_admin):
        return (("", ""),)  # the sidebar shows filters that have choices

    def queryset(self, request, queryset):
        value = (self.value() or "").strip()
        if not value:
            return queryset
        if self.integer:
            if not fits_stream_id(value):  # ASCII digits, 64 bits (int() takes "٣" and 5,000 digits)
                messages.error(request, f"{self.title}: {value[:40]!r} is not a whole number "
                                        "(a stream ID is a 64-bit integer)")
                return queryset.none()
            value = int(value)
        return queryset.filter(**{self.lookup: value})

    def choices(self, changelist):
        params = changelist.get_filters_params()
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "hidden": [(k, v) for k, values in params.items() if k != self.parameter_name
                       for v in (values if isinstance(values, list) else [values])]
                      + ([("q", changelist.query)] if changelist.query else []),
            "display": _("All"),
        }


def input_filter(title: str, parameter: str, lookup: str, *, integer: bool = False) -> type[InputFilter]:
    return type(f"{parameter}_filter", (InputFilter,), {
        "title": title, "parameter_name": parameter, "lookup": lookup, "integer": integer,
    })


#: Admin searches: each term is an OR over every search field, ANDed with the others, so a
#: search's cost grows with its terms (2,000 took 15 s); nobody types more than a few.
MAX_SEARCH_TERMS = 10
MAX_SEARCH_CHARACTERS = 256


def bad_changelist_query(query: QueryDict) -> str | None:
    """Why a list page's query cannot be run (``None``: it can): a NUL byte anywhere
    (PostgreSQL refuses it in text), or a search too long or with too many terms."""
    for key, values in query.lists():
        if any("\x00" in v for v in (key, *values)):
            return f"{key[:40]!r}: NUL characters are not allowed in searches and filters"
    search = query.get(SEARCH_VAR, "")
    terms = sum(1 for _ in smart_split(search))
    if terms > MAX_SEARCH_TERMS:
        return f"the search has {terms} terms; at most {MAX_SEARCH_TERMS} terms are allowed"
    if len(search) > MAX_SEARCH_CHARACTERS:
        return (f"the search is {len(search)} characters long; at most {MAX_SEARCH_CHARACTERS} "
                "characters are allowed")
    return None


def breakable_column(model: type[models.Model], name: str) -> Callable[[Any], Any]:
    """A list column showing the text field ``name`` wrapped only after its separators
    (sorted by the field, its cells still ``field-<name>``)."""
    field = model._meta.get_field(name)

    @admin.display(description=field.verbose_name, ordering=name)
    def column(row):
        value = getattr(row, name)
        return None if value is None else breakable(value)
    column.__name__ = name
    return column


def _is_text_column(model: type[models.Model], name: Any) -> bool:
    if not isinstance(name, str):
        return False
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:  # a method or admin attribute
        return False
    return isinstance(field, models.CharField) and not field.choices


def epoch_ms_time(ms: int):
    """Milliseconds since the epoch as the one time format (UTC), the number in its tooltip;
    the number alone when it is no time (a peer's odd clock)."""
    try:
        when = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return ms
    return format_html('<time datetime="{}" title="{} ms since 1970-01-01 UTC">{}</time>',
                       when.isoformat(timespec="milliseconds"), ms, date_format(when, "DATETIME_FORMAT"))


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shows rows, never adds, changes or deletes them."""

    def get_list_display(self, request):
        """Text columns wrap only after an identifier's separators, never mid-word."""
        return [breakable_column(self.model, name) if _is_text_column(self.model, name) else name
                for name in super().get_list_display(request)]

    def changelist_view(self, request, extra_context=None):
        problem = bad_changelist_query(request.GET)
        if problem is not None:
            return HttpResponseBadRequest(f"Bad request: {problem}.", content_type="text/plain; charset=utf-8")
        return super().changelist_view(request, extra_context)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class FactAdmin(ReadOnlyAdmin):
    """Read-only admin of a fact table, with search and filters on its identifying columns."""

    #: (filter title, column) for the text-box filters of this table
    text_filters: tuple[tuple[str, str], ...] = ()
    #: columns with few distinct values: ordinary choice filters
    choice_filters: tuple[str, ...] = ("instance_name",)
    list_per_page = 50
    show_full_result_count = False  # COUNT(*) of a large fact table on every page is slow

    @property
    def stream_id_field(self) -> str:
        return self.model.STREAM_ID_FIELD

    def get_ordering(self, request):
        return ("-" + self.stream_id_field,)

    def get_list_filter(self, request):
        sid = self.stream_id_field
        return (
            *self.choice_filters,
            input_filter(_("stream ID from"), "sid_from", f"{sid}__gte", integer=True),
            input_filter(_("stream ID to"), "sid_to", f"{sid}__lte", integer=True),
            *(input_filter(title, f"by_{column}", column) for title, column in self.text_filters),
        )

    def get_search_results(self, request, queryset, search_term):
        """A whole number in the search box finds the fact with that stream ID (IDs, rooms and
        users are searched by any other text)."""
        term = search_term.strip()
        if fits_stream_id(term):  # not str.isdigit(): it takes "²", which int() refuses
            return queryset.filter(Q(**{self.stream_id_field: int(term)})), False
        return super().get_search_results(request, queryset, search_term)


@admin.register(Receipt)
class ReceiptAdmin(FactAdmin):
    list_display = ("stream_id", "room_id", "receipt_type", "user_id", "event_id", "instance_name")
    choice_filters = ("receipt_type", "instance_name")
    text_filters = ((_("room"), "room_id"), (_("sender"), "user_id"))
    search_fields = ("room_id", "user_id", "event_id")


@admin.register(CacheInvalidation)
class CacheInvalidationAdmin(FactAdmin):
    list_display = ("stream_id", "cache_func", "keys", "instance_name")
    choice_filters = ("cache_func", "instance_name")
    search_fields = ("cache_func",)


@admin.register(AccountData)
class AccountDataAdmin(FactAdmin):
    list_display = ("stream_id", "user_id", "room_id", "account_data_type", "instance_name")
    choice_filters = ("account_data_type", "instance_name")
    text_filters = ((_("room"), "room_id"), (_("sender"), "user_id"))
    search_fields = ("user_id", "room_id", "account_data_type")


@admin.register(DeviceInbox)
class DeviceInboxAdmin(FactAdmin):
    list_display = ("stream_id", "user_id", "device_id", "instance_name")
    text_filters = ((_("sender"), "user_id"),)
    search_fields = ("user_id", "device_id")


@admin.register(StreamPosition)
class StreamPositionAdmin(ReadOnlyAdmin):
    list_display = ("stream_name", "instance_name", "stream_id")
    list_filter = ("stream_name", "instance_name")
    change_list_template = "admin/streams/live_change_list.html"


@admin.register(StreamReservation)
class StreamReservationAdmin(ReadOnlyAdmin):
    list_display = ("stream_name", "instance_name", "stream_ids", "reserved_at", "pid")
    list_filter = ("stream_name", "instance_name")
    change_list_template = "admin/streams/live_change_list.html"

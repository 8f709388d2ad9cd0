"""Fact tables in the Django admin: read-only, because facts never change.

Every fact table can be searched and filtered by room, sender (or user), type, stream ID
(from/to, or a number typed in the search box) and writer. An event's page shows its stored
JSON exactly as received and pretty-printed, and the panels of ``admin_panels`` (edges,
verdict, state group, state at the event), and when it was received (UTC; the stored
milliseconds in its tooltip). The stream-positions and pending-IDs pages carry the live panel
of the dashboard (same WebSocket feed). In every list, text columns (IDs, types, names) wrap
only after their own separators (``synapse_repl.wrapping``), never mid-word.
"""
from __future__ import annotations

import datetime
import json
from typing import Any, Callable

from django.contrib import admin, messages
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import Q
from django.http import HttpResponseBadRequest, QueryDict
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.text import smart_split
from django.utils.translation import gettext_lazy as _

from streams.admin_panels import EVENT_DETAIL_PANELS
from streams.identifiers import fits_stream_id
from streams.models import (
    AccountData,
    CacheInvalidation,
    CurrentStateDelta,
    DeviceInbox,
    Event,
    JobRun,
    Receipt,
    StreamPosition,
    StreamReservation,
    UserIp,
)
from synapse_repl.wrapping import breakable


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


@admin.register(Event)
class EventAdmin(FactAdmin):
    list_display = ("stream_ordering", "event_id", "room_id", "type", "sender", "instance_name")
    choice_filters = ("type", "instance_name", "outlier", "rejected")
    text_filters = ((_("room"), "room_id"), (_("sender"), "sender"))
    search_fields = ("event_id", "room_id", "sender", "type")
    exclude = ("json", "received_ts")
    readonly_fields = ("received_at", "json_exact", "json_pretty")
    change_form_template = "admin/streams/event/change_form.html"

    @admin.display(description=_("received at"))
    def received_at(self, obj: Event):
        return epoch_ms_time(obj.received_ts)

    @admin.display(description=_("JSON as stored"))
    def json_exact(self, obj: Event) -> str:
        return format_html('<pre class="event-json exact">{}</pre>',
                           bytes(obj.json).decode("utf-8", errors="backslashreplace"))

    @admin.display(description=_("JSON, pretty"))
    def json_pretty(self, obj: Event) -> str:
        try:
            pretty = json.dumps(json.loads(bytes(obj.json)), indent=2, ensure_ascii=False)
        except ValueError as e:
            return format_html('<p class="errornote">not valid JSON: {}</p>', e)
        return format_html('<pre class="event-json pretty">{}</pre>', pretty)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        obj = self.get_object(request, object_id)
        panels = [(title, render(obj)) for title, render in EVENT_DETAIL_PANELS] if obj is not None else []
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "event_panels": panels})


@admin.register(CurrentStateDelta)
class CurrentStateDeltaAdmin(FactAdmin):
    list_display = ("stream_id", "room_id", "type", "state_key", "event_id", "instance_name")
    choice_filters = ("type", "instance_name")
    text_filters = ((_("room"), "room_id"),)
    search_fields = ("room_id", "event_id", "state_key")


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


@admin.register(UserIp)
class UserIpAdmin(ReadOnlyAdmin):
    """Where each user's clients were last seen (USER_IP from the workers, written in batches
    by the replication endpoints). Access tokens are not shown: only their last characters."""

    list_display = ("user_id", "ip", "device_id", "user_agent", "last_seen_at", "token_tail")
    list_filter = (input_filter(_("user"), "by_user_id", "user_id"), input_filter(_("IP address"), "by_ip", "ip"),
                   input_filter(_("device"), "by_device_id", "device_id"))
    search_fields = ("user_id", "ip", "device_id")
    exclude = ("access_token",)
    readonly_fields = ("token_tail", "last_seen_at")
    ordering = ("-last_seen",)
    list_per_page = 50
    show_full_result_count = False

    @admin.display(description=_("last seen"), ordering="last_seen")
    def last_seen_at(self, row: UserIp):
        import datetime

        try:
            return datetime.datetime.fromtimestamp(row.last_seen / 1000, datetime.timezone.utc)
        except (OverflowError, OSError, ValueError):  # a peer's odd clock: show the number
            return row.last_seen

    @admin.display(description=_("access token"))
    def token_tail(self, row: UserIp) -> str:
        return "…" + row.access_token[-4:] if len(row.access_token) > 8 else "…"


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdmin):
    """Batch-job runs, as the runner recorded them (start one from the dashboard)."""

    list_display = ("id", "job", "outcome", "trigger", "started_at", "duration", "rows_in", "rows_out", "differences")
    list_filter = ("job", "status", "trigger")
    readonly_fields = ("job", "parameters", "outcome", "trigger", "started_at", "ended_at", "rows_in", "rows_out",
                       "differences", "difference_table", "error")
    fields = readonly_fields  # the raw sample and status stay out: the table and outcome say it better

    @admin.display(description=_("status"), ordering="status")
    def outcome(self, run: JobRun):
        """A check with differences reads as failed (in red), not like a clean one."""
        colour = {"failed": "#b3261e", "refused": "#b3261e", "succeeded": "#2b8a3e"}.get(run.verdict, "inherit")
        return format_html('<span class="status-{}" style="color: {}; font-weight: 600">{}</span>',
                           run.verdict, colour, run.verdict_text)

    @admin.display(description=_("first differences"))
    def difference_table(self, run: JobRun):
        columns, rows = run.shown_differences()
        if not rows:
            return "—"
        return format_html(
            '<p>first {} of {}</p><div class="scroll-x"><table class="differences"><thead><tr>{}</tr></thead>'
            '<tbody>{}</tbody></table></div>',
            len(rows), run.differences,
            format_html_join("", "<th>{}</th>", ((c,) for c in columns)),
            format_html_join("", "<tr>{}</tr>", ((format_html_join("", "<td>{}</td>", ((breakable(v),) for v in row)),)
                                                 for row in rows)))

    @admin.display(description=_("duration (s)"))
    def duration(self, run: JobRun):
        return None if run.duration_seconds is None else round(run.duration_seconds, 1)

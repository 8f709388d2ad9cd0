"""Room events in the Django admin, read-only: searched and filtered by room, sender, type,
stream ID and writer; an event's page shows its stored JSON exactly as received and
pretty-printed, and the panels of ``rooms.event_panels`` (edges, verdict, state group, state
at the event)."""
from __future__ import annotations

import json

from django.contrib import admin
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from rooms.event_panels import EVENT_DETAIL_PANELS
from rooms.models import CurrentStateDelta, Event
from streams.admin import FactAdmin, epoch_ms_time


@admin.register(Event)
class EventAdmin(FactAdmin):
    list_display = ("stream_ordering", "event_id", "room_id", "type", "sender", "instance_name")
    choice_filters = ("type", "instance_name", "outlier", "rejected")
    text_filters = ((_("room"), "room_id"), (_("sender"), "sender"))
    search_fields = ("event_id", "room_id", "sender", "type")
    exclude = ("json", "received_ts")
    readonly_fields = ("received_at", "json_exact", "json_pretty")
    change_form_template = "admin/rooms/event/change_form.html"

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

"""``{% stream_status_now as streams %}``: the live panel's first render in admin pages."""
from datetime import datetime, timezone

from django import template
from django.utils.html import format_html

from dashboard.stream_table import streams_as_served
from streams.admin import epoch_ms_time
from streams.stream_status import BACKWARDS_NOTE

register = template.Library()


@register.simple_tag
def stream_status_now():
    return streams_as_served()


@register.simple_tag
def backwards_note():
    return BACKWARDS_NOTE


@register.filter
def epoch_ms(value):
    """Milliseconds since the epoch (a peer's report) as a UTC time, the number on hover."""
    return epoch_ms_time(value) if isinstance(value, int) else value


@register.filter
def epoch_seconds(value):
    """Seconds since the epoch (an endpoint's snapshot) as a UTC time, which may wrap at its
    space but never inside its date: as ``when()`` in live.js renders it."""
    if not isinstance(value, (int, float)):
        return value
    text = datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    day, clock = text.split(" ")
    return format_html('<span class="when"><span>{}</span> {} UTC</span>', day, clock)

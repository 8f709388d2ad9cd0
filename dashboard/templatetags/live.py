"""``{% stream_status_now as streams %}``: the live panel's first render in admin pages."""
from django import template

from dashboard.stream_status import streams_as_served
from streams.admin import epoch_ms_time
from streams.status import BACKWARDS_NOTE

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

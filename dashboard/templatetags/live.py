"""``{% stream_status_now as streams %}``: the live panel's first render in admin pages."""
from django import template

from streams.status import stream_status

register = template.Library()


@register.simple_tag
def stream_status_now():
    return stream_status()

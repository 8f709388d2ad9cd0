"""``{{ value|breakable }}``: an identifier that may wrap only after its own separators
(common.breakable)."""
from django import template

from common.breakable import breakable as _breakable

register = template.Library()


@register.filter(is_safe=True)
def breakable(value):
    return _breakable(value)

"""``{{ value|breakable }}``: an identifier that may wrap only after its own separators
(synapse_repl.wrapping)."""
from django import template

from synapse_repl.wrapping import breakable as _breakable

register = template.Library()


@register.filter(is_safe=True)
def breakable(value):
    return _breakable(value)

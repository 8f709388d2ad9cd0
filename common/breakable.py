"""Where a long identifier may wrap on a page: right after one of its own separators
(``!room:|server``, ``m.room.|message``, ``check_|topological_ordering``), never inside a word.

Browsers break text only at spaces (and after some hyphens); CSS that breaks "anywhere"
breaks mid-word (``m.room.me|ssage``, ``127.0.0.1:487|84``). A ``<wbr>`` after each separator
gives the browser those break points and nothing else; a copied ID stays as it was (``<wbr>``
is no character). The live pages' script does the same (``static/dashboard/live.js``,
``breakable``)."""
from __future__ import annotations

import re

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

#: the characters an identifier may wrap after (none of them comes out of ``escape``)
SEPARATORS = ":./_"
_AFTER_SEPARATOR = re.compile(f"([{re.escape(SEPARATORS)}])(?=.)")


def breakable(value: object) -> SafeString:
    """``value`` as HTML, escaped, with a ``<wbr>`` after each separator but the last character."""
    return mark_safe(_AFTER_SEPARATOR.sub(r"\1<wbr>", escape(str(value))))

"""Passwords in URLs never reach a log line, a page or a command's output (docs/security.md).

``DATABASE_URL`` and ``REDIS_URL`` carry their passwords (``postgres://u:PASSWORD@h/db``,
``redis://:PASSWORD@h:6379/0``). Everything that prints a URL goes through
:func:`redact_url`; text that may embed one (an exception's message, a log line built by a
library) goes through :func:`redact_text`. Two nets catch what code forgets: every log record
is formatted by :class:`RedactingFormatter` (``LOGGING`` in settings), and the debug error
page's settings dump goes through :class:`RedactingExceptionReporterFilter`.
"""
from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.views.debug import SafeExceptionReporterFilter

#: What a password becomes.
MASK = "***"

# scheme://user:password@  (user may be empty, as in redis://:password@host). The password
# runs to the last "@" before the host part ends (a password may itself contain "@").
_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s:/@?#]*):(?P<password>[^\s/?#]*)@")


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``; other URLs unchanged."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL we can parse (a bad port...): mask by pattern instead
        return redact_text(url)
    if password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))


def redact_text(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it masked."""
    if "://" not in text:
        return text
    return _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)


class RedactingFormatter(logging.Formatter):
    """The usual formatter, then :func:`redact_text` over the whole line (message, arguments
    and traceback alike)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class RedactingWrapper(logging.Formatter):
    """Another formatter's lines, redacted (for handlers set up by others, as Celery's)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(self.inner.format(record))


class RedactingExceptionReporterFilter(SafeExceptionReporterFilter):
    """Django's debug error page hides settings named like secrets; this also masks the
    password of every URL in the others (``DATABASE_URL``, ``REDIS_URL``, Celery's, the
    channel layer's hosts)."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        return redact_text(cleansed) if isinstance(cleansed, str) else cleansed

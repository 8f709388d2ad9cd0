"""How the web answers what is not a bug of ours: bad input (4xx) and a database it cannot
use (503), with a message, never a bare 500 (docs/security.md).

* :class:`RejectNulMiddleware`: a NUL byte in the path, a query or a form field is refused
  (400) before any view runs. PostgreSQL refuses NUL in text (``DataError``, a 500), and no
  identifier, token or name of this service has one; views check their own parameters too
  (``streams/identifiers.py``), this is the net under them.
* :class:`DatabaseUnavailableMiddleware` and :func:`server_error` (``handler500``): the
  database refusing connections (PostgreSQL out of ``max_connections``, stopped, unreachable;
  SQLite locked) answers 503 with the reason and ``Retry-After``, wherever in the request it
  happened (a view, or a middleware such as the session's).
* :class:`database_errors_as_one_line`: the same for ``runservice`` and ``runreplication``:
  one line on stderr naming the fix, exit status 1.

Answers are JSON (``{"errcode", "error"}``, as the catch-up endpoint's) under ``/api/``,
``/_synapse/`` and for ``*.json``; plain text elsewhere.
"""
from __future__ import annotations

import logging
import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from django.views import defaults

from common.url_redaction import redact_text, redact_url

logger = logging.getLogger(__name__)

#: Seconds a client is told to wait before trying again after a 503.
RETRY_AFTER_SECONDS = 5

_JSON_PREFIXES = ("/api/", "/_synapse/")


def wants_json(request: HttpRequest) -> bool:
    path = request.path_info
    return path.startswith(_JSON_PREFIXES) or path.endswith(".json")


def error_response(request: HttpRequest, status: int, errcode: str, message: str) -> HttpResponse:
    if wants_json(request):
        return JsonResponse({"errcode": errcode, "error": message}, status=status)
    return HttpResponse(f"{message}\n", status=status, content_type="text/plain; charset=utf-8")


# --- NUL bytes ---------------------------------------------------------------------------------


def nul_in_request(request: HttpRequest) -> str | None:
    """Where a NUL byte is in ``request`` (``None``: nowhere): the path, a query or form key or
    value."""
    if "\x00" in request.path_info:
        return "the path"
    sources = [request.GET]
    if request.method == "POST" and request.content_type in ("application/x-www-form-urlencoded",
                                                              "multipart/form-data"):
        sources.append(request.POST)
    for query in sources:
        for key, values in query.lists():
            if "\x00" in key or any("\x00" in v for v in values):
                return f"parameter {key[:40]!r}"
    return None


class RejectNulMiddleware(MiddlewareMixin):
    """400 for a request with a NUL byte in its path, query or form (see the module).
    (``MiddlewareMixin``: runs on the async path too, without a thread hop.)"""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        where = nul_in_request(request)
        if where is None:
            return None
        return error_response(request, 400, "M_INVALID_PARAM",
                              f"{where} contains a NUL character, which no identifier, token or name can hold")


# --- the database unavailable ------------------------------------------------------------------

_OUT_OF_CONNECTIONS = ("too many clients", "too many connections", "remaining connection slots")


def database_unavailable_reason(error: BaseException) -> str:
    """One sentence for clients: what is wrong with the database (never its address)."""
    text = str(error).lower()
    if any(s in text for s in _OUT_OF_CONNECTIONS):
        return ("the database has no free connections for this service (PostgreSQL refuses new ones: "
                "max_connections or a connection limit is reached); try again shortly")
    if "database is locked" in text:
        return "the database is busy (SQLite is locked by another writer); try again shortly"
    return "the database cannot be reached; try again shortly"


def database_unavailable(request: HttpRequest, error: BaseException) -> HttpResponse:
    logger.error("%s %s: database unavailable: %s", request.method, request.path_info,
                 redact_text(str(error)).strip().replace("\n", " "))
    response = error_response(request, 503, "M_UNAVAILABLE", database_unavailable_reason(error))
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def is_database_unavailable(error: BaseException | None) -> bool:
    # OperationalError: refused, unreachable, out of connections, locked; InterfaceError: a
    # connection that died under us. (DataError, IntegrityError... are bugs or bad input.)
    return isinstance(error, (OperationalError, InterfaceError))


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """A view that hits an unavailable database answers 503 with the reason."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if is_database_unavailable(exception):
            return database_unavailable(request, exception)
        return None


def database_unavailable_line(error: BaseException) -> str:
    """One line for a command that cannot start (or go on) without its database: what
    PostgreSQL said, where ``DATABASE_URL`` points (password masked) and what to do."""
    from django.conf import settings

    said = redact_text(" ".join(str(error).split()))[:300]
    where = redact_url(getattr(settings, "DATABASE_URL", ""))
    if any(s in said.lower() for s in _OUT_OF_CONNECTIONS):
        fix = "raise PostgreSQL's max_connections (or the role's limit) or stop what holds the connections"
        what = "the database has no free connections"
    elif "database is locked" in said.lower():
        fix = "stop the other process holding SQLite's write lock"
        what = "the database is locked"
    else:
        fix = "start the database or fix DATABASE_URL"
        what = "the database cannot be reached"
    return f"{what} (DATABASE_URL={where}): {said}; {fix}"


class database_errors_as_one_line:
    """Context manager for management commands: an unavailable database ends the command
    with one line (``CommandError``: exit status 1), not a hundred-line traceback."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if error is not None and is_database_unavailable(error):
            from django.core.management.base import CommandError

            raise CommandError(database_unavailable_line(error)) from None
        return False


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: the same 503 when what failed outside a view (a middleware) was the
    database; Django's 500 page otherwise."""
    error = sys.exc_info()[1]
    if is_database_unavailable(error):
        return database_unavailable(request, error)
    return defaults.server_error(request)

"""PostgreSQL connections of their own, beside Django's: for work whose session must not be
Django's (stream-ID reservations, advisory locks of batch jobs)."""
from __future__ import annotations

from typing import Any

from django.db import connections


def connection_kwargs(using: str = "default") -> dict[str, Any]:
    """psycopg keyword arguments for the database of Django alias ``using``."""
    params = connections[using].settings_dict
    kwargs = {
        "dbname": params.get("NAME"),
        "user": params.get("USER") or None,
        "password": params.get("PASSWORD") or None,
        "host": params.get("HOST") or None,
        "port": params.get("PORT") or None,
    }
    return {k: v for k, v in kwargs.items() if v}


def dedicated_connection(application_name: str, using: str = "default") -> Any:
    """A new autocommit psycopg connection to the database of ``using``."""
    import psycopg

    return psycopg.connect(**connection_kwargs(using), autocommit=True, application_name=application_name)


#: psycopg's prepare threshold on a Django connection once :func:`explicit_prepares` ran:
#: never reached, so only statements executed with ``prepare=True`` are prepared.
_EXPLICIT_ONLY = 1 << 62


def explicit_prepares(pg: Any) -> None:
    """Let the writer prepare its own hot statements on Django's psycopg connection ``pg``.

    Django turns prepared statements off (``prepare_threshold=None``, for transaction-mode
    poolers), so each statement is parsed and planned again: 200-300 us of server CPU per
    one-fact append, most of it planning the reservation and the row-and-completion
    statement. A threshold that is never reached keeps every other statement unprepared
    (Django's own cursors bind client-side and never prepare), while ``execute(...,
    prepare=True)`` prepares the writer's. The writer already needs its session (``currval``
    of the ID it reserved), so a transaction-mode pooler was never possible for it.
    """
    if pg.prepare_threshold is None:
        pg.prepare_threshold = _EXPLICIT_ONLY

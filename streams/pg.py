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

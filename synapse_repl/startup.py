"""Start-up checks: a process that cannot do its work says why in one line and exits non-zero,
instead of a traceback, or retrying forever while looking alive (README, "When it does not
start").

Each check raises :class:`StartupError`, whose text names what is wrong and how to fix it;
``manage.py`` prints that text as one line on stderr and exits 1 (:func:`explain` turns the
other exceptions that mean "cannot start" into such a line too). The commands call the checks
they need before doing anything: :func:`check_database` (reachable and migrated),
:func:`check_redis`, :func:`check_java` and :func:`check_listen`. Nothing here imports Django
settings at import time: ``settings.py`` itself uses :func:`database_url_problem`.
"""
from __future__ import annotations

import errno
import os
import shutil
import socket

from common.error_text import one_line as _one_line
from common.redis_ping import ping_redis
from common.url_redaction import redact_url  # (error lines end up in logs)

#: The ``DATABASE_URL`` schemes this project runs on (PostgreSQL, or SQLite embedded).
DATABASE_SCHEMES = ("postgres", "postgresql", "pgsql", "sqlite")
DATABASE_URL_FORMS = "postgres://USER:PASSWORD@HOST:5432/DBNAME or sqlite:////absolute/path/db.sqlite3"
REDIS_SCHEMES = ("redis", "rediss", "unix")


class StartupError(Exception):
    """This process cannot start: the message says why and what to do about it (one line)."""


def database_url_problem(url: str) -> str | None:
    """What is wrong with a ``DATABASE_URL`` before anything tries it (``None``: nothing)."""
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        return f"DATABASE_URL={redact_url(url)!r} has no scheme: set it to {DATABASE_URL_FORMS}"
    if scheme.lower() not in DATABASE_SCHEMES:
        return (f"DATABASE_URL={redact_url(url)!r}: the scheme {scheme!r} is not supported "
                f"(PostgreSQL or SQLite only): set it to {DATABASE_URL_FORMS}")
    return None


def redis_url_problem(url: str) -> str | None:
    """What is wrong with a (non-empty) ``REDIS_URL`` before anything tries it."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in REDIS_SCHEMES:
        return (f"REDIS_URL={redact_url(url)!r}: expected redis://HOST:6379/0 (or rediss://, "
                "unix://); unset it for the embedded in-memory layer")
    return None


def _database_label(alias: str) -> str:
    from django.conf import settings

    if alias == "default":
        return f"DATABASE_URL {redact_url(settings.DATABASE_URL)}"
    db = settings.DATABASES[alias]
    return f"database {alias!r} ({db.get('HOST') or db.get('NAME')})"


def check_database(alias: str = "default", *, migrated: bool = True) -> None:
    """The database answers, and (``migrated``) every migration has been applied."""
    from django.db import DatabaseError, connections

    # deferred: manage.py imports this module before Django is set up, and the dialect module
    # reaches the models
    from streams.dialect import is_local_file

    connection = connections[alias]
    try:
        connection.ensure_connection()
    except DatabaseError as e:
        connection.close()
        fix = ("fix DATABASE_URL (the file's directory must exist and be writable)"
               if is_local_file(alias) else "start the database server or fix DATABASE_URL")
        raise StartupError(f"cannot connect to {_database_label(alias)}: {_one_line(e)}; {fix}") from None
    if not migrated:
        return
    from django.db.migrations.executor import MigrationExecutor

    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as e:
        raise StartupError(f"cannot read the migrations of {_database_label(alias)}: {_one_line(e)}") from None
    if pending:
        raise StartupError(
            f"{_database_label(alias)} is not migrated ({len(pending)} migrations not applied): "
            "run `manage.py migrate` first (make run does)")


def check_redis(url: str | None = None, *, timeout: float = 3.0) -> None:
    """``REDIS_URL`` (if set) answers PING: processes that publish or subscribe need it."""
    if url is None:
        from django.conf import settings

        url = settings.REDIS_URL
    if not url:
        return
    problem = redis_url_problem(url)
    if problem:
        raise StartupError(problem)
    import redis

    try:
        ping_redis(url, timeout)
    except (redis.RedisError, OSError, ValueError) as e:
        raise StartupError(
            f"cannot reach Redis at REDIS_URL {redact_url(url)}: {_one_line(e)}; start redis-server "
            "there, or fix REDIS_URL (unset: the embedded in-memory layer)") from None


def java_executable(environ: os._Environ | dict | None = None) -> str | None:
    """The ``java`` Spark will start: ``$JAVA_HOME/bin/java`` if JAVA_HOME is set, else PATH's."""
    environ = os.environ if environ is None else environ
    java_home = environ.get("JAVA_HOME", "")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        return candidate if os.access(candidate, os.X_OK) else None
    return shutil.which("java", path=environ.get("PATH", os.defpath))


def check_java(environ: os._Environ | dict | None = None) -> None:
    """A JVM for Spark (the batch jobs run in it)."""
    environ = os.environ if environ is None else environ
    if java_executable(environ):
        return
    where = (f"JAVA_HOME={environ['JAVA_HOME']} has no bin/java" if environ.get("JAVA_HOME")
             else "java is not on PATH")
    raise StartupError(
        f"batch jobs run on Spark, which needs Java 17, but {where}: install it "
        "(apt-get install openjdk-17-jre-headless) or set JAVA_HOME")


def listen_problem(error: OSError, host: str, port: int, setting: str) -> StartupError:
    """The one line for a socket that cannot be bound (the port taken, a foreign address)."""
    reason = {errno.EADDRINUSE: "the port is already in use (another instance still running?)",
              errno.EADDRNOTAVAIL: "this machine has no such address",
              errno.EACCES: "permission denied (ports below 1024 need privileges)"}.get(
        error.errno, error.strerror or str(error))
    return StartupError(f"cannot listen on {host}:{port} ({setting}): {reason}; stop whatever holds "
                        f"it or set {setting} to a free host:port")


def check_listen(host: str, port: int, setting: str) -> None:
    """``host:port`` can be bound now (checked before starting a server that would bind it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's servers do
            s.bind((host, port))
    except socket.gaierror as e:
        raise StartupError(f"cannot listen on {host}:{port} ({setting}): {e.strerror}; "
                           f"set {setting} to a host:port of this machine") from None
    except OSError as e:
        raise listen_problem(e, host, port, setting) from None


def _missing_table(exc: BaseException) -> bool:
    """SQLite's "no such table", PostgreSQL's undefined_table (42P01)."""
    while exc is not None:
        if "no such table" in str(exc) or getattr(exc, "sqlstate", None) == "42P01":
            return True
        exc = exc.__cause__
    return False


def explain(exc: BaseException) -> str | None:
    """The one line for an exception that means "this process cannot start", else ``None``.

    Database errors are diagnosed by asking the database again, not by their text: if it
    cannot be reached, or (for a missing table) is not migrated, that is the line.
    """
    from django.core.exceptions import ImproperlyConfigured

    if isinstance(exc, StartupError):
        return str(exc)
    if isinstance(exc, ImproperlyConfigured):
        return _one_line(exc)
    try:
        from django.db import DatabaseError
    except ImportError:  # pragma: no cover - Django is a runtime dependency
        return None
    if isinstance(exc, DatabaseError):
        from django.db import connections

        connections.close_all()  # a PostgreSQL transaction the error aborted answers nothing more
        try:
            check_database(migrated=_missing_table(exc))
        except StartupError as e:
            return str(e)
        except Exception:  # the diagnosis itself failed: show the original error
            return None
    return None


def check_startable(*, database: bool = True, redis: bool = False, java: bool = False,
                    listen: tuple[tuple[str, int, str], ...] = ()) -> None:
    """The checks a command needs, cheapest first: each raises :class:`StartupError`."""
    for host, port, setting in listen:
        check_listen(host, port, setting)
    if database:
        check_database()
    if redis:
        check_redis()
    if java:
        check_java()

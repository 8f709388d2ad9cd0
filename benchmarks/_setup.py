"""The start of every benchmark: a throwaway PostgreSQL (and Redis), a migrated database, Django.

Each script used to repeat it; :func:`migrated_database` does it once and stops the servers
on the way out.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from testing.services import PostgresServer, RedisServer  # noqa: E402

#: ``--pg-tuned``: what docs/storage.md ("PostgreSQL settings for a big store") recommends for
#: a homeserver's database on this machine's 24 GB; durability unchanged (fsync, full-page
#: writes and synchronous commit stay on)
TUNED_PG = {"shared_buffers": "4GB", "max_wal_size": "16GB", "checkpoint_timeout": "15min"}


def add_pg_settings_arguments(parser: argparse.ArgumentParser, *, kept: str = "") -> None:
    """``--pg-set NAME=VALUE`` (repeatable) and ``--pg-tuned``: the benchmark's PostgreSQL
    server settings over the throwaway defaults (:func:`pg_settings_of` reads them)."""
    parser.add_argument("--pg-set", action="append", default=[], metavar="NAME=VALUE",
                        help="a PostgreSQL server setting over the throwaway server's defaults (repeatable; "
                             f"printed{', ' + kept if kept else ''})")
    parser.add_argument("--pg-tuned", action="store_true",
                        help="the settings docs/storage.md recommends for a homeserver's PostgreSQL: "
                             + ", ".join(f"{k}={v}" for k, v in TUNED_PG.items()) + " (--pg-set overrides)")


def pg_settings_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, str]:
    """The settings ``--pg-tuned`` and ``--pg-set`` ask for; a malformed one is a usage error."""
    settings = dict(TUNED_PG) if args.pg_tuned else {}
    for item in args.pg_set:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            parser.error(f"--pg-set takes NAME=VALUE, not {item!r}")
        settings[name.strip()] = value.strip()
    return settings


@dataclass
class BenchDatabase:
    pg: PostgresServer
    url: str
    redis: RedisServer | None
    #: the environment for the benchmark's subprocesses (``os.environ`` is updated likewise)
    env: dict[str, str]


@contextlib.contextmanager
def migrated_database(name: str, *, fast: bool = False, redis: bool = False, env: dict[str, str] | None = None,
                      django_setup: bool = True, pg_directory: str = "", keep: bool = False,
                      reuse: bool = False, pg_settings: dict[str, str] | None = None) -> Iterator[BenchDatabase]:
    """PostgreSQL with a fresh database ``name``, migrated; Django set up.

    ``fast``: fsync off (when the database is not what is measured). ``redis``: a Redis
    too, as ``REDIS_URL``; without it ``REDIS_URL`` is unset, so an inherited one never
    makes the writers publish. ``env``: more variables for this process and its children.
    ``pg_directory``/``keep``: a cluster kept between runs; ``reuse``: its database too (a
    generated dataset), else it is dropped and made again. ``pg_settings``: the server's
    settings over the defaults (``PostgresServer.settings``).
    """
    pg = PostgresServer(fast=fast, directory=pg_directory, keep=keep, settings=dict(pg_settings or {})).start()
    rs = None
    try:
        if redis:
            rs = RedisServer().start()
        if not (reuse and _database_exists(pg, name)):
            _drop_database(pg, name)
            pg.create_database(name)
        url = pg.url(name)
        # A full-mode web process refuses to start without a replication secret.
        variables = {"DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "synapse_repl.settings",
                     "REPLICATION_SECRET": os.environ.get("REPLICATION_SECRET") or secrets.token_urlsafe(32),
                     **(env or {})}
        if rs is not None:
            variables["REDIS_URL"] = rs.url
        else:
            os.environ.pop("REDIS_URL", None)
        _migrate(variables, django_setup)
        yield BenchDatabase(pg=pg, url=url, redis=rs, env=dict(os.environ))
    finally:
        if rs is not None:
            rs.stop()
        pg.stop()


@contextlib.contextmanager
def migrated_sqlite_database() -> Iterator[str]:
    """The embedded default's database instead: a fresh SQLite file in a throwaway state
    directory, migrated; Django set up. Yields its URL."""
    import shutil
    import tempfile

    state_dir = tempfile.mkdtemp(prefix="bench_sqlite_")
    try:
        os.environ.pop("REDIS_URL", None)
        url = f"sqlite:///{state_dir}/db.sqlite3"
        _migrate({"STATE_DIR": state_dir, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "synapse_repl.settings"},
                 django_setup=True)
        yield url
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def _migrate(variables: dict[str, str], django_setup: bool) -> None:
    os.environ.update(variables)
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
                   check=True, cwd=ROOT, env=dict(os.environ))
    if django_setup:
        import django

        django.setup()


def _drop_database(pg: PostgresServer, name: str) -> None:
    import psycopg

    with psycopg.connect(pg.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _database_exists(pg: PostgresServer, name: str) -> bool:
    import psycopg

    with psycopg.connect(pg.url("postgres"), autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def run_size(doc: str | None, argv: list[str] | None, *, facts: int, quick_facts: int,
             repeat: int = 3) -> tuple[int, int]:
    """``--facts N --repeat R --quick`` as the small benchmarks take them: (facts, repeat)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--facts", type=int, default=None,
                        help=f"facts per run (default {facts}, --quick {quick_facts})")
    parser.add_argument("--repeat", type=int, default=None, help=f"runs of each kind (default {repeat}, --quick 1)")
    parser.add_argument("--quick", action="store_true", help="a short run")
    args = parser.parse_args(argv)
    return args.facts or (quick_facts if args.quick else facts), args.repeat or (1 if args.quick else repeat)

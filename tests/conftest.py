"""Fixtures for the backing services: throwaway PostgreSQL and Redis servers.

The whole suite runs against a real PostgreSQL started here (``initdb`` + ``postgres`` on a
free loopback port, in a temp dir, removed afterwards); SQLite, the embedded default, is a
second database alias (``sqlite``) for the contract tests that run on both.
A missing server binary fails the run with the Debian package to install.
"""
from __future__ import annotations

import os
import tempfile

# daphne installs Twisted's asyncio reactor when imported; the tests that serve ASGI in this
# process need it installed before anything else of Twisted is imported.
import daphne.server  # noqa: F401
import pytest

# Property tests explore new examples on every developer run; under CI (CI=true) they are
# derandomized, so a submission's run is reproducible and a failure there is one anyone can
# replay (new counter-examples are found on developers' runs and pinned as @example).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

from testing.services import MissingBinary, PostgresServer, RedisServer

_hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    _hypothesis_settings.load_profile("ci")


#: The suite's Spark settings (docs/jobs.md), for the session's own ``spark`` and every job
#: process a test starts (they inherit this environment; a test may still name its own).
#: The tests' data are tens to thousands of rows: two shuffle partitions, one per core of
#: ``local[2]``, still split every shuffle while each job run costs a fraction of the
#: default eight's CPU (a pandas task per partition per stage: check_visibility on 300
#: events took 13.7 s of CPU with 8, 3.0 s with 2, in a warm driver).
SUITE_SPARK_ENVIRONMENT = {"SPARK_SHUFFLE_PARTITIONS": "2"}


def pytest_configure(config):
    """Processes a test starts (web, endpoints, workers) share this process's
    ``REPLICATION_SECRET``: a full-mode web process refuses to start without one. They (and
    the session's ``spark``) run Spark with :data:`SUITE_SPARK_ENVIRONMENT` and their JVMs
    start from a class archive (``testing.services.spark_class_archive``), unless the
    environment the suite was started with says otherwise. A transactional test ends with
    :func:`_fast_fixture_teardown`."""
    from django.conf import settings

    os.environ.setdefault("REPLICATION_SECRET", settings.REPLICATION_SECRET)
    _install_fast_flush()
    for name, value in SUITE_SPARK_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if not hasattr(config, "workerinput"):
        _compile_project()
    if "SPARK_JAVA_OPTIONS" not in os.environ and not hasattr(config, "workerinput"):
        # Made (or found) once, before any test process starts: every driver's JVM the tests
        # start maps Spark's classes from it (xdist's workers inherit this environment).
        from testing.services import spark_class_archive

        options = spark_class_archive()
        if options:
            os.environ["SPARK_JAVA_OPTIONS"] = options


def _compile_project() -> None:
    """The project's bytecode, written once before any test process starts (only what is
    missing or stale): under ``PYTHONDONTWRITEBYTECODE`` no process writes it, and each of the
    hundreds of ``manage.py`` processes the tests start would compile the ~60 modules Django's
    start-up imports again, 0.12 CPU-s a process."""
    import compileall
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for folder in root.iterdir():  # every folder of the checkout but the hidden ones (.venv, .ci, .git)
        if folder.is_dir() and not folder.name.startswith("."):
            compileall.compile_dir(folder, quiet=2, workers=1)


#: the tables a flush keeps when their rows are as migrations made them: what ``post_migrate``
#: would write back (content types and permissions)
_MIGRATION_MADE = ("django_content_type", "auth_permission")
#: per database alias: those rows after the last full flush (None: none yet)
_migration_made_rows: dict[str, list] = {}


def _fast_fixture_teardown(self):
    """A transactional test's flush, as Django's but cheap: ``DELETE`` from every model table
    but the content types and permissions, in one transaction, instead of ``TRUNCATE`` then
    ``post_migrate`` writing those two back. On PostgreSQL the ``TRUNCATE`` of 43 tables cost
    0.21 CPU-s of the server and ``post_migrate`` 0.11 of ours per test per database, against
    0.006 for the deletes: a third of a second for each of ~800 tests. Django's own flush runs
    whenever a test changed those two tables, or a delete fails (a constraint that is not
    deferrable), so the state after a test is the same either way."""
    from django.core.management import call_command
    from django.db import connections, transaction

    for alias in self._databases_names(include_mirrors=False):
        connection = connections[alias]
        kept = _migration_made_rows.get(alias)
        if kept is not None and kept == _rows_of(connection):
            tables = [t for t in connection.introspection.django_table_names(only_existing=True, include_views=False)
                      if t not in _MIGRATION_MADE]
            try:
                with transaction.atomic(using=alias), connection.cursor() as cursor:
                    if connection.vendor == "postgresql":
                        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
                    for table in tables:
                        cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")
                continue
            except Exception:  # noqa: BLE001 -- Django's flush below says what is wrong, if anything
                pass
        call_command("flush", verbosity=0, interactive=False, database=alias, reset_sequences=False,
                     allow_cascade=self.available_apps is not None, inhibit_post_migrate=False)
        _migration_made_rows[alias] = _rows_of(connection)


def _rows_of(connection) -> list:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, app_label, model FROM django_content_type ORDER BY id")
        rows = cursor.fetchall()
        cursor.execute("SELECT id, content_type_id, codename, name FROM auth_permission ORDER BY id")
        return rows + cursor.fetchall()


def _install_fast_flush() -> None:
    from django.test.testcases import TransactionTestCase

    TransactionTestCase._fixture_teardown = _fast_fixture_teardown


@pytest.fixture(autouse=True)
def _fresh_throttle_counts():
    """Each test starts with no failed logins or wrong bearer tokens counted for the test
    client's address (the counts live in the per-process default cache)."""
    from django.core.cache import caches

    caches["default"].clear()
    yield


def pytest_terminal_summary(terminalreporter):
    """CI's supply-chain verdict (.ci/audit.py's one-line banner, passed as AUDIT_VERDICT by
    .ci/run), repeated among the closing lines, just above pytest's own summary line."""
    verdict = os.environ.get("AUDIT_VERDICT", "").strip()
    if verdict:
        terminalreporter.write_sep("-", "supply chain (.ci/audit.py)")
        terminalreporter.write_line(verdict)


def _started(server):
    try:
        return server.start()
    except MissingBinary as e:  # fail, never skip: CI must have every part
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def postgres_server():
    server = _started(PostgresServer())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server():
    server = _started(RedisServer())
    yield server
    server.stop()


@pytest.fixture
def private_redis():
    """A Redis of one test's own, for a test that kills the clients it finds: the session's
    Redis may still hold another test's (a test process runs many files in turn)."""
    server = _started(RedisServer())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server_with_password():
    """A Redis that refuses clients without its password (REDIS_URL redis://:pw@...)."""
    import secrets

    server = _started(RedisServer(password=secrets.token_urlsafe(16)))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(postgres_server, django_db_modify_db_settings_parallel_suffix):
    """Point Django at the throwaway PostgreSQL (and a throwaway SQLite file as ``sqlite``)
    before the test databases are created."""
    import dj_database_url
    from django.conf import settings
    from django.db import connections

    sqlite_dir = tempfile.mkdtemp(prefix="synapse_repl_sqlite_")
    settings.DATABASES.clear()
    settings.DATABASES["default"] = dj_database_url.parse(postgres_server.url("synapse_repl"))
    settings.DATABASES["sqlite"] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(sqlite_dir, "db.sqlite3"),
        "TEST": {"NAME": os.path.join(sqlite_dir, "test.sqlite3")},
        # no fsync per commit: only an OS crash could tell the difference, and a throwaway test
        # database does not outlive one (the room-store tests commit thousands of times)
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA synchronous = OFF"},
    }
    # Nothing has connected yet; drop the handler's cached view of the old settings.
    for alias in list(connections.settings):
        try:
            del connections[alias]
        except AttributeError:
            pass
    connections.__dict__.pop("settings", None)
    connections._settings = None


@pytest.fixture
def pg_url(transactional_db):
    """URL of the test database, for processes started by a test."""
    from testing.processes import database_url

    return database_url()


@pytest.fixture(scope="session")
def spark():
    """One local Spark (2 cores) for the whole run, with the PostgreSQL JDBC driver loaded.

    Created through the jobs' own session builder, so the tests run what production runs.
    A missing Java or JDBC driver fails the run with what to install.
    """
    import shutil

    from jobs.session import SparkUnavailable, spark_session, stop_spark

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("java not found: install the Debian package openjdk-17-jre-headless", pytrace=False)
    try:
        session = spark_session("local[2]")
    except SparkUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    yield session
    stop_spark()


@pytest.fixture(params=["postgresql", "sqlite"])
def default_database(request, transactional_db):
    """Run the test twice: on PostgreSQL (the full mode), then with the ``default`` alias
    pointing at the SQLite test database -- the embedded default has SQLite under that alias,
    so every piece of code that uses ``default`` (reads, views, admin pages, the ORM) runs on
    SQLite unchanged. Needs ``django_db(transaction=True, databases=["default", "sqlite"])``.
    Yields the vendor."""
    from django.db import connections

    if request.param == "postgresql":
        yield request.param
        return
    postgres = connections["default"]
    connections["default"] = connections["sqlite"]
    try:
        yield request.param
    finally:
        connections["default"] = postgres


# --- Spark on a standalone cluster (jobs) -----------------------------------------------


@pytest.fixture(scope="session")
def spark_cluster():
    """A standalone Spark master and one worker (1 core, 1 GiB) on loopback, from pyspark's
    own distribution, shared by the whole run. Fails (never skips) where it cannot start."""
    from testing.services import SparkStandaloneCluster

    try:
        cluster = _started(SparkStandaloneCluster(cores=1, memory="1g"))
    except RuntimeError as e:
        pytest.fail(f"the standalone Spark cluster did not start: {e}", pytrace=False)
    yield cluster
    cluster.stop()

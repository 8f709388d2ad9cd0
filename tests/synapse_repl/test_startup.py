"""Start-up errors (synapse_repl/startup.py, manage.py): each way a process cannot start gives
exit status 1 and exactly one line on stderr, no traceback, naming the fix."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from synapse_repl.startup import StartupError, check_java, database_url_problem, java_executable, redact_url, redis_url_problem
from testing.services import free_port

ROOT = Path(__file__).resolve().parents[2]


def manage(tmp_path: Path, *args: str, path: str | None = None, **env: str) -> subprocess.CompletedProcess:
    """``manage.py ARGS`` in a clean environment: its own STATE_DIR, no demo, plus ``env``."""
    full_env = {"PATH": path or os.environ["PATH"], "STATE_DIR": str(tmp_path / "state"), "DEMO": "0",
                "REPLICATION_SECRET": "a-long-enough-secret-for-this-test-0123456789", **env}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess, *fix: str) -> str:
    """The process failed with one stderr line (no traceback) that contains every ``fix`` text."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("error: ")
    for text in fix:
        assert text in lines[0], lines[0]
    return lines[0]


def unused_port() -> int:
    return free_port()  # bound and closed again: nobody listens there


def test_unreachable_database(tmp_path):
    url = f"postgres://synapse:hunter2@127.0.0.1:{unused_port()}/synapse"
    line = one_line_error(manage(tmp_path, "write_facts", "receipts", "--count", "1", "--no-progress",
                                 DATABASE_URL=url),
                          "cannot connect to DATABASE_URL", "Connection refused", "fix DATABASE_URL")
    assert "hunter2" not in line  # the password never reaches a log


def test_make_runs_first_step_with_an_unreachable_database(tmp_path):
    """``migrate`` has no check of its own: manage.py diagnoses the error it raised."""
    url = f"postgres://synapse@127.0.0.1:{unused_port()}/synapse"
    one_line_error(manage(tmp_path, "migrate", "--noinput", DATABASE_URL=url),
                   "cannot connect to DATABASE_URL", "start the database server or fix DATABASE_URL")


def test_sqlite_file_that_cannot_be_opened(tmp_path):
    url = f"sqlite:///{tmp_path}/no/such/dir/db.sqlite3"
    one_line_error(manage(tmp_path, "write_facts", "receipts", "--count", "1", "--no-progress",
                          DATABASE_URL=url),
                   "cannot connect to DATABASE_URL", "directory must exist")


@pytest.mark.parametrize("url, fix", [
    ("localhost/synapse", "has no scheme: set it to postgres://"),
    ("mysql://u:pw@db/synapse", "the scheme 'mysql' is not supported"),
])
def test_database_url_without_a_usable_scheme(tmp_path, url, fix):
    line = one_line_error(manage(tmp_path, "write_facts", "receipts", "--count", "1", DATABASE_URL=url),
                          fix, "sqlite:///")
    assert ":pw@" not in line


def test_unmigrated_sqlite_database(tmp_path):
    """Today's ``no such table: stream_sequences``."""
    url = f"sqlite:///{tmp_path}/empty.sqlite3"
    one_line_error(manage(tmp_path, "write_facts", "receipts", "--count", "1", "--no-progress",
                          DATABASE_URL=url),
                   "is not migrated", "run `manage.py migrate`")


def test_unmigrated_postgresql_database(tmp_path, postgres_server):
    url = postgres_server.create_database(f"unmigrated_{os.getpid()}")
    one_line_error(manage(tmp_path, "runreplication", "--listen", f"127.0.0.1:{free_port()}",
                          DATABASE_URL=url),
                   "is not migrated", "run `manage.py migrate`")


@pytest.fixture(scope="module")
def migrated_sqlite(tmp_path_factory) -> str:
    tmp_path = tmp_path_factory.mktemp("migrated")
    url = f"sqlite:///{tmp_path}/db.sqlite3"
    done = manage(tmp_path, "migrate", "--noinput", DATABASE_URL=url)
    assert done.returncode == 0, done.stderr
    return url


def test_redis_down(tmp_path, migrated_sqlite):
    """write_facts used to log 20 tracebacks and exit 0 after 15 s."""
    line = one_line_error(
        manage(tmp_path, "write_facts", "receipts", "--count", "5", "--no-progress",
               DATABASE_URL=migrated_sqlite, REDIS_URL=f"redis://:hunter2@127.0.0.1:{unused_port()}/0"),
        "cannot reach Redis at REDIS_URL", "start redis-server there, or fix REDIS_URL")
    assert "hunter2" not in line


@pytest.fixture
def path_without_java(tmp_path) -> str:
    """A PATH with every command of the real PATH but java (bash, ps... stay: Spark's scripts)."""
    bin_dir = tmp_path / "bin-without-java"
    bin_dir.mkdir()
    for directory in reversed(os.environ["PATH"].split(os.pathsep)):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            if entry.name != "java":
                target = bin_dir / entry.name
                target.unlink(missing_ok=True)
                target.symlink_to(entry.path)
    assert shutil.which("java", path=str(bin_dir)) is None
    return str(bin_dir)


def test_java_missing_for_a_job(tmp_path, migrated_sqlite, path_without_java):
    one_line_error(manage(tmp_path, "run_job", "topological_ordering", path=path_without_java,
                          DATABASE_URL=migrated_sqlite),
                   "needs Java 17, but java is not on PATH", "openjdk-17-jre-headless", "JAVA_HOME")


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_replication_port_in_use(tmp_path, migrated_sqlite, taken_port):
    one_line_error(manage(tmp_path, "runreplication", DATABASE_URL=migrated_sqlite,
                          REPLICATION_LISTEN=f"127.0.0.1:{taken_port}"),
                   f"cannot listen on 127.0.0.1:{taken_port} (REPLICATION_LISTEN)", "already in use",
                   "set REPLICATION_LISTEN to a free host:port")


def test_runservice_with_its_replication_port_in_use(tmp_path, migrated_sqlite, taken_port):
    """make run used to serve the web UI without an endpoint (the child's traceback aside)."""
    one_line_error(manage(tmp_path, "runservice", DATABASE_URL=migrated_sqlite,
                          WEB_LISTEN=f"127.0.0.1:{free_port()}", REPLICATION_LISTEN=f"127.0.0.1:{taken_port}"),
                   f"cannot listen on 127.0.0.1:{taken_port} (REPLICATION_LISTEN)", "already in use")


# --- the pure parts ------------------------------------------------------------------------------


def test_url_problems():
    assert database_url_problem("postgres://u:p@h:5432/db") is None
    assert database_url_problem("postgresql://h/db") is None
    assert database_url_problem("sqlite:////tmp/x.sqlite3") is None
    assert "has no scheme" in database_url_problem("h:5432/db")
    assert "not supported" in database_url_problem("oracle://h/db")
    assert redis_url_problem("rediss://h:6380/0?ssl_ca_certs=/ca.pem") is None
    assert "expected redis://" in redis_url_problem("127.0.0.1:6379")


def test_redact_url():
    assert redact_url("postgres://u:secret@h:5432/db") == "postgres://u:***@h:5432/db"
    assert redact_url("redis://:secret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
    assert redact_url("not a url [") == "not a url ["


def test_java_executable_prefers_java_home(tmp_path):
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    assert java_executable({"JAVA_HOME": str(tmp_path / "jdk"), "PATH": ""}) == str(java)
    assert java_executable({"PATH": str(java.parent)}) == str(java)
    assert java_executable({"PATH": str(tmp_path)}) is None
    with pytest.raises(StartupError, match=r"JAVA_HOME=/no/jdk has no bin/java: install it .* or set JAVA_HOME"):
        check_java({"JAVA_HOME": "/no/jdk", "PATH": str(java.parent)})

"""synapse_repl/errors.py: a database that refuses connections answers 503 with the reason
(not a bare 500), and a NUL byte anywhere is a 400 before any view runs."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.test import Client

from testing.services import free_port

ROOT = Path(__file__).resolve().parents[2]

REQUESTS = """
import django, json, os
os.environ['DJANGO_SETTINGS_MODULE'] = 'synapse_repl.settings'
django.setup()
from django.conf import settings
from django.test import Client
c = Client(raise_request_exception=False, HTTP_COOKIE='sessionid=' + 'x' * 32)
out = {}
for name, path, headers in [
    ('api', '/api/sync?user_id=@a:hs', {'HTTP_AUTHORIZATION': 'Bearer ' + settings.API_TOKEN}),
    ('catchup', '/_synapse/replication/get_repl_stream_updates/receipts/' + os.urandom(8).hex() + '?from_token=0&upto_token=1',
     {'HTTP_AUTHORIZATION': 'Bearer ' + settings.REPLICATION_SECRET}),
    ('status', '/status.json', {}),
    ('admin', '/admin/', {}),
    ('page', '/', {}),
]:
    r = c.get(path, **headers)
    out[name] = [r.status_code, r.get('Retry-After'), r.get('Content-Type'), r.content.decode(errors='replace')]
print(json.dumps(out))
"""


def _env(database_url: str, tmp_path: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "STATE_DIR": str(tmp_path), "DATABASE_URL": database_url,
            "REPLICATION_SECRET": "r" * 40, "API_TOKEN": "a" * 40, "ALLOWED_HOSTS": "testserver",
            "WEB_LISTEN": f"127.0.0.1:{free_port()}", "REPLICATION_LISTEN": f"127.0.0.1:{free_port()}"}


def _requests_against(database_url: str, tmp_path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", REQUESTS], cwd=ROOT, env=_env(database_url, tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_one_line_exit(command: str, database_url: str, tmp_path: Path, reason: str) -> None:
    """``command`` exits 1 with one line on stderr naming the reason and the fix (no traceback,
    no password)."""
    done = subprocess.run([sys.executable, "manage.py", command], cwd=ROOT, env=_env(database_url, tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (command, done.returncode, done.stderr[-2000:])
    assert done.stderr.strip().count("\n") == 0, done.stderr[-2000:]
    assert reason in done.stderr and "DATABASE_URL" in done.stderr, done.stderr
    assert "db-password" not in done.stderr


def _assert_503(answers: dict, reason: str) -> None:
    for name, (status, retry_after, content_type, body) in answers.items():
        assert status == 503, (name, status, body[:500])
        assert retry_after == "5", name
        assert reason in body, (name, body)
        assert "Traceback" not in body and "127.0.0.1" not in body
        if name in ("api", "catchup", "status"):
            assert json.loads(body)["errcode"] == "M_UNAVAILABLE"
        else:
            assert content_type.startswith("text/plain")


@pytest.mark.django_db(transaction=True)
def test_postgresql_out_of_connections_is_a_503_with_the_reason(pg_url, tmp_path):
    """A role whose connection limit is reached (held by this test): PostgreSQL refuses every
    new connection with "too many connections", as when max_connections is used up."""
    from django.db import connections

    d = connections["default"].settings_dict
    role = f"limited_{secrets.token_hex(4)}"
    admin = psycopg.connect(host=d["HOST"], port=d["PORT"], user=d["USER"], dbname=d["NAME"], autocommit=True)
    admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
    try:
        held = psycopg.connect(host=d["HOST"], port=d["PORT"], user=role, dbname=d["NAME"])
        url = f"postgres://{role}:db-password@{d['HOST']}:{d['PORT']}/{d['NAME']}"
        try:
            answers = _requests_against(url, tmp_path)
            # runreplication exited with a 100-line traceback; now one line, exit status 1
            _assert_one_line_exit("runreplication", url, tmp_path, "too many connections")
        finally:
            held.close()
        _assert_503(answers, "no free connections")
    finally:
        admin.execute(f"DROP ROLE {role}")
        admin.close()


def test_postgresql_unreachable_is_a_503_with_the_reason(tmp_path):
    """Nothing listening where DATABASE_URL points (PostgreSQL stopped)."""
    url = f"postgres://nobody:db-password@127.0.0.1:{free_port()}/none"
    _assert_503(_requests_against(url, tmp_path), "cannot be reached")
    for command in ("runreplication", "runservice"):
        _assert_one_line_exit(command, url, tmp_path, "fix DATABASE_URL")


@pytest.mark.django_db
def test_nul_anywhere_is_a_400_before_any_view(settings):
    settings.API_TOKEN = "a" * 40
    client = Client(raise_request_exception=False)
    r = client.post("/jobs/start", {"job": "topological_ordering", "rooms": "!a\x00:hs"})
    assert r.status_code == 400 and "NUL" in r.content.decode()
    r = client.get("/status.json", {"x": "\x00"})
    assert r.status_code == 400 and r.json()["errcode"] == "M_INVALID_PARAM"
    r = client.get("/connections/\x00")
    assert r.status_code == 400 and "the path contains a NUL" in r.content.decode()


def test_a_database_error_escaping_a_command_is_one_line(settings):
    """What ``runreplication`` does with a database error that escapes it once serving."""
    from django.core.management.base import CommandError
    from django.db import OperationalError

    from synapse_repl.errors import database_errors_as_one_line

    settings.DATABASE_URL = "postgres://u:db-password@db.example:5432/synapse"
    with pytest.raises(CommandError) as e:
        with database_errors_as_one_line():
            raise OperationalError('connection failed: FATAL:  sorry,\n too many clients already')
    line = str(e.value)
    assert "\n" not in line and "db-password" not in line
    assert line.startswith("the database has no free connections (DATABASE_URL=postgres://u:***@db.example")
    assert "too many clients already" in line and "max_connections" in line
    with pytest.raises(ValueError):  # anything else goes through untouched
        with database_errors_as_one_line():
            raise ValueError("not the database")

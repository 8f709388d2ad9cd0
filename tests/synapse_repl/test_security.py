"""Security settings (synapse_repl/security.py, login_throttle.py, the production profile)."""
from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testing.processes import jsonl_records
from testing.services import free_port
from tests.synapse_repl.test_settings import settings_in_subprocess

ROOT = Path(__file__).resolve().parents[2]


# --- REPLICATION_SECRET --------------------------------------------------------------------------


def test_replication_secret_generated_on_the_embedded_default_and_shared(tmp_path):
    first = settings_in_subprocess({"STATE_DIR": str(tmp_path)}, "settings.REPLICATION_SECRET")
    secret_file = tmp_path / "replication_secret"
    assert first == repr(secret_file.read_text()) and len(secret_file.read_text()) >= 50
    assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
    # Every later process from this checkout (same STATE_DIR) reads the same one.
    assert settings_in_subprocess({"STATE_DIR": str(tmp_path)}, "settings.REPLICATION_SECRET") == first


def test_replication_secret_from_the_environment_or_none_in_full_mode(tmp_path):
    assert settings_in_subprocess({"STATE_DIR": str(tmp_path), "REPLICATION_SECRET": "abc"},
                                  "settings.REPLICATION_SECRET") == "'abc'"
    assert settings_in_subprocess({"STATE_DIR": str(tmp_path), "DATABASE_URL": "postgres://u@h/db"},
                                  "settings.REPLICATION_SECRET") == "''"
    assert not (tmp_path / "replication_secret").exists()


def test_replication_secret_generated_for_an_explicit_sqlite_url(tmp_path):
    """DATABASE_URL=sqlite:///... is the embedded default too: a secret is generated, never none."""
    got = settings_in_subprocess({"STATE_DIR": str(tmp_path), "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3"},
                                 "settings.REPLICATION_SECRET")
    assert got == repr((tmp_path / "replication_secret").read_text()) and len(got) > 50


def test_a_web_process_without_a_secret_refuses_to_start(tmp_path):
    """Full mode with no REPLICATION_SECRET: the ASGI application (what daphne serves) and
    runservice refuse to start and say how to set one."""
    env = {"PATH": os.environ["PATH"], "STATE_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "synapse_repl.settings",
           "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}
    asgi = subprocess.run([sys.executable, "-c", "import synapse_repl.asgi"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert asgi.returncode != 0
    assert "REPLICATION_SECRET is not set" in asgi.stderr and "export REPLICATION_SECRET=" in asgi.stderr
    service = subprocess.run([sys.executable, "manage.py", "runservice"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    assert service.returncode != 0
    assert service.stderr.strip().count("\n") == 0, service.stderr  # one line, no traceback
    assert "REPLICATION_SECRET is not set" in service.stderr
    # With a secret the same application loads.
    ok = subprocess.run([sys.executable, "-c", "import synapse_repl.asgi"], cwd=ROOT,
                        env={**env, "REPLICATION_SECRET": "a-long-enough-secret-for-this-test-0123456789"},
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr


def test_secret_with_a_comma_is_refused(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as e:
        settings_in_subprocess({"STATE_DIR": str(tmp_path), "REPLICATION_SECRET": "a,b"}, "1")
    assert "REPLICATION_SECRET must not contain commas" in e.value.stderr


def _wait_for(predicate, what: str, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)
    return result


def test_make_run_processes_share_the_generated_secret(tmp_path):
    """The embedded default as `make run` starts it: runservice (web and endpoint in
    one process) and a replication_worker from the same checkout, all with no REPLICATION_SECRET
    in the environment. The catch-up endpoint refuses an anonymous GET; the worker, reading
    the generated secret, catches up facts written before it started."""
    web, repl = free_port(), free_port()
    env = {"PATH": os.environ["PATH"], "STATE_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "WEB_LISTEN": f"127.0.0.1:{web}", "REPLICATION_LISTEN": f"127.0.0.1:{repl}",
           "POSITION_POLL_SECONDS": "0.1"}
    run = lambda *args: subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,  # noqa: E731
                                       check=True, capture_output=True, timeout=300)
    run("migrate", "--noinput")
    wrote = run("write_facts", "receipts", "--count", "5", "--no-progress").stdout.decode()
    first, last = map(int, re.search(r"IDs (\d+)\.\.(\d+)", wrote).groups())
    service_log, worker_log = open(tmp_path / "service.log", "w"), open(tmp_path / "worker.log", "w")
    service = subprocess.Popen([sys.executable, "manage.py", "runservice"], cwd=ROOT, env=env,
                               stdout=service_log, stderr=subprocess.STDOUT, start_new_session=True)
    worker = None
    try:
        def web_up():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{web}/status.json", timeout=2)
                return True
            except urllib.error.HTTPError:
                return True  # it answers (status.json is for staff only)
            except OSError:
                return False

        _wait_for(web_up, "runservice's web listener")
        url = (f"http://127.0.0.1:{web}/_synapse/replication/get_repl_stream_updates/receipts/"
               "?from_token=0&upto_token=5")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 401
        jsonl = tmp_path / "worker.jsonl"
        worker = subprocess.Popen([sys.executable, "manage.py", "replication_worker", "--name", "w1",
                                   "--jsonl", str(jsonl), "--streams", "receipts"], cwd=ROOT, env=env,
                                  stdout=worker_log, stderr=subprocess.STDOUT)

        def facts():
            lines = jsonl_records(jsonl)
            return lines if len(lines) >= 5 else None

        got = _wait_for(facts, "the worker to catch up")
        tokens = [f["token"] for f in got]
        # runservice's demo writer may add more behind them: the five come first, once each.
        assert tokens[:5] == list(range(first, last + 1)) and tokens == sorted(set(tokens))
        assert "HTTP 40" not in (tmp_path / "worker.log").read_text()

        def status_row():  # the worker reports where it stands for the dashboard's Workers table
            with sqlite3.connect(tmp_path / "db.sqlite3") as db:
                row = db.execute("SELECT positions FROM dashboard_worker_status WHERE name = 'w1'").fetchone()
            return row and json.loads(row[0]).get("receipts", {}).get("master", 0) >= last

        _wait_for(status_row, "the worker's status row")
        assert "could not record its status" not in (tmp_path / "worker.log").read_text()
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=20)
        os.killpg(service.pid, signal.SIGTERM)
        service.wait(timeout=20)
        service_log.close()
        worker_log.close()


# --- the web: production profile, login throttling, CSRF -----------------------------------------


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], **env}, timeout=120)


def test_check_deploy_is_clean_in_the_production_profile(tmp_path):
    prod = _manage({"STATE_DIR": str(tmp_path), "DJANGO_PROFILE": "production"},
                   "check", "--deploy", "--fail-level", "WARNING")
    assert prod.returncode == 0, prod.stdout + prod.stderr
    assert "no issues" in prod.stdout
    # Without the profile the same check is not clean (so the test above can fail) ...
    dev = _manage({"STATE_DIR": str(tmp_path)}, "check", "--deploy", "--fail-level", "WARNING")
    assert dev.returncode != 0 and "SESSION_COOKIE_SECURE" in dev.stderr
    # ... nor is a full-mode cluster that leaves the replication endpoints open.
    open_cluster = _manage({"STATE_DIR": str(tmp_path), "DJANGO_PROFILE": "production",
                            "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"},
                           "check", "--deploy", "--fail-level", "WARNING")
    assert open_cluster.returncode != 0 and "synapse_repl.W001" in open_cluster.stderr


PRODUCTION_REQUESTS = """
import django, os, json
os.environ['DJANGO_SETTINGS_MODULE'] = 'synapse_repl.settings'
django.setup()
from django.test import Client
c = Client()
plain = c.get('/admin/login/')
secure = c.get('/admin/login/', secure=True)
replication = c.get('/_synapse/replication/get_repl_stream_updates/events/')
print(json.dumps({
    'plain': [plain.status_code, plain.get('Location')],
    'secure_status': secure.status_code,
    'headers': {k: secure.get(k) for k in ('Strict-Transport-Security', 'X-Content-Type-Options',
                'Referrer-Policy', 'X-Frame-Options', 'Cross-Origin-Opener-Policy')},
    'csrf_cookie_secure': bool(secure.cookies['csrftoken']['secure']),
    'replication': replication.status_code,
}))
"""


def test_production_profile_redirects_to_https_and_sends_security_headers(tmp_path):
    out = subprocess.run([sys.executable, "-c", PRODUCTION_REQUESTS], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=120,
                         env={"PATH": os.environ["PATH"], "STATE_DIR": str(tmp_path),
                              "DJANGO_PROFILE": "production", "ALLOWED_HOSTS": "testserver"})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["plain"] == [301, "https://testserver/admin/login/"]
    assert got["secure_status"] == 200
    assert got["headers"] == {
        "Strict-Transport-Security": "max-age=31536000; includeSubDomains; preload",
        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
        "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin",
    }
    assert got["csrf_cookie_secure"]
    # Workers may use plain HTTP to the catch-up endpoint: not redirected (the secret still holds).
    assert got["replication"] == 401


@pytest.fixture
def users(db):
    from django.contrib.auth.models import User
    from django.core.cache import cache

    cache.clear()
    User.objects.create_superuser("alice", password="right-password-a")
    User.objects.create_superuser("bob", password="right-password-b")
    yield
    cache.clear()


def _login(client, username: str, password: str, address: str) -> bool:
    response = client.post("/admin/login/", {"username": username, "password": password,
                                              "next": "/admin/"}, REMOTE_ADDR=address)
    return response.status_code == 302 and "_auth_user_id" in client.session


def test_login_throttled_per_address_and_username_pair(users, settings, caplog):
    from django.test import Client

    settings.LOGIN_MAX_FAILURES = 3
    attacker = Client()
    with caplog.at_level("WARNING", logger="common.login_throttle"):
        for _ in range(3):
            assert not _login(attacker, "alice", "guess", "10.0.0.1")
    # Throttled: even the right password fails now, for that username from that address ...
    assert not _login(attacker, "alice", "right-password-a", "10.0.0.1")
    # ... and is told so, with how long to wait, instead of "enter a correct ... password".
    page = attacker.post("/admin/login/", {"username": "alice", "password": "guess"},
                         REMOTE_ADDR="10.0.0.1").content.decode()
    assert "Too many failed logins for this username from your address: try again in " in page
    assert "correct username and password" not in page
    # The same username from another address, and another username from that address, log in.
    assert _login(Client(), "alice", "right-password-a", "10.0.0.2")
    assert _login(Client(), "bob", "right-password-b", "10.0.0.1")
    # Reaching the limit was logged once: address and username, never the password.
    lines = [r.getMessage() for r in caplog.records if r.name == "common.login_throttle"]
    assert len(lines) == 1 and "'alice'" in lines[0] and "10.0.0.1" in lines[0], lines
    assert "guess" not in lines[0]


def test_a_wrong_password_below_the_limit_gets_the_usual_message(users, settings):
    from django.test import Client

    settings.LOGIN_MAX_FAILURES = 3
    page = Client().post("/admin/login/", {"username": "alice", "password": "guess"},
                         REMOTE_ADDR="10.0.0.5").content.decode()
    assert "correct username and password" in page and "Too many" not in page


def test_the_failure_that_reaches_the_limit_says_so(users, settings):
    from django.test import Client

    settings.LOGIN_MAX_FAILURES = 2
    client = Client()
    started = time.monotonic()
    assert not _login(client, "alice", "guess", "10.0.0.6")
    page = client.post("/admin/login/", {"username": "alice", "password": "guess"},
                       REMOTE_ADDR="10.0.0.6").content.decode()
    # the 300 s window started at the first failure: what is left of it, however long the two
    # logins took (seconds on a loaded machine)
    took = time.monotonic() - started
    wait = re.search(r"try again in (\d+) s", page)
    assert wait, page
    assert 300 - took - 1 <= int(wait.group(1)) <= 300, (wait.group(0), took)


def test_login_counts_expire_with_the_window(users, settings):
    from django.core.cache import cache
    from django.test import Client
    from django.test.client import RequestFactory

    from common.login_throttle import LoginThrottle

    settings.LOGIN_MAX_FAILURES = 2
    for _ in range(2):
        assert not _login(Client(), "alice", "guess", "10.0.0.1")
    assert not _login(Client(), "alice", "right-password-a", "10.0.0.1")
    # The window passing is the cache entries expiring: drop them as the cache would.
    cache.delete_many(LoginThrottle.keys(RequestFactory().get("/", REMOTE_ADDR="10.0.0.1"), "alice"))
    assert _login(Client(), "alice", "right-password-a", "10.0.0.1")


def test_login_retry_after_is_the_rest_of_the_window():
    from django.core.cache.backends.locmem import LocMemCache

    from common.login_throttle import LoginThrottle

    now = [1000.0]
    throttle = LoginThrottle(2, 60, cache=LocMemCache("login-test", {}), timer=lambda: now[0])
    keys = throttle.keys(None, "alice")
    assert not throttle.failed(keys)
    now[0] += 20.5
    assert throttle.failed(keys)  # the one that reaches the limit
    assert throttle.blocked(keys) and throttle.retry_after(keys) == 40
    assert not throttle.failed(keys)  # past it: not reported again
    throttle.succeeded(keys)
    assert not throttle.blocked(keys)


def test_admin_login_requires_csrf(users):
    from django.test import Client

    response = Client(enforce_csrf_checks=True).post(
        "/admin/login/", {"username": "alice", "password": "right-password-a"})
    assert response.status_code == 403


def test_limits_come_from_the_environment(tmp_path):
    out = settings_in_subprocess(
        {"STATE_DIR": str(tmp_path), "API_MAX_LIMIT": "250", "REPLICATION_MAX_CONNECTIONS": "7",
         "REPLICATION_COMMAND_RATE": "2.5", "REPLICATION_CATCHUP_MAX_LIMIT": "30",
         "LOGIN_MAX_FAILURES": "9"},
        "settings.API_MAX_LIMIT, settings.SYNAPSE_REPL['REPLICATION_MAX_CONNECTIONS'], "
        "settings.SYNAPSE_REPL['REPLICATION_COMMAND_RATE'], "
        "settings.SYNAPSE_REPL['REPLICATION_CATCHUP_MAX_LIMIT'], settings.LOGIN_MAX_FAILURES, "
        "settings.SYNAPSE_REPL['REPLICATION_ALLOWED_NETWORKS']")
    assert out == "(250, 7, 2.5, 30, 9, '127.0.0.0/8,::1/128')"


# --- weak secrets ---------------------------------------------------------------------------------


def test_production_refuses_to_start_with_a_weak_secret(tmp_path):
    """DJANGO_PROFILE=production with API_TOKEN=a, or 32 identical characters: runservice
    says so in one line naming the fix and exits; the ASGI application (what daphne loads)
    refuses too; random ones start."""
    strong = "Zr8Kq2VxN4pLw7TfB3mYc9HdJ6sGa1Ue"
    base = {"STATE_DIR": str(tmp_path), "DJANGO_PROFILE": "production"}
    for api_token, reason in (("a", "API_TOKEN is 1 characters long, shorter than 32"),
                              ("a" * 32, "API_TOKEN repeats a pattern")):
        service = _manage({**base, "API_TOKEN": api_token, "REPLICATION_SECRET": strong}, "runservice")
        assert service.returncode != 0
        assert service.stderr.strip().count("\n") == 0, service.stderr  # one line, no traceback
        assert reason in service.stderr and "token_urlsafe" in service.stderr, service.stderr
        assert "a" * 32 not in service.stderr  # the secret itself is never printed

    def load_asgi(env):
        return subprocess.run([sys.executable, "-c", "import synapse_repl.asgi"], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, env={"PATH": os.environ["PATH"], **base, **env})

    asgi = load_asgi({"REPLICATION_SECRET": "s" * 32})
    assert asgi.returncode != 0 and "REPLICATION_SECRET repeats a pattern" in asgi.stderr
    ok = load_asgi({"API_TOKEN": strong, "REPLICATION_SECRET": strong[::-1]})
    assert ok.returncode == 0, ok.stderr


def test_check_deploy_names_weak_secrets_in_any_profile(tmp_path):
    for profile in ({}, {"DJANGO_PROFILE": "production"}):
        weak = _manage({"STATE_DIR": str(tmp_path), "API_TOKEN": "a", "REPLICATION_SECRET": "7" * 40, **profile},
                       "check", "--deploy")
        out = weak.stdout + weak.stderr
        assert out.count("synapse_repl.W002") == 2, out
        assert "API_TOKEN is 1 characters long" in out and "REPLICATION_SECRET repeats a pattern" in out

"""Web hardening against real processes (``runservice`` as ``make run`` starts it):
passwords in URLs never printed nor shown, ``STATE_DIR`` private, the live WebSocket admits
its own origin only (docs/security.md)."""
from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from testing.processes import web_answers
from testing.services import free_port

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(predicate, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)
    return result


class Service:
    """``manage.py runservice`` in its own process group, its output in a file."""

    def __init__(self, env: dict[str, str], state_dir: Path) -> None:
        self.web = free_port()
        self.base = f"http://127.0.0.1:{self.web}"
        self.state_dir = state_dir
        self.env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", "STATE_DIR": str(state_dir),
                    "WEB_LISTEN": f"127.0.0.1:{self.web}", "REPLICATION_LISTEN": f"127.0.0.1:{free_port()}",
                    **env}
        self.log_path = state_dir.parent / f"service-{self.web}.log"
        self.proc: subprocess.Popen | None = None

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=300)

    def start(self) -> "Service":
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "manage.py", "runservice"], cwd=ROOT, env=self.env,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        _wait_for(lambda: web_answers(self.base) or self.proc.poll() is not None, "runservice's web listener")
        assert self.proc.poll() is None, self.output()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signed_in(self, username: str, password: str) -> urllib.request.OpenerDirector:
        """An opener holding a staff session (through the real login form, CSRF and all)."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        form = opener.open(f"{self.base}/admin/login/", timeout=30).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
        body = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": token, "next": "/admin/"}).encode()
        opener.open(f"{self.base}/admin/login/", body, timeout=30)
        assert any(c.name == "sessionid" for c in jar), "could not sign in"
        return opener


def _modes(directory: Path) -> dict[str, str]:
    return {p.name: oct(p.stat().st_mode & 0o777) for p in directory.iterdir()}


@pytest.fixture(scope="module")
def embedded_service(tmp_path_factory):
    """The embedded default as ``make run`` starts it (SQLite, demo trickle on)."""
    state = tmp_path_factory.mktemp("embedded") / "var"
    service = Service({}, state)
    migrated = service.manage("migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    yield service.start()
    service.stop()


# --- STATE_DIR ---------------------------------------------------------------------------------


def test_state_dir_and_every_file_in_it_are_private(embedded_service):
    """The SQLite database, its WAL and shared memory (created by SQLite, later), the secrets
    and the admin password: 0600 in a 0700 directory, while the service runs."""
    state = embedded_service.state_dir
    _wait_for(lambda: (state / "db.sqlite3-wal").exists() and (state / "admin_password").exists(),
              "the database's WAL and the admin password")
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    files = {name: mode for name, mode in _modes(state).items() if (state / name).is_file()}
    for expected in ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm", "secret_key", "replication_secret",
                     "admin_password"):
        assert expected in files
    assert set(files.values()) == {"0o600"}, files


def test_an_older_state_dir_is_tightened_at_start_up(tmp_path):
    """An install made before this (directory 0755, files 0644) is made private by the next
    process that starts, before it opens anything."""
    from tests.synapse_repl.test_settings import settings_in_subprocess

    state = tmp_path / "var"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    for name in ("db.sqlite3", "db.sqlite3-wal", "admin_password", "celerybeat-schedule.db", "README"):
        (state / name).write_text("x")
        (state / name).chmod(0o644)
    settings_in_subprocess({"STATE_DIR": str(state)}, "settings.SECRET_KEY")
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    modes = _modes(state)
    assert modes.pop("README") == "0o644"  # not the service's: left as it was
    assert set(modes.values()) == {"0o600"}, modes


# --- the live WebSocket's origin ---------------------------------------------------------------


def _handshake(port: int, origin: str, host: str | None = None) -> str:
    """The status line a real WebSocket handshake to ``/ws/live/`` gets."""
    host = host or f"127.0.0.1:{port}"
    request = (f"GET /ws/live/ HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               f"Origin: {origin}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request.encode())
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(1024)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n", 1)[0].decode()


def test_websocket_from_another_port_of_the_same_host_is_refused(embedded_service):
    """A page served by another port of this host would carry the operators' cookie (cookies
    ignore ports): its handshake is refused; the page's own origin is accepted."""
    port = embedded_service.web
    assert _handshake(port, f"http://127.0.0.1:{port}").startswith("HTTP/1.1 101")
    assert _handshake(port, f"http://127.0.0.1:{port + 1}").startswith("HTTP/1.1 403")
    assert _handshake(port, "http://127.0.0.1").startswith("HTTP/1.1 403")  # port 80
    assert _handshake(port, f"https://127.0.0.1:{port}").startswith("HTTP/1.1 403")
    assert _handshake(port, f"http://localhost:{port}").startswith("HTTP/1.1 403")
    # ... and a Host outside ALLOWED_HOSTS gets nothing, whatever the origin says
    assert _handshake(port, f"http://evil.example:{port}", host=f"evil.example:{port}").startswith("HTTP/1.1 403")


# --- no password in any output ------------------------------------------------------------------


def test_no_url_password_in_logs_pages_or_command_output(tmp_path, pg_url, redis_server_with_password):
    """Full mode with a passworded DATABASE_URL and REDIS_URL: runservice's banner and logs
    (and those of its children: runreplication, the Celery worker), every page an operator
    sees, and management commands' output never contain either password."""
    db_password, redis_password = "pg-Secret-4711", redis_server_with_password.password
    user, at = pg_url.split("://", 1)[1].split("@", 1)
    database_url = f"postgres://{user}:{db_password}@{at}"  # (the test server trusts any password)
    redis_url = redis_server_with_password.url
    assert f":{redis_password}@" in redis_url
    admin_password = "operator-password-0123456789"
    service = Service({"DATABASE_URL": database_url, "REDIS_URL": redis_url, "ADMIN_USER": "ops",
                       "ADMIN_PASSWORD": admin_password, "LOG_LEVEL": "DEBUG",
                       "REPLICATION_SECRET": "s" * 40, "API_TOKEN": "t" * 40}, tmp_path / "var")
    outputs = []
    try:
        service.start()
        _wait_for(lambda: "ready" in service.output() or "celery@" in service.output(), "the Celery worker")
        opener = service.signed_in("ops", admin_password)
        for path in ("/", "/connections/", "/status.json", "/metrics", "/admin/", "/admin/jobs/jobrun/",
                     "/admin/streams/streamposition/", "/admin/dashboard/endpointstatus/",
                     "/api/sync?user_id=@u:localhost"):
            try:
                outputs.append(opener.open(service.base + path, timeout=30).read().decode(errors="replace"))
            except urllib.error.HTTPError as e:
                outputs.append(e.read().decode(errors="replace"))
        for args in (("write_facts", "receipts", "--count", "3", "--no-progress"),
                     ("check", "--deploy"), ("diffsettings",)):
            done = service.manage(*args)
            outputs += [done.stdout, done.stderr]
        # the celery beat schedule lives in STATE_DIR too: private like the rest
        state = tmp_path / "var"
        _wait_for(lambda: any(p.name.startswith("celerybeat-schedule") for p in state.iterdir()),
                  "celery beat's schedule file")
    finally:
        service.stop()
    log = service.output()
    assert "redis://:***@127.0.0.1" in log  # the banner names the Redis, masked
    for text in [log, *outputs]:
        assert db_password not in text
        assert redis_password not in text
    assert set(v for k, v in _modes(state).items() if (state / k).is_file()) == {"0o600"}, _modes(state)

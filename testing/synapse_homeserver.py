"""A real Synapse homeserver as a test oracle (docs/replication.md, "Following a real Synapse").

Synapse (``matrix-synapse``, a test-only dependency) is AGPL: it runs here only as a separate
program (``python -m synapse.app.homeserver``), on a throwaway PostgreSQL database with C
collation and the suite's Redis, listening on free loopback ports: a client listener (the
client-server API and the shared-secret admin registration) and a replication listener
(``get_repl_stream_updates``, behind ``worker_replication_secret``). :class:`ClientApi` drives
it with plain HTTP requests, as a Matrix client would.

With ``event_persisters`` it is a small worker cluster: the main process and one
``generic_worker`` per name, each an event persister (``stream_writers: events: [master,
...]``, every process in ``instance_map`` with a replication listener of its own), Synapse's
processes talking over the Redis only.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from testing.services import die_with_parent, free_port

SYNAPSE_VERSION = "1.163.2"
#: The first start creates Synapse's schema (a few seconds on an idle machine; a loaded CI
#: box with 2 cores can take much longer).
START_TIMEOUT = 120.0
#: Limits high enough for a test's burst of requests from one address and account.
_UNLIMITED = {"per_second": 1000, "burst_count": 1000}


class SynapseUnavailable(RuntimeError):
    """Synapse is not installed, is the wrong version, or did not start (the message says why)."""


def check_installed() -> None:
    try:
        import synapse
    except ImportError:
        raise SynapseUnavailable(
            f"matrix-synapse is not installed: pip install 'matrix-synapse[postgres,redis]=={SYNAPSE_VERSION}' "
            "(requirements.txt)") from None
    version = synapse.__version__.split()[0]
    if version != SYNAPSE_VERSION:
        raise SynapseUnavailable(f"matrix-synapse {version} is installed; this test is pinned to "
                                 f"{SYNAPSE_VERSION} (requirements.txt)")
    try:
        import psycopg2  # noqa: F401
        import txredisapi  # noqa: F401
    except ImportError as e:
        raise SynapseUnavailable(f"{e.name} is missing: install matrix-synapse with its extras, "
                                 f"'matrix-synapse[postgres,redis]=={SYNAPSE_VERSION}'") from None


@dataclass
class SynapseHomeserver:
    """One Synapse main process (instance ``master``), and its event-persister workers, started
    and stopped by the test.

    ``pg_port``: the throwaway PostgreSQL (user ``postgres``, trust authentication) where a
    C-collation database ``database`` is created. ``redis_port``/``redis_password``: the Redis
    Synapse publishes its replication on (channel ``server_name``). ``event_persisters``:
    names of ``generic_worker`` processes that write the events stream beside ``master``
    (Synapse shards the rooms between the writers by room ID).
    """

    server_name: str
    pg_port: int
    redis_port: int
    redis_password: str = ""
    database: str = "synapse"
    directory: str = ""
    client_port: int = 0
    replication_port: int = 0
    replication_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    registration_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    proc: subprocess.Popen | None = field(default=None, repr=False)
    starts: int = 0
    event_persisters: tuple[str, ...] = ()
    worker_ports: dict[str, int] = field(default_factory=dict)
    workers: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def replication_url(self) -> str:
        return f"http://127.0.0.1:{self.replication_port}"

    @property
    def log_path(self) -> Path:
        return Path(self.directory) / "homeserver.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{self.database}"

    # --- set-up ----------------------------------------------------------------------------

    def configure(self) -> "SynapseHomeserver":
        """Create the database and write the config (once)."""
        check_installed()
        import psycopg
        import yaml  # PyYAML: a dependency of Synapse's

        if not self.directory:
            self.directory = tempfile.mkdtemp(prefix="synapse_homeserver_")
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}"')
            # Synapse refuses any collation but C.
            conn.execute(f"""CREATE DATABASE "{self.database}" ENCODING 'UTF8' LC_COLLATE='C' """
                         "LC_CTYPE='C' TEMPLATE template0")
        config_path = Path(self.directory) / "homeserver.yaml"
        generated = subprocess.run(
            [sys.executable, "-m", "synapse.app.homeserver", "--server-name", self.server_name,
             "--config-path", str(config_path), "--data-directory", self.directory,
             "--generate-config", "--report-stats=no"],
            cwd=self.directory, capture_output=True, text=True, timeout=120)
        if generated.returncode != 0:
            raise SynapseUnavailable(f"synapse --generate-config failed:\n{generated.stderr[-3000:]}")
        config = yaml.safe_load(config_path.read_text())
        self.client_port, self.replication_port = free_port(), free_port()
        self.worker_ports = {name: free_port() for name in self.event_persisters}
        config.update({
            "listeners": [
                {"port": self.client_port, "type": "http", "tls": False, "x_forwarded": False,
                 "bind_addresses": ["127.0.0.1"], "resources": [{"names": ["client"], "compress": False}]},
                {"port": self.replication_port, "type": "http", "tls": False,
                 "bind_addresses": ["127.0.0.1"], "resources": [{"names": ["replication"]}]},
            ],
            "database": {"name": "psycopg2", "args": {
                "user": "postgres", "host": "127.0.0.1", "port": self.pg_port,
                "database": self.database, "cp_min": 2, "cp_max": 5}},
            "redis": {"enabled": True, "host": "127.0.0.1", "port": self.redis_port,
                      **({"password": self.redis_password} if self.redis_password else {})},
            "worker_replication_secret": self.replication_secret,
            "instance_map": {"main": {"host": "127.0.0.1", "port": self.replication_port},
                             **{name: {"host": "127.0.0.1", "port": port}
                                for name, port in self.worker_ports.items()}},
            **({"stream_writers": {"events": ["master", *self.event_persisters]}}
               if self.event_persisters else {}),
            "enable_registration": False,
            "registration_shared_secret": self.registration_secret,
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "report_stats": False,
            "presence": {"enabled": False},
            "url_preview_enabled": False,
            "rc_message": _UNLIMITED,
            "rc_login": {"address": _UNLIMITED, "account": _UNLIMITED, "failed_attempts": _UNLIMITED},
            "rc_joins": {"local": _UNLIMITED, "remote": _UNLIMITED},
            "rc_invites": {"per_room": _UNLIMITED, "per_user": _UNLIMITED},
            "rc_room_creation": _UNLIMITED,
            "rc_registration": _UNLIMITED,
        })
        config_path.write_text(yaml.safe_dump(config))
        log_config = Path(config["log_config"])
        logging_config = yaml.safe_load(log_config.read_text())
        logging_config.setdefault("handlers", {}).setdefault("file", {})["filename"] = str(self.log_path)
        logging_config.setdefault("loggers", {})["synapse.replication"] = {"level": "DEBUG"}
        # Unbuffered: the generated config holds lines in memory for up to 5 s, and the tests
        # read the access log (catch-up requests) as they go.
        logging_config.setdefault("root", {})["handlers"] = ["file"]
        log_config.write_text(yaml.safe_dump(logging_config))
        for name, port in self.worker_ports.items():
            worker_log = Path(self.directory) / f"{name}.log.config"
            logging_config["handlers"]["file"]["filename"] = str(Path(self.directory) / f"{name}.log")
            worker_log.write_text(yaml.safe_dump(logging_config))
            (Path(self.directory) / f"{name}.yaml").write_text(yaml.safe_dump({
                "worker_app": "synapse.app.generic_worker", "worker_name": name,
                "worker_listeners": [{"type": "http", "port": port, "bind_addresses": ["127.0.0.1"],
                                      "resources": [{"names": ["replication"]}]}],
                "worker_log_config": str(worker_log)}))
        return self

    # --- the process -----------------------------------------------------------------------

    def _spawn(self, app: str, config: str, output: str) -> subprocess.Popen:
        out = open(Path(self.directory) / output, "ab")
        try:
            return subprocess.Popen(
                [sys.executable, "-m", app, "-c", str(Path(self.directory) / "homeserver.yaml"),
                 *(["-c", str(Path(self.directory) / config)] if config else [])],
                cwd=self.directory, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                # a killed test run leaves no homeserver behind (started from the main thread
                # only: the signal comes when the starting thread ends)
                preexec_fn=die_with_parent if threading.current_thread() is threading.main_thread() else None)
        finally:
            out.close()

    def start(self, timeout: float = START_TIMEOUT) -> "SynapseHomeserver":
        """Start the main process and wait until the client API answers, then each event
        persister until its replication listener answers."""
        self.proc = self._spawn("synapse.app.homeserver", "", "stdout.log")
        self.starts += 1
        deadline = time.monotonic() + timeout
        self._wait_answers(self.proc, f"{self.client_url}/_matrix/client/versions", "Synapse", deadline)
        for name, port in self.worker_ports.items():
            self.workers[name] = self._spawn("synapse.app.generic_worker", f"{name}.yaml", f"{name}.stdout.log")
            # the replication listener answers 404 at its root once the worker runs
            self._wait_answers(self.workers[name], f"http://127.0.0.1:{port}/", f"worker {name}", deadline)
        return self

    def _wait_answers(self, proc: subprocess.Popen, url: str, what: str, deadline: float) -> None:
        while True:
            if proc.poll() is not None:
                raise SynapseUnavailable(f"{what} exited with status {proc.returncode} while "
                                         f"starting:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError:
                return  # it answers
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SynapseUnavailable(f"{what} did not answer in time:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM every process (Synapse shuts down cleanly), SIGKILL after 30 s; a stopped
        (SIGSTOP) worker is continued first."""
        for proc in [*self.workers.values(), self.proc]:
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        for proc in [*self.workers.values(), self.proc]:
            if proc is None:
                continue
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workers = {}

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, chars: int = 4000) -> str:
        parts = []
        for name in ("stdout.log", "homeserver.log", *(f"{w}{suffix}" for w in self.event_persisters
                                                       for suffix in (".stdout.log", ".log"))):
            path = Path(self.directory) / name
            if path.exists():
                parts.append(f"--- {name}\n" + path.read_text(errors="replace")[-chars:])
        return "\n".join(parts)

    # --- ground truth ----------------------------------------------------------------------

    def query(self, sql: str, *params: Any) -> list[tuple]:
        """Read Synapse's own tables (the oracle for what it persisted)."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return list(conn.execute(sql, params).fetchall())

    def persisted_events(self) -> list[tuple[int, str, str]]:
        """(stream_ordering, event_id, type) of every event Synapse persisted, in order."""
        return [tuple(r) for r in self.query(
            "SELECT stream_ordering, event_id, type FROM events ORDER BY stream_ordering")]

    # --- users -----------------------------------------------------------------------------

    def register(self, username: str, password: str | None = None, admin: bool = False) -> "ClientApi":
        """Register through the shared-secret admin API; returns a client logged in as the user."""
        password = password or secrets.token_urlsafe(12)
        api = ClientApi(self.client_url)
        nonce = api.request("GET", "/_synapse/admin/v1/register")["nonce"]
        mac = hmac.new(self.registration_secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join([nonce.encode(), username.encode(), password.encode(),
                                 b"admin" if admin else b"notadmin"]))
        answer = api.request("POST", "/_synapse/admin/v1/register", {
            "nonce": nonce, "username": username, "password": password, "admin": admin,
            "mac": mac.hexdigest()})
        api.token, api.user_id, api.device_id = answer["access_token"], answer["user_id"], answer["device_id"]
        return api


@contextlib.contextmanager
def running(homeserver: SynapseHomeserver) -> Iterator[SynapseHomeserver]:
    """``homeserver`` configured and started for a fixture, removed afterwards. One that cannot
    start fails the test, never skips it: the suite must have every part."""
    import pytest

    try:
        homeserver.configure().start()
    except SynapseUnavailable as e:
        homeserver.remove()
        pytest.fail(str(e), pytrace=False)
    try:
        yield homeserver
    finally:
        homeserver.remove()


def client_traffic(homeserver: SynapseHomeserver, tag: str) -> tuple["ClientApi", "ClientApi", str]:
    """Client traffic of every kind the fixture drives, in a private room of two new users
    (``alice``, ``bob``): messages, state, typing, a receipt, account data and to-device.
    Returns the two users and the room."""
    alice, bob = homeserver.register("alice"), homeserver.register("bob")
    room = alice.create_room(preset="private_chat")
    alice.invite(room, bob.user_id)
    bob.join(room)
    last = ""
    for i in range(5):
        last = alice.send_message(room, f"hello {i}")
    alice.set_topic(room, tag)
    alice.typing(room)
    bob.read_receipt(room, last)
    alice.account_data(f"org.example.{tag}", {"n": 1})
    alice.send_to_device(bob.user_id, bob.device_id, "org.example.ping", {"n": 1})
    return alice, bob, room


class MatrixError(RuntimeError):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


@dataclass
class ClientApi:
    """A Matrix client of the client-server API (just the calls the tests make)."""

    base_url: str
    token: str = ""
    user_id: str = ""
    device_id: str = ""
    _txn: int = 0

    def request(self, method: str, path: str, body: Any = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        for _attempt in range(50):
            req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=30) as response:
                    return json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as e:
                answer = json.loads(e.read() or b"{}")
                if e.code == 429:  # rate limited anyway: wait as told
                    time.sleep(answer.get("retry_after_ms", 100) / 1000)
                    continue
                raise MatrixError(e.code, answer) from None
        raise MatrixError(429, "still rate limited after 50 attempts")

    def _next_txn(self) -> str:
        self._txn += 1
        return f"t{self._txn}-{secrets.token_hex(4)}"

    @staticmethod
    def _q(value: str) -> str:
        return urllib.parse.quote(value, safe="")

    def create_room(self, **body: Any) -> str:
        return self.request("POST", "/_matrix/client/v3/createRoom", body)["room_id"]

    def invite(self, room_id: str, user_id: str) -> None:
        self.request("POST", f"/_matrix/client/v3/rooms/{self._q(room_id)}/invite", {"user_id": user_id})

    def join(self, room_id: str) -> None:
        self.request("POST", f"/_matrix/client/v3/join/{self._q(room_id)}", {})

    def send_message(self, room_id: str, text: str) -> str:
        return self.request("PUT", f"/_matrix/client/v3/rooms/{self._q(room_id)}/send/m.room.message/"
                                   f"{self._next_txn()}", {"msgtype": "m.text", "body": text})["event_id"]

    def set_topic(self, room_id: str, topic: str) -> str:
        return self.request("PUT", f"/_matrix/client/v3/rooms/{self._q(room_id)}/state/m.room.topic/",
                            {"topic": topic})["event_id"]

    def ban(self, room_id: str, user_id: str, reason: str = "") -> str:
        """Ban ``user_id``; the ban event's ID (the room's state says it)."""
        self.request("POST", f"/_matrix/client/v3/rooms/{self._q(room_id)}/ban",
                     {"user_id": user_id, **({"reason": reason} if reason else {})})
        return self.state_event_id(room_id, "m.room.member", user_id)

    def state(self, room_id: str, event_type: str, state_key: str = "") -> dict:
        """The content of a state event of the room's current state."""
        return self.request("GET", f"/_matrix/client/v3/rooms/{self._q(room_id)}/state/{self._q(event_type)}/"
                                   f"{self._q(state_key)}")

    def set_state(self, room_id: str, event_type: str, content: dict, state_key: str = "") -> str:
        return self.request("PUT", f"/_matrix/client/v3/rooms/{self._q(room_id)}/state/{self._q(event_type)}/"
                                   f"{self._q(state_key)}", content)["event_id"]

    def state_event_id(self, room_id: str, event_type: str, state_key: str = "") -> str:
        """The ID of the current state event of that key (``format=event``)."""
        return self.request("GET", f"/_matrix/client/v3/rooms/{self._q(room_id)}/state/{self._q(event_type)}/"
                                   f"{self._q(state_key)}?format=event")["event_id"]

    def sync(self, *, since: str | None = None, timeline_limit: int = 10) -> dict:
        """``/sync`` at once (no long poll) with a filter that sets each room's timeline limit."""
        query = {"timeout": "0", "filter": json.dumps({"room": {"timeline": {"limit": timeline_limit}}})}
        if since is not None:
            query["since"] = since
        return self.request("GET", "/_matrix/client/v3/sync?" + urllib.parse.urlencode(query))

    def typing(self, room_id: str, typing: bool = True) -> None:
        self.request("PUT", f"/_matrix/client/v3/rooms/{self._q(room_id)}/typing/{self._q(self.user_id)}",
                     {"typing": typing, "timeout": 30000} if typing else {"typing": False})

    def read_receipt(self, room_id: str, event_id: str) -> None:
        self.request("POST", f"/_matrix/client/v3/rooms/{self._q(room_id)}/receipt/m.read/"
                             f"{self._q(event_id)}", {})

    def account_data(self, data_type: str, content: dict) -> None:
        self.request("PUT", f"/_matrix/client/v3/user/{self._q(self.user_id)}/account_data/"
                            f"{self._q(data_type)}", content)

    def send_to_device(self, user_id: str, device_id: str, event_type: str, content: dict) -> None:
        self.request("PUT", f"/_matrix/client/v3/sendToDevice/{self._q(event_type)}/{self._next_txn()}",
                     {"messages": {user_id: {device_id: content}}})

"""Throttles against a running ``runservice`` on real sockets: a local process that
sends wrong bearer tokens or wrong admin passwords locks nobody else out. The right
``REPLICATION_SECRET`` still gets a worker its catch-up facts, the right ``API_TOKEN`` its
answer, and the operator signs in from another address; the guesser gets 429 / "too many
failed logins ... try again in N s", and the service logs it.

Two client addresses without a proxy: Linux routes all of 127.0.0.0/8 to the loopback
interface, so a client socket bound to 127.0.0.2 reaches the server on 127.0.0.1 and is seen
as coming from 127.0.0.2.
"""
from __future__ import annotations

import http.client
import json
import re
import urllib.parse
import uuid

import pytest

from replication.worker.catchup_client import fetch_catch_up_page
from tests.synapse_repl.test_web_hardening import Service, _wait_for

REPLICATION_SECRET = "Zr8Kq2VxN4pLw7TfB3mYc9HdJ6sGa1Ue-live"
API_TOKEN = "Ht5Rn8QzW2kMv7XbL4pYc3FdJ9sGa6Ue-live"
ADMIN_PASSWORD = "operator-Pa55word-for-the-live-test"
GUESSER, OPERATOR = "127.0.0.1", "127.0.0.2"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = tmp_path_factory.mktemp("throttle") / "var"
    running = Service({"REPLICATION_SECRET": REPLICATION_SECRET, "API_TOKEN": API_TOKEN,
                       "ADMIN_PASSWORD": ADMIN_PASSWORD, "DEMO": "0",
                       "BEARER_MAX_FAILURES": "10", "LOGIN_MAX_FAILURES": "5"}, state)
    migrated = running.manage("migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    written = running.manage("write_facts", "receipts", "--count", "40", "--no-progress")
    assert written.returncode == 0, written.stderr
    yield running.start()
    running.stop()


def _request(service: Service, method: str, path: str, source: str, headers: dict | None = None,
             body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own from ``source`` (a loopback address)."""
    conn = http.client.HTTPConnection("127.0.0.1", service.web, timeout=30, source_address=(source, 0))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _guess_catchup(service: Service, source: str) -> int:
    path = (f"/_synapse/replication/get_repl_stream_updates/receipts/{uuid.uuid4().hex[:12]}"
            "?from_token=0&upto_token=100")
    return _request(service, "GET", path, source, {"Authorization": "Bearer wrong-guess"})[0]


def test_wrong_replication_secrets_do_not_lock_a_worker_out_of_catch_up(service):
    statuses = [_guess_catchup(service, GUESSER) for _ in range(12)]
    assert statuses == [403] * 10 + [429] * 2
    status, headers, body = _request(
        service, "GET", f"/_synapse/replication/get_repl_stream_updates/receipts/{uuid.uuid4().hex[:12]}"
                        "?from_token=0&upto_token=100", GUESSER, {"Authorization": "Bearer wrong-guess"})
    assert status == 429 and 0 < int(headers["retry-after"]) <= 300
    assert json.loads(body)["errcode"] == "M_LIMIT_EXCEEDED"
    # A worker on the guesser's own address, with the right secret, gets its facts: what the
    # worker's catch-up client does, on a socket.
    page = fetch_catch_up_page(service.base, "receipts", "master", 0, 1_000, secret=REPLICATION_SECRET)
    assert len(page.updates) == 40
    _wait_for(lambda: "wrong REPLICATION_SECRET tokens from 127.0.0.1" in service.output(),
              "the throttle's log line", timeout=30)
    assert "wrong-guess" not in service.output()


def test_wrong_api_tokens_do_not_lock_the_right_one_out(service):
    path = "/api/sync?user_id=%40u%3Alocalhost"
    guesser = "127.0.0.3"  # (an address of its own: /api/ and catch-up guesses add up)
    statuses = [_request(service, "GET", path, guesser, {"Authorization": "Bearer wrong-guess"})[0]
                for _ in range(12)]
    assert statuses == [401] * 10 + [429] * 2
    status, _headers, body = _request(service, "GET", path, guesser, {"Authorization": f"Bearer {API_TOKEN}"})
    assert status == 200, body


class Browser:
    """A client on one source address that keeps its cookies (CSRF and session)."""

    def __init__(self, service: Service, source: str) -> None:
        self.service, self.source, self.cookies = service, source, {}

    def _send(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], str]:
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn = http.client.HTTPConnection("127.0.0.1", self.service.web, timeout=30,
                                          source_address=(self.source, 0))
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            for name, value in response.getheaders():
                if name.lower() == "set-cookie":
                    key, _, rest = value.partition("=")
                    self.cookies[key] = rest.split(";", 1)[0]
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
        finally:
            conn.close()

    def log_in(self, username: str, password: str) -> tuple[bool, str]:
        """(signed in, the page shown when not)."""
        _status, _headers, form = self._send("GET", "/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
        body = urllib.parse.urlencode({"username": username, "password": password, "next": "/admin/",
                                       "csrfmiddlewaretoken": token}).encode()
        status, headers, page = self._send("POST", "/admin/login/", body)
        return status == 302 and headers.get("location") == "/admin/", page


def test_wrong_admin_passwords_do_not_lock_the_operator_out(service):
    guesser = Browser(service, GUESSER)
    for _ in range(4):
        signed_in, page = guesser.log_in("admin", "wrong-guess")
        assert not signed_in and "correct username and password" in page
    signed_in, page = guesser.log_in("admin", "wrong-guess")  # the fifth: the limit
    assert not signed_in
    wait = re.search(r"Too many failed logins for this username from your address: try again in (\d+) s", page)
    assert wait and 0 < int(wait.group(1)) <= 300, page
    # Throttled: the right password from the guesser's address is refused too, and says why.
    signed_in, page = guesser.log_in("admin", ADMIN_PASSWORD)
    assert not signed_in and "Too many failed logins" in page
    # The operator, from another address, signs in.
    signed_in, page = Browser(service, OPERATOR).log_in("admin", ADMIN_PASSWORD)
    assert signed_in, page
    _wait_for(lambda: "login throttled: 5 failed logins for username 'admin' from 127.0.0.1" in service.output(),
              "the login throttle's log line", timeout=30)
    assert "wrong-guess" not in service.output() and ADMIN_PASSWORD not in service.output()

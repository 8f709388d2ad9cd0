"""REPLICATION_SECRET on /_synapse/replication/ (replication/http/replication_secret.py)."""
import json
import random

import pytest

from replication.http.replication_secret import check_authorization
from replication.worker.catchup_client import CatchUpError, fetch_catch_up_page
from streams.conf import stream_writers
from streams.models import Receipt
from streams.runtime import StreamRuntime

URL = "/_synapse/replication/get_repl_stream_updates/receipts/txn-auth"  # Synapse's form
QUERY = {"from_token": 0, "upto_token": 1}
SECRET = "s3cret-for-tests"


@pytest.fixture
def secret(settings):
    settings.REPLICATION_SECRET = SECRET
    return SECRET


@pytest.mark.parametrize("headers, status, errcode", [
    ({}, 401, "M_MISSING_TOKEN"),
    ({"Authorization": "Bearer wrong"}, 403, "M_FORBIDDEN"),
    ({"Authorization": f"Bearer {SECRET}x"}, 403, "M_FORBIDDEN"),
    ({"Authorization": f"Basic {SECRET}"}, 403, "M_FORBIDDEN"),
    ({"Authorization": f"Bearer  {SECRET}"}, 403, "M_FORBIDDEN"),
    ({"Authorization": ""}, 403, "M_FORBIDDEN"),
])
@pytest.mark.django_db
def test_refused_without_the_secret(client, secret, headers, status, errcode):
    response = client.get(URL, QUERY, headers=headers)
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    assert response.json()["errcode"] == errcode and response.json()["error"]


@pytest.mark.django_db
def test_every_replication_url_is_covered(client, secret):
    # Even a URL that does not exist answers 401, not 404: nothing is learnt without the secret.
    assert client.get("/_synapse/replication/no_such_endpoint/x").status_code == 401
    assert client.get("/status.json").status_code != 401  # other URLs are not affected


@pytest.mark.django_db
def test_admitted_with_the_secret(client, secret):
    response = client.get(URL, QUERY, headers={"Authorization": f"Bearer {SECRET}"})
    assert response.status_code == 200 and "updates" in response.json()


def test_two_authorization_headers_are_refused():
    assert check_authorization([f"Bearer {SECRET}", f"Bearer {SECRET}"], SECRET).status_code == 403
    assert check_authorization([f"Bearer {SECRET}"], SECRET) is None


@pytest.mark.django_db(transaction=True)
def test_doubled_header_over_http(live_server, secret):
    """Two real Authorization headers on the wire (Django folds them with a comma)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(live_server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.putrequest("GET", URL + "?from_token=0&upto_token=1")
    conn.putheader("Authorization", f"Bearer {SECRET}")
    conn.putheader("Authorization", f"Bearer {SECRET}")
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 403 and b"Too many Authorization headers" in response.read()


@pytest.mark.django_db(transaction=True)
def test_worker_client_sends_the_secret(live_server, secret):
    rt = StreamRuntime(instance_name="master", writers=stream_writers(""))
    try:
        ids = rt.writer("receipts").append([[(Receipt, Receipt.synthetic(random.Random(1), 0))]])
    finally:
        rt.close()
    page = fetch_catch_up_page(live_server.url, "receipts", "master", 0, ids[-1], secret=SECRET)
    assert [t for t, _ in page.updates] == ids
    with pytest.raises(CatchUpError, match="HTTP 401"):
        fetch_catch_up_page(live_server.url, "receipts", "master", 0, ids[-1])
    with pytest.raises(CatchUpError, match="HTTP 403"):
        fetch_catch_up_page(live_server.url, "receipts", "master", 0, ids[-1], secret="nope")


# --- a14.1: the secret cannot be dressed around --------------------------------------------------


def test_every_replication_route_checks_the_secret_at_the_view():
    """Every URL pattern under _synapse/ resolves to a view wrapped in the secret check, so a
    path that reaches the view by any route meets the check (not only a path-prefix test)."""
    from django.urls import URLPattern, URLResolver, get_resolver

    def walk(patterns, prefix=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield prefix + str(p.pattern), p.callback

    replication = [(route, view) for route, view in walk(get_resolver().url_patterns)
                   if route.lstrip("^").startswith("_synapse")]
    assert len(replication) >= 2  # the catch-up view, with and without a txn_id segment
    for route, view in replication:
        assert getattr(view, "requires_replication_secret", False), route


@pytest.mark.django_db
def test_the_view_refuses_even_where_the_middleware_does_not_look(rf, secret):
    """Called directly (as a request whose path no prefix test would match reaches it)."""
    from replication.http.catchup import get_repl_stream_updates

    request = rf.get("/anything/else/", QUERY)
    response = get_repl_stream_updates(request, "receipts", "txn-direct")
    assert response.status_code == 401
    request = rf.get("/anything/else/", QUERY, headers={"Authorization": f"Bearer {SECRET}"})
    assert get_repl_stream_updates(request, "receipts", "txn-direct").status_code == 200


@pytest.mark.django_db
def test_no_secret_configured_serves_nothing(client, settings):
    settings.REPLICATION_SECRET = ""
    response = client.get(URL, QUERY)
    assert response.status_code == 503 and "REPLICATION_SECRET is not set" in response.json()["error"]
    response = client.get(URL.rsplit("/", 1)[0] + "/", QUERY)  # the form without a txn_id
    assert response.status_code == 503


@pytest.fixture(scope="module")
def real_daphne(tmp_path_factory):
    """The web process as deployed (daphne, the embedded default), with facts in to_device and
    receipts, so a bypass would show rows."""
    import os
    import subprocess
    import sys

    from testing.processes import ROOT, wait_port
    from testing.services import free_port

    tmp = tmp_path_factory.mktemp("daphne_auth")
    env = {"PATH": os.environ["PATH"], "STATE_DIR": str(tmp), "DEMO": "0", "PYTHONUNBUFFERED": "1",
           "DJANGO_SETTINGS_MODULE": "synapse_repl.settings"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True, timeout=300)
    for stream in ("receipts", "to_device"):
        subprocess.run([sys.executable, "manage.py", "write_facts", stream, "--count", "3", "--no-progress"],
                       cwd=ROOT, env=env, check=True, timeout=300, capture_output=True)
    port = free_port()
    log = tmp / "daphne.log"
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "synapse_repl.asgi:application"], cwd=ROOT, env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc, log, timeout=60)
        yield port, (tmp / "replication_secret").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _raw_get(port: int, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """A GET with the request target sent byte for byte (no client-side normalisation)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.putrequest("GET", target, skip_host=False, skip_accept_encoding=True)
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    response = conn.getresponse()
    return response.status, response.read()


TOKENS = "?instance_name=master&from_token=0&upto_token=100"
DRESSED = [
    # (request target, extra headers): every way a path to the catch-up data can be dressed
    # (with a txn_id: the form that serves data; the form without one is 404 anyway)
    ("/x/_synapse/replication/get_repl_stream_updates/to_device/txn0" + TOKENS, {"Daphne-Root-Path": "/x"}),
    ("/x/_synapse/replication/get_repl_stream_updates/to_device/txn1" + TOKENS, {"Daphne-Root-Path": "/x"}),
    ("/%78/_synapse/replication/get_repl_stream_updates/to_device/txn0" + TOKENS, {"Daphne-Root-Path": "/%78"}),
    ("/_synapse/replication/get_repl_stream_updates/to_device/txn0" + TOKENS, {"Daphne-Root-Path": "/_synapse"}),
    ("/_synapse/replication/get_repl_stream_updates/to_device/txn0" + TOKENS, {}),
    ("/_synapse/replication/get_repl_stream_updates/to_device/txn1" + TOKENS, {}),
    ("/_synapse/replication/get_repl_stream_updates/to_device/txn1/" + TOKENS, {}),
    ("/_synapse/replication%2Fget_repl_stream_updates%2Fto_device%2Ftxn0" + TOKENS, {}),
    ("/_synapse%2Freplication/get_repl_stream_updates/to_device/txn0" + TOKENS, {}),
    ("/_synapse/replication/get_repl_stream_updates/to_device%2Ftxn1" + TOKENS, {}),
    ("//_synapse/replication/get_repl_stream_updates/to_device/txn0" + TOKENS, {}),
    ("/_synapse//replication/get_repl_stream_updates/to_device/txn0" + TOKENS, {}),
    ("/_synapse/replication//get_repl_stream_updates/to_device/txn0" + TOKENS, {}),
    ("/./_synapse/replication/get_repl_stream_updates/to_device/txn0" + TOKENS, {}),
    ("/x/../_synapse/replication/get_repl_stream_updates/to_device/txn0" + TOKENS, {}),
    ("/%5F%73ynapse/replication/get_repl_stream_updates/to_device/txn0" + TOKENS, {}),
    ("/_synapse/replication/get_repl_stream_updates/receipts/txn0" + TOKENS, {"X-Script-Name": "/x"}),
]


@pytest.mark.parametrize("target, headers", DRESSED)
def test_no_dressing_of_the_path_reads_a_stream_without_the_secret(real_daphne, target, headers):
    port, _secret = real_daphne
    status, body = _raw_get(port, target, headers)
    assert status != 200 and b"updates" not in body, (status, body[:200])


def test_the_real_web_process_serves_with_the_secret_and_ignores_a_client_root_path(real_daphne):
    """The same server answers 200 with rows when the secret is sent (so the test above can
    fail), and a client's Daphne-Root-Path never changes what a path means."""
    port, secret = real_daphne
    auth = {"Authorization": f"Bearer {secret}"}
    status, body = _raw_get(port, "/_synapse/replication/get_repl_stream_updates/to_device/txn-a" + TOKENS, auth)
    assert status == 200 and len(json.loads(body)["updates"]) == 3, body
    # Without a txn_id, as Synapse: 404 M_UNRECOGNIZED (once the secret let it that far).
    status, body = _raw_get(port, "/_synapse/replication/get_repl_stream_updates/to_device/" + TOKENS, auth)
    assert status == 404 and json.loads(body)["errcode"] == "M_UNRECOGNIZED", body
    status, _ = _raw_get(port, "/x/_synapse/replication/get_repl_stream_updates/to_device/" + TOKENS,
                         {**auth, "Daphne-Root-Path": "/x"})
    assert status == 404

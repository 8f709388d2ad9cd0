"""REPLICATION_SECRET on /_synapse/replication/ (streams/replication/auth.py)."""
import random

import pytest

from streams.conf import stream_writers
from streams.models import Receipt
from streams.replication.auth import check_authorization
from streams.replication.worker import CatchUpError, fetch_catch_up_page
from streams.runtime import StreamRuntime

URL = "/_synapse/replication/get_repl_stream_updates/receipts/"
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

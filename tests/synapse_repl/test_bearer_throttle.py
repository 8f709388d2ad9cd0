"""synapse_repl/bearer_throttle.py: wrong bearer tokens on /api/ and the catch-up endpoint are
throttled per address: past BEARER_MAX_FAILURES, 429 with Retry-After, even for the right
token, until the window has passed; other addresses and token-less requests are unaffected."""
from __future__ import annotations

import uuid

import pytest
from django.core.cache import cache
from django.test import Client

from synapse_repl.bearer_throttle import BearerThrottle

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/sync?user_id=@a:hs"
# {txn}: a fresh transaction ID per request (an answer kept under a used one is replayed)
CATCHUP = "/_synapse/replication/get_repl_stream_updates/receipts/{txn}?from_token=0&upto_token=1"


@pytest.fixture
def limits(settings):
    settings.BEARER_MAX_FAILURES = 3
    settings.BEARER_FAILURE_WINDOW_SECONDS = 300
    settings.API_TOKEN = "a" * 40
    return settings


def _get(path: str, token: str | None, address: str):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    return Client().get(path.replace("{txn}", uuid.uuid4().hex), REMOTE_ADDR=address, **headers)


@pytest.mark.parametrize("path, right, wrong_status", [
    (API, "API_TOKEN", 401),
    (CATCHUP, "REPLICATION_SECRET", 403),
])
def test_wrong_tokens_are_throttled_per_address(limits, path, right, wrong_status):
    token = getattr(limits, right)
    for _ in range(3):
        assert _get(path, "guess", "10.0.0.1").status_code == wrong_status
    throttled = _get(path, "guess", "10.0.0.1")
    assert throttled.status_code == 429
    assert throttled.json()["errcode"] == "M_LIMIT_EXCEEDED"
    assert 0 < int(throttled["Retry-After"]) <= 300
    # even the right token, from that address, until the window has passed ...
    assert _get(path, token, "10.0.0.1").status_code == 429
    # ... while another address is served
    assert _get(path, token, "10.0.0.2").status_code == 200
    # the window passing is the cache entries expiring: drop them as the cache would
    cache.delete_many(BearerThrottle.address_keys(_request("10.0.0.1")))
    assert _get(path, token, "10.0.0.1").status_code == 200


def _request(address: str):
    from django.test import RequestFactory

    return RequestFactory().get("/", REMOTE_ADDR=address)


def test_requests_without_a_token_are_not_guesses(limits):
    for _ in range(10):
        assert _get(CATCHUP, None, "10.0.0.3").status_code == 401
        assert _get(API, None, "10.0.0.3").status_code == 401
    assert _get(CATCHUP, limits.REPLICATION_SECRET, "10.0.0.3").status_code == 200
    assert _get(API, limits.API_TOKEN, "10.0.0.3").status_code == 200


def test_api_and_catchup_guesses_add_up_and_zero_turns_it_off(limits):
    for path in (API, CATCHUP, API):
        _get(path, "guess", "10.0.0.4")
    assert _get(CATCHUP, limits.REPLICATION_SECRET, "10.0.0.4").status_code == 429
    limits.BEARER_MAX_FAILURES = 0
    assert _get(CATCHUP, limits.REPLICATION_SECRET, "10.0.0.4").status_code == 200


def test_retry_after_is_the_rest_of_the_window():
    from django.core.cache.backends.locmem import LocMemCache

    now = [1000.0]
    throttle = BearerThrottle(2, 60, cache=LocMemCache("bearer-test", {}), timer=lambda: now[0])
    keys = throttle.address_keys(_request("10.0.0.5"))
    throttle.failed(keys)
    now[0] += 20.5
    throttle.failed(keys)
    assert throttle.blocked(keys)
    assert throttle.retry_after(keys) == 40  # the window started at the first failure

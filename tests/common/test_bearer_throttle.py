"""common/bearer_throttle.py: wrong bearer tokens on /api/ and the catch-up endpoint are
throttled per address: past BEARER_MAX_FAILURES, a wrong token gets 429 with Retry-After until
the window has passed; the right token is always served, from any address; token-less
requests are not counted. (Against a running server: test_throttle_live.py.)"""
from __future__ import annotations

import uuid

import pytest
from django.core.cache import cache
from django.test import Client

from common.bearer_throttle import BearerThrottle

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/sync?user_id=@a:hs"
# {txn}: a fresh transaction ID per request (an answer kept under a used one is replayed)
CATCHUP = "/_synapse/replication/get_repl_stream_updates/receipts/{txn}?from_token=0&upto_token=1"


@pytest.fixture
def limits(settings):
    settings.BEARER_MAX_FAILURES = 3
    settings.BEARER_FAILURE_WINDOW_SECONDS = 300
    settings.API_TOKEN = "kX3p9QzR7mVt2LwB8nYc4HdJ6sFgA1Ue"
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
    # the right token is served, from that address too
    assert _get(path, token, "10.0.0.1").status_code == 200
    assert _get(path, "guess", "10.0.0.1").status_code == 429
    # another address's wrong token is its own first guess
    assert _get(path, "guess", "10.0.0.2").status_code == wrong_status
    # the window passing is the cache entries expiring: drop them as the cache would
    cache.delete_many(BearerThrottle.address_keys(_request("10.0.0.1")))
    assert _get(path, "guess", "10.0.0.1").status_code == wrong_status


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
    assert _get(CATCHUP, "guess", "10.0.0.4").status_code == 429
    assert _get(CATCHUP, limits.REPLICATION_SECRET, "10.0.0.4").status_code == 200
    limits.BEARER_MAX_FAILURES = 0
    assert _get(CATCHUP, "guess", "10.0.0.4").status_code == 403


def test_reaching_the_limit_is_logged_once_per_window(limits, caplog):
    with caplog.at_level("WARNING", logger="common.bearer_throttle"):
        for _ in range(6):
            _get(API, "guess", "10.0.0.6")
    lines = [r.getMessage() for r in caplog.records if r.name == "common.bearer_throttle"]
    assert len(lines) == 1, lines
    assert "3 wrong API_TOKEN tokens from 10.0.0.6" in lines[0] and "guess" not in lines[0]


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

"""Throttling of wrong bearer tokens on ``/api/`` (``API_TOKEN``) and the catch-up endpoint
(``REPLICATION_SECRET``), per client address (docs/security.md).

The token is checked first (in constant time) and the right one is always served: a throttle
that refused it would let any process that can reach the port lock every worker out of
catch-up with ten wrong guesses. Only wrong tokens are counted: after ``BEARER_MAX_FAILURES``
of them from one address within ``BEARER_FAILURE_WINDOW_SECONDS``, a wrong token from that
address is answered 429 with ``Retry-After`` (the rest of the window) instead of 401/403, and
reaching the limit is logged once per window. What it bounds is the cost of a guesser (no
per-guess log lines, a cheap answer); guessing itself is what the secrets' length and
entropy defeat (:func:`synapse_repl.security.weak_secrets`). A request without a token is not
a guess and is not counted. Counts live in Django's default cache, as the login throttle's
(:mod:`common.login_throttle`, whose counting this reuses under keys of its own).
"""
from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from common.login_throttle import LoginThrottle

logger = logging.getLogger(__name__)

KEY_PREFIX = "bearer-throttle:addr:"


class BearerThrottle(LoginThrottle):
    """Wrong bearer tokens per client address, in fixed windows."""

    @classmethod
    def from_settings(cls) -> "BearerThrottle":
        return cls(settings.BEARER_MAX_FAILURES, settings.BEARER_FAILURE_WINDOW_SECONDS)

    @staticmethod
    def address_keys(request: HttpRequest) -> list[str]:
        address = request.META.get("REMOTE_ADDR") or ""
        return [KEY_PREFIX + hashlib.sha256(address.encode()).hexdigest()[:32]]


def wrong_token(request: HttpRequest, refusal: JsonResponse, what: str) -> JsonResponse:
    """The answer to a wrong ``what`` token: ``refusal`` (401/403), counted against the client's
    address; 429 once the address is past the limit."""
    throttle = BearerThrottle.from_settings()
    if not throttle.enabled:
        return refusal
    keys = throttle.address_keys(request)
    if throttle.blocked(keys):
        return too_many_guesses(throttle, keys)
    if throttle.failed(keys):
        logger.warning("%d wrong %s tokens from %s: further wrong ones get 429 for %d s",
                       throttle.max_failures, what, request.META.get("REMOTE_ADDR") or "-",
                       throttle.retry_after(keys))
    return refusal


def too_many_guesses(throttle: BearerThrottle, keys: list[str]) -> JsonResponse:
    """429 for an address that sent too many wrong tokens (Matrix's M_LIMIT_EXCEEDED)."""
    wait = throttle.retry_after(keys)
    response = JsonResponse({"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": wait * 1000,
                             "error": f"too many wrong tokens from this address; try again in {wait} s"},
                            status=429)
    response["Retry-After"] = str(wait)
    return response

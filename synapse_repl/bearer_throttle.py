"""Throttling of wrong bearer tokens on ``/api/`` (``API_TOKEN``) and the catch-up endpoint
(``REPLICATION_SECRET``), per client address (docs/security.md).

Without it a client tried 229 tokens a second on one connection. After
``BEARER_MAX_FAILURES`` wrong tokens from one address within
``BEARER_FAILURE_WINDOW_SECONDS``, every bearer request from that address is answered 429
with ``Retry-After`` (the rest of the window), even one with the right token, so that guessing
learns nothing until the window has passed. A request without a token is not a guess and is
not counted. Counts live in Django's default cache, as the login throttle's
(:mod:`synapse_repl.login_throttle`, whose counting this reuses under keys of its own).
"""
from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Callable

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from .login_throttle import LoginThrottle

KEY_PREFIX = "bearer-throttle:addr:"


class BearerThrottle(LoginThrottle):
    """Wrong bearer tokens per client address, in fixed windows."""

    def __init__(self, max_failures: int, window_seconds: float, cache: Any = None,
                 timer: Callable[[], float] = time.time) -> None:
        super().__init__(max_failures, window_seconds, cache)
        self.timer = timer

    @classmethod
    def from_settings(cls) -> "BearerThrottle":
        return cls(settings.BEARER_MAX_FAILURES, settings.BEARER_FAILURE_WINDOW_SECONDS)

    @property
    def enabled(self) -> bool:
        return self.max_failures > 0

    @staticmethod
    def address_keys(request: HttpRequest) -> list[str]:
        address = request.META.get("REMOTE_ADDR") or ""
        return [KEY_PREFIX + hashlib.sha256(address.encode()).hexdigest()[:32]]

    def failed(self, keys: list[str]) -> None:
        now = self.timer()
        for key in keys:  # when this window started, for Retry-After
            self.cache.add(key + ":since", now, timeout=self.window_seconds)
        super().failed(keys)

    def retry_after(self, keys: list[str]) -> int:
        """Whole seconds until the address's window ends (at least 1)."""
        starts = self.cache.get_many([k + ":since" for k in keys]).values()
        end = max((s + self.window_seconds for s in starts), default=self.timer() + self.window_seconds)
        return max(1, math.ceil(end - self.timer()))


def too_many_guesses(throttle: BearerThrottle, keys: list[str]) -> JsonResponse:
    """429 for an address that sent too many wrong tokens (Matrix's M_LIMIT_EXCEEDED)."""
    wait = throttle.retry_after(keys)
    response = JsonResponse({"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": wait * 1000,
                             "error": f"too many wrong tokens from this address; try again in {wait} s"},
                            status=429)
    response["Retry-After"] = str(wait)
    return response

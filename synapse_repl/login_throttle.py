"""Login throttling for the admin and dashboard login (docs/security.md).

An authentication backend in front of Django's ``ModelBackend``: after ``LOGIN_MAX_FAILURES``
failed logins from one client address, or for one username, within
``LOGIN_FAILURE_WINDOW_SECONDS``, every further attempt for that address or username fails —
even with the right password — until the window has passed. It counts in Django's cache
(the default cache: per process, which is what the one web process needs; point
``CACHES`` at Redis to share the counts between several web processes). Every caller of
``django.contrib.auth.authenticate`` is covered, not just one form.
"""
from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import caches
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

KEY_PREFIX = "login-throttle:"


def _key(kind: str, value: str) -> str:
    # Hashed: usernames may hold characters some cache backends refuse in keys.
    return KEY_PREFIX + kind + ":" + hashlib.sha256(value.encode()).hexdigest()[:32]


class LoginThrottle:
    """Counts failed logins per client address and per username in fixed windows."""

    def __init__(self, max_failures: int, window_seconds: float, cache: Any = None) -> None:
        self.max_failures = max_failures
        self.window_seconds = window_seconds
        self.cache = cache if cache is not None else caches["default"]

    @classmethod
    def from_settings(cls) -> "LoginThrottle":
        return cls(settings.LOGIN_MAX_FAILURES, settings.LOGIN_FAILURE_WINDOW_SECONDS)

    @staticmethod
    def keys(request: HttpRequest | None, username: str | None) -> list[str]:
        keys = []
        address = request.META.get("REMOTE_ADDR") if request is not None else None
        if address:
            keys.append(_key("addr", address))
        if username:
            keys.append(_key("user", username.lower()))
        return keys

    def blocked(self, keys: list[str]) -> bool:
        counts = self.cache.get_many(keys)
        return any(count >= self.max_failures for count in counts.values())

    def failed(self, keys: list[str]) -> None:
        for key in keys:
            # add() starts the window; incr() keeps its expiry.
            if not self.cache.add(key, 1, timeout=self.window_seconds):
                try:
                    self.cache.incr(key)
                except ValueError:  # expired in between: a new window
                    self.cache.add(key, 1, timeout=self.window_seconds)

    def succeeded(self, username: str) -> None:
        self.cache.delete(_key("user", username.lower()))


class ThrottledModelBackend(ModelBackend):
    """``ModelBackend`` that refuses to check passwords for throttled addresses/usernames."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs: Any) -> Any:
        if settings.LOGIN_MAX_FAILURES <= 0:
            return super().authenticate(request, username, password, **kwargs)
        throttle = LoginThrottle.from_settings()
        keys = throttle.keys(request, username)
        if throttle.blocked(keys):
            # PermissionDenied stops authenticate() here: no other backend is tried.
            raise PermissionDenied("too many failed logins")
        user = super().authenticate(request, username, password, **kwargs)
        if user is None:
            throttle.failed(keys)
        elif username:
            throttle.succeeded(username)
        return user

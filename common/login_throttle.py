"""Login throttling for the admin and dashboard login (docs/security.md).

An authentication backend in front of Django's ``ModelBackend``: after ``LOGIN_MAX_FAILURES``
failed logins for one username from one client address within
``LOGIN_FAILURE_WINDOW_SECONDS``, further attempts for that (address, username) pair fail,
even with the right password, until the window has passed. The key is the pair, not the
username alone, so that nobody can lock the operator out of ``admin`` from an address of
their own; nor the address alone, so that one address guessing one username does not lock
out the other users behind it. The login form (:class:`ThrottledAdminAuthenticationForm`)
tells a throttled user so, and for how long; reaching the limit is logged (WARNING: address
and username, never the password). Counts live in Django's cache (the default cache: per
process, which is what the one web process needs; point ``CACHES`` at Redis to share them
between several web processes). Every caller of ``django.contrib.auth.authenticate`` is
covered, not just one form.
"""
from __future__ import annotations

import hashlib
import logging
import math
import time
from typing import Any, Callable

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.backends import ModelBackend
from django.core.cache import caches
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest

logger = logging.getLogger(__name__)

KEY_PREFIX = "login-throttle:"


def _key(kind: str, value: str) -> str:
    # Hashed: usernames may hold characters some cache backends refuse in keys.
    return KEY_PREFIX + kind + ":" + hashlib.sha256(value.encode()).hexdigest()[:32]


def client_address(request: HttpRequest | None) -> str:
    return (request.META.get("REMOTE_ADDR") or "") if request is not None else ""


class LoginThrottle:
    """Counts failures per key in fixed windows (the window starts at a key's first failure)."""

    def __init__(self, max_failures: int, window_seconds: float, cache: Any = None,
                 timer: Callable[[], float] = time.time) -> None:
        self.max_failures = max_failures
        self.window_seconds = window_seconds
        self.cache = cache if cache is not None else caches["default"]
        self.timer = timer

    @classmethod
    def from_settings(cls) -> "LoginThrottle":
        return cls(settings.LOGIN_MAX_FAILURES, settings.LOGIN_FAILURE_WINDOW_SECONDS)

    @property
    def enabled(self) -> bool:
        return self.max_failures > 0

    @staticmethod
    def keys(request: HttpRequest | None, username: str | None) -> list[str]:
        """The one key of the (client address, username) pair."""
        return [_key("pair", client_address(request) + "\n" + (username or "").lower())]

    def blocked(self, keys: list[str]) -> bool:
        counts = self.cache.get_many(keys)
        return any(count >= self.max_failures for count in counts.values())

    def failed(self, keys: list[str]) -> bool:
        """Count one failure; True when it is the one that reaches the limit (to log once)."""
        now = self.timer()
        reached = False
        for key in keys:
            # add() starts the window (and notes when, for retry_after); incr() keeps its expiry.
            self.cache.add(key + ":since", now, timeout=self.window_seconds)
            if self.cache.add(key, 1, timeout=self.window_seconds):
                count = 1
            else:
                try:
                    count = self.cache.incr(key)
                except ValueError:  # expired in between: a new window
                    self.cache.add(key, 1, timeout=self.window_seconds)
                    count = 1
            reached = reached or count == self.max_failures
        return reached

    def succeeded(self, keys: list[str]) -> None:
        self.cache.delete_many(keys + [key + ":since" for key in keys])

    def retry_after(self, keys: list[str]) -> int:
        """Whole seconds until the keys' window ends (at least 1)."""
        starts = self.cache.get_many([k + ":since" for k in keys]).values()
        end = max((s + self.window_seconds for s in starts), default=self.timer() + self.window_seconds)
        return max(1, math.ceil(end - self.timer()))


def throttled_message(wait: int) -> str:
    return (f"Too many failed logins for this username from your address: try again in {wait} s "
            f"(after {settings.LOGIN_MAX_FAILURES} failures, logins are refused for "
            f"{settings.LOGIN_FAILURE_WINDOW_SECONDS} s).")


class ThrottledModelBackend(ModelBackend):
    """``ModelBackend`` that refuses to check passwords for a throttled (address, username)."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs: Any) -> Any:
        throttle = LoginThrottle.from_settings()
        if not throttle.enabled:
            return super().authenticate(request, username, password, **kwargs)
        keys = throttle.keys(request, username)
        if throttle.blocked(keys):
            # PermissionDenied stops authenticate() here: no other backend is tried.
            raise PermissionDenied("too many failed logins")
        user = super().authenticate(request, username, password, **kwargs)
        if user is None:
            if throttle.failed(keys):
                logger.warning("login throttled: %d failed logins for username %r from %s; refused "
                               "for %d s", throttle.max_failures, username, client_address(request) or "-",
                               throttle.retry_after(keys))
        else:
            throttle.succeeded(keys)
        return user


class ThrottledAdminAuthenticationForm(AdminAuthenticationForm):
    """The admin login form: a throttled (address, username) is told so and for how long, not
    shown Django's "enter a correct username and password"."""

    error_messages = {**AdminAuthenticationForm.error_messages, "throttled": "%(message)s"}

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except ValidationError:
            # Refused: because this pair is (now) throttled, or for a wrong password.
            throttle = LoginThrottle.from_settings()
            username = self.cleaned_data.get("username")
            if throttle.enabled and username:
                keys = throttle.keys(self.request, username)
                if throttle.blocked(keys):
                    raise ValidationError(
                        self.error_messages["throttled"], code="throttled",
                        params={"message": throttled_message(throttle.retry_after(keys))}) from None
            raise

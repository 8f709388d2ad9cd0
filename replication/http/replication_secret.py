"""``REPLICATION_SECRET``: who may call the ``/_synapse/replication/`` HTTP endpoints
(docs/security.md).

The check lives on the views themselves (:func:`replication_secret_required`), so no way of
dressing a path can reach a view around it; the middleware is a second fence that also
answers 401 for unknown URLs under the prefix, so nothing is learnt without the secret. It
looks at ``path_info``, the path URL resolution uses, never at ``path`` (which carries the
ASGI ``root_path``). A process with no secret configured serves no replication data at all.

Stream data includes private events, to-device messages and account data, so when a secret
is configured every request under the prefix must carry exactly one
``Authorization: Bearer <secret>`` header, as with Synapse's ``worker_replication_secret``:
missing → 401 ``M_MISSING_TOKEN``; more than one, another scheme or another secret → 403
``M_FORBIDDEN``. The comparison takes constant time (:func:`hmac.compare_digest`). Wrong
secrets are counted per client address; past ``BEARER_MAX_FAILURES`` the address's wrong
secrets get 429, while the right secret is always served, from any address
(:mod:`common.bearer_throttle`).
"""
from __future__ import annotations

import functools
import hmac
from typing import Any, Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

from common.bearer_throttle import wrong_token

PREFIX = "/_synapse/replication/"


def bearer_header(secret: str) -> dict[str, str]:
    """The header a client sends (empty when no secret is configured)."""
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def check_authorization(values: list[str], secret: str) -> JsonResponse | None:
    """``None`` if the ``Authorization`` header values admit the request, else the refusal."""
    if not values:
        return JsonResponse({"errcode": "M_MISSING_TOKEN", "error": "Missing Authorization header"},
                            status=401)
    if len(values) > 1:
        return JsonResponse({"errcode": "M_FORBIDDEN", "error": "Too many Authorization headers"},
                            status=403)
    scheme, _, received = values[0].partition(" ")
    # Compare the whole secret even for a wrong scheme, so timing tells nothing either way.
    same = hmac.compare_digest(received.encode(), secret.encode())
    if scheme != "Bearer" or not same:
        return JsonResponse({"errcode": "M_FORBIDDEN", "error": "Invalid Authorization header"},
                            status=403)
    return None


def _authorization_values(request: HttpRequest) -> list[str]:
    # Django folds repeated headers into one META value joined by "," (ASGI) and a Bearer
    # secret never contains a comma (we generate URL-safe ones; document it for others).
    raw = request.META.get("HTTP_AUTHORIZATION")
    if raw is None:
        return []
    return [part.strip() for part in raw.split(",")]


NO_SECRET_MESSAGE = ("REPLICATION_SECRET is not set on this process, so it serves no replication "
                     "data: set REPLICATION_SECRET to the same long random string in every process "
                     "of the cluster")


def refusal(request: HttpRequest) -> JsonResponse | None:
    """``None`` if ``request`` carries this process's secret, else the answer that refuses it."""
    secret = getattr(settings, "REPLICATION_SECRET", "")
    if not secret:
        return JsonResponse({"errcode": "M_UNKNOWN", "error": NO_SECRET_MESSAGE}, status=503)
    values = _authorization_values(request)
    refused = check_authorization(values, secret)
    if refused is None or not values:
        return refused
    # A wrong secret is a guess: counted per address, answered 429 past the limit.
    return wrong_token(request, refused, "REPLICATION_SECRET")


def replication_secret_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Every replication view is wrapped in this: the secret is checked where the data is."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = refusal(request)
        return refused if refused is not None else view(request, *args, **kwargs)

    wrapper.requires_replication_secret = True  # type: ignore[attr-defined]  (checked by a test)
    return wrapper


class ReplicationSecretMiddleware(MiddlewareMixin):
    """Refuses requests under ``/_synapse/replication/`` without the secret, known URL or not.

    (``MiddlewareMixin``: runs on the async path too, without a thread hop.)
    """

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if request.path_info.startswith(PREFIX):
            return refusal(request)
        return None

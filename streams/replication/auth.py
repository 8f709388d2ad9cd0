"""``REPLICATION_SECRET``: who may call the ``/_synapse/replication/`` HTTP endpoints
(docs/security.md).

Stream data includes private events, to-device messages and account data, so when a secret
is configured every request under the prefix must carry exactly one
``Authorization: Bearer <secret>`` header, as with Synapse's ``worker_replication_secret``:
missing → 401 ``M_MISSING_TOKEN``; more than one, another scheme or another secret → 403
``M_FORBIDDEN``. The comparison takes constant time (:func:`hmac.compare_digest`).
"""
from __future__ import annotations

import hmac
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

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


class ReplicationSecretMiddleware(MiddlewareMixin):
    """Refuses ``/_synapse/replication/`` requests without the secret, when one is set.

    (``MiddlewareMixin``: runs on the async path too, without a thread hop.)
    """

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        secret = getattr(settings, "REPLICATION_SECRET", "")
        if secret and request.path.startswith(PREFIX):
            return check_authorization(_authorization_values(request), secret)
        return None

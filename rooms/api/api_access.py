"""Who may call /api/: a bearer token equal to the API_TOKEN setting, or a staff session.
The token is checked first and the right one is always served; wrong ones are counted per
address and, past the limit, answered 429 (:mod:`common.bearer_throttle`)."""
from __future__ import annotations

import functools
import hmac
from typing import Any, Callable

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from common.bearer_throttle import wrong_token


def api_view(view: Callable[..., Any]) -> Callable[..., Any]:
    """GET only, authenticated; errors are JSON."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if request.method != "GET":
            return JsonResponse({"error": "only GET is allowed"}, status=405)
        header = request.headers.get("Authorization", "")
        token = getattr(settings, "API_TOKEN", "")
        if header.startswith("Bearer "):
            if not token or not hmac.compare_digest(header[7:].encode(), token.encode()):
                return wrong_token(request, JsonResponse({"error": "invalid API token"}, status=401), "API_TOKEN")
        elif not (request.user.is_authenticated and request.user.is_staff):
            return JsonResponse({"error": "authentication required: 'Authorization: Bearer <API_TOKEN>' "
                                          "or a staff session"}, status=401)
        return view(request, *args, **kwargs)

    return wrapper

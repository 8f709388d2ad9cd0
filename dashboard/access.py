"""Who may see what: staff only (Django auth), and /metrics also from listed networks."""
from __future__ import annotations

import functools
import ipaddress
from typing import Callable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse


def is_staff(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def staff_json(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """JSON views answer 403 with a message (not a login page) to anybody but staff."""
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not is_staff(request.user):
            return JsonResponse({"error": "sign in as a staff user (/admin/login/)"}, status=403)
        return view(request, *args, **kwargs)
    return wrapper


@functools.lru_cache(maxsize=8)
def parse_networks(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    networks = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"METRICS_ALLOWED_NETWORKS: {part!r} is not an address or network (e.g. 10.0.0.0/8)"
            ) from None
    return tuple(networks)


def metrics_allowed(request: HttpRequest) -> bool:
    if is_staff(request.user):
        return True
    networks = parse_networks(settings.DASHBOARD["METRICS_ALLOWED_NETWORKS"])
    if not networks:
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in networks)

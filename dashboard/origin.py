"""The live WebSocket admits only pages of this very origin: scheme, host *and* port.

Channels' ``AllowedHostsOriginValidator`` compares the ``Origin`` header's host with
``ALLOWED_HOSTS`` and ignores the port, so a page served by anything else on the host (another
port) could open ``/ws/live/`` with the operators' session cookie (cookies are per host, not
per port) and read the live feed. Here the ``Origin`` must equal the origin of the page that
is being served: the ``Host`` header the browser sent (itself one of ``ALLOWED_HOSTS``), with
the scheme pages are served over. A refused handshake is answered 403 (as Channels does).

The page's scheme: ``https`` when the socket came over TLS (``wss``), when
``SECURE_PROXY_SSL_HEADER`` says the proxy in front received HTTPS, or when every page is
redirected to HTTPS anyway (``SECURE_SSL_REDIRECT``, the production profile); else ``http``.
(daphne's WebSocket scope carries no scheme of its own behind a proxy.)
"""
from __future__ import annotations

from typing import Any, Iterable
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_origin(value: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an ``Origin`` or ``scheme://Host`` value (``None``: not one)."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username is not None:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def same_origin(origin: str | None, host: str | None, scheme: str, allowed_hosts: Iterable[str]) -> bool:
    """Whether a socket whose handshake carried ``Origin: origin`` and ``Host: host`` comes
    from a page of this server (served over ``scheme``, to a host in ``allowed_hosts``)."""
    if not origin or not host:
        return False
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, list(allowed_hosts)):
        return False
    page = parse_origin(f"{scheme}://{host}")
    return page is not None and parse_origin(origin) == page


def page_scheme(scope: dict[str, Any], headers: dict[bytes, bytes]) -> str:
    if scope.get("scheme") in ("wss", "https"):
        return "https"
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, expected = proxy
        # "HTTP_X_FORWARDED_PROTO" -> b"x-forwarded-proto"
        header = name.removeprefix("HTTP_").replace("_", "-").lower().encode()
        if headers.get(header, b"").decode("latin-1").split(",")[0].strip() == expected:
            return "https"
    return "https" if getattr(settings, "SECURE_SSL_REDIRECT", False) else "http"


class SameOriginValidator:
    """ASGI middleware: a WebSocket handshake from another origin is refused (403)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            headers = dict(scope.get("headers", []))
            origin = headers.get(b"origin", b"").decode("latin-1") or None
            host = headers.get(b"host", b"").decode("latin-1") or None
            if not same_origin(origin, host, page_scheme(scope, headers), settings.ALLOWED_HOSTS):
                return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)

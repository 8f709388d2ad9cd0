"""dashboard/origin.py: a WebSocket's Origin must be the page's own (scheme, host, port).
(The real handshake: tests/synapse_repl/test_web_hardening.py.)"""
from __future__ import annotations

from dashboard.origin import parse_origin, same_origin

HOSTS = ["localhost", "127.0.0.1", "[::1]", "example.org"]


def test_parse_origin_fills_default_ports():
    assert parse_origin("http://Example.org") == ("http", "example.org", 80)
    assert parse_origin("https://example.org") == ("https", "example.org", 443)
    assert parse_origin("https://example.org:8443") == ("https", "example.org", 8443)
    for bad in ("null", "", "ftp://example.org", "http://example.org:99999", "http://u@example.org",
                "http://example.org/path"):
        assert parse_origin(bad) is None, bad


def test_same_origin_needs_scheme_host_and_port():
    assert same_origin("http://localhost:8000", "localhost:8000", "http", HOSTS)
    assert same_origin("https://example.org", "example.org", "https", HOSTS)
    assert same_origin("https://example.org:443", "example.org", "https", HOSTS)
    assert not same_origin("http://localhost:8001", "localhost:8000", "http", HOSTS)  # other port
    assert not same_origin("http://localhost", "localhost:8000", "http", HOSTS)
    assert not same_origin("http://example.org", "example.org", "https", HOSTS)  # other scheme
    assert not same_origin("http://127.0.0.1:8000", "localhost:8000", "http", HOSTS)  # other host
    assert not same_origin("http://evil.example:8000", "evil.example:8000", "http", HOSTS)  # not allowed
    assert same_origin("http://[::1]:8000", "[::1]:8000", "http", HOSTS)
    assert not same_origin("http://[::1]:8001", "[::1]:8000", "http", HOSTS)
    assert not same_origin(None, "localhost:8000", "http", HOSTS)
    assert not same_origin("http://localhost:8000", None, "http", HOSTS)


def test_page_scheme_behind_a_tls_proxy_or_in_production(settings):
    from dashboard.origin import page_scheme

    settings.SECURE_SSL_REDIRECT = False
    assert page_scheme({"type": "websocket"}, {}) == "http"
    assert page_scheme({"type": "websocket", "scheme": "wss"}, {}) == "https"
    # a proxy's X-Forwarded-Proto counts only when SECURE_PROXY_SSL_HEADER says to trust it
    assert page_scheme({"type": "websocket"}, {b"x-forwarded-proto": b"https"}) == "http"
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert page_scheme({"type": "websocket"}, {b"x-forwarded-proto": b"https"}) == "https"
    assert page_scheme({"type": "websocket"}, {b"x-forwarded-proto": b"http"}) == "http"
    settings.SECURE_SSL_REDIRECT = True  # every page is served over HTTPS
    assert page_scheme({"type": "websocket"}, {}) == "https"

"""``runservice`` believes ``X-Forwarded-For`` only with ``PROXY_HEADERS=1`` (docs/security.md):
the client address decides who ``/metrics`` admits and what the throttles count, so a header
any client can send must not move it unless the operator says a proxy sets it."""
from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from tests.synapse_repl.test_web_hardening import Service

#: a network no test client is in: only a believed X-Forwarded-For puts a request there
PROXIED_NETWORK = "10.9.0.0/16"


def _metrics_status(service: Service, forwarded_for: str) -> int:
    request = urllib.request.Request(f"{service.base}/metrics", headers={"X-Forwarded-For": forwarded_for})
    try:
        return urllib.request.urlopen(request, timeout=30).status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("proxy_headers, expected", [("", 403), ("1", 200)])
def test_x_forwarded_for_is_believed_only_with_proxy_headers(tmp_path, proxy_headers, expected):
    service = Service({"DEMO": "0", "PROXY_HEADERS": proxy_headers,
                       "METRICS_ALLOWED_NETWORKS": PROXIED_NETWORK}, tmp_path / "var")
    migrated = service.manage("migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    service.start()
    try:
        assert _metrics_status(service, "10.9.1.1") == expected, service.output()
        assert _metrics_status(service, "192.0.2.1") == 403  # outside the network either way
    finally:
        service.stop()

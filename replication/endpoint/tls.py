"""TLS for the TCP replication endpoint, with Python's :mod:`ssl` (docs/security.md).

The endpoint speaks TLS when ``REPLICATION_TLS_CERT`` and ``REPLICATION_TLS_KEY`` are set;
a worker speaks TLS when ``REPLICATION_TLS_CA`` is set (the certificates it trusts for the
endpoint: the endpoint's own certificate when it is self-signed) or ``REPLICATION_TLS`` is on
(the system's trust store). The worker always verifies the certificate and the host name it
connects to; there is no switch to turn verification off.
"""
from __future__ import annotations

import ssl

from django.core.exceptions import ImproperlyConfigured

from streams.conf import repl_setting


def server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def client_context(ca: str | None) -> ssl.SSLContext:
    """Verifies the server's certificate (against ``ca``, or the system store) and name."""
    context = ssl.create_default_context(cafile=ca or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def server_context_from_settings() -> ssl.SSLContext | None:
    cert, key = repl_setting("REPLICATION_TLS_CERT"), repl_setting("REPLICATION_TLS_KEY")
    if not cert and not key:
        return None
    if not (cert and key):
        raise ImproperlyConfigured("REPLICATION_TLS_CERT and REPLICATION_TLS_KEY go together")
    try:
        return server_context(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ImproperlyConfigured(f"REPLICATION_TLS_CERT/_KEY: cannot load {cert}, {key}: {e}") from e


def client_context_from_settings() -> ssl.SSLContext | None:
    ca = repl_setting("REPLICATION_TLS_CA")
    if not ca and not repl_setting("REPLICATION_TLS"):
        return None
    try:
        return client_context(ca)
    except (OSError, ssl.SSLError) as e:
        raise ImproperlyConfigured(f"REPLICATION_TLS_CA: cannot load {ca}: {e}") from e

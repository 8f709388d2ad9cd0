"""Who may open a TCP replication connection, decided before any byte is read or written
(docs/security.md).

:class:`PeerPolicy` (no I/O) holds the rules: the peer's address must be in
``REPLICATION_ALLOWED_NETWORKS`` (default loopback only), and at most
``REPLICATION_MAX_CONNECTIONS`` connections in all and
``REPLICATION_MAX_CONNECTIONS_PER_ADDRESS`` per peer address may be open.

:class:`AdmissionProtocol` applies them to each accepted socket: a peer outside the networks
is closed without a byte; a peer over a cap gets ``ERROR Too many connections`` and is closed;
everybody else is upgraded to TLS if configured (after the check, so a refused peer never
sees a TLS handshake either) and handed to the replication protocol, every event then passed
through as is.
"""
from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import socket
import ssl
from typing import Any, Callable

from django.core.exceptions import ImproperlyConfigured

from ..conf import repl_setting

logger = logging.getLogger(__name__)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Answers of :meth:`PeerPolicy.admit`.
ADMITTED = "admitted"
NOT_ALLOWED = "address not allowed"
TOO_MANY = "too many connections"
TOO_MANY_FROM_ADDRESS = "too many connections from this address"


def parse_networks(text: str) -> list[IPNetwork]:
    """``"127.0.0.0/8, ::1/128"`` → networks; ImproperlyConfigured names a bad entry."""
    networks = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError as e:
            raise ImproperlyConfigured(f"REPLICATION_ALLOWED_NETWORKS: {e}") from None
    return networks


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:127.0.0.1 on a dual-stack socket
    return address


class PeerPolicy:
    """Allowed networks and connection caps, counting the connections it admitted."""

    def __init__(self, networks: list[IPNetwork], max_connections: int, max_per_address: int) -> None:
        self.networks = networks
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.open: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.refused: collections.Counter[str] = collections.Counter()

    @classmethod
    def from_settings(cls) -> "PeerPolicy":
        return cls(parse_networks(repl_setting("REPLICATION_ALLOWED_NETWORKS")),
                   int(repl_setting("REPLICATION_MAX_CONNECTIONS")),
                   int(repl_setting("REPLICATION_MAX_CONNECTIONS_PER_ADDRESS")))

    def allowed(self, host: str) -> bool:
        try:
            address = _address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def admit(self, host: str) -> str:
        """:data:`ADMITTED` (and counted until :meth:`release`) or the reason for refusing."""
        if not self.allowed(host):
            verdict = NOT_ALLOWED
        elif self.total >= self.max_connections:
            verdict = TOO_MANY
        elif self.open[host] >= self.max_per_address:
            verdict = TOO_MANY_FROM_ADDRESS
        else:
            self.open[host] += 1
            self.total += 1
            return ADMITTED
        self.refused[verdict] += 1
        return verdict

    def release(self, host: str) -> None:
        self.total -= 1
        self.open[host] -= 1
        if self.open[host] <= 0:
            del self.open[host]


class AdmissionProtocol(asyncio.Protocol):
    """Decides on one accepted socket, then passes every event to ``make_protocol()``'s."""

    def __init__(self, policy: PeerPolicy, make_protocol: Callable[[], asyncio.Protocol],
                 ssl_context: ssl.SSLContext | None = None, send_buffer: int = 0) -> None:
        self.policy = policy
        self.make_protocol = make_protocol
        self.ssl_context = ssl_context
        #: ``REPLICATION_SEND_BUFFER_BYTES``: a fixed kernel send buffer per connection (0:
        #: the kernel's autotuning, which lets a peer that does not read pin up to
        #: ``net.ipv4.tcp_wmem``'s maximum, 4 MiB by default, before our own queue even starts)
        self.send_buffer = send_buffer
        self.inner: asyncio.Protocol | None = None
        self.host: str | None = None  # set while counted by the policy
        self.upgrade: asyncio.Task | None = None
        #: Data decrypted before the TLS hand-over finished (a client speaks right after its
        #: handshake, maybe in the same packet): delivered first, in order.
        self.early: list[bytes] = []
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if peer else "?"
        verdict = self.policy.admit(host)
        if verdict == NOT_ALLOWED:
            logger.warning("replication: refused %s: %s", host, verdict)
            transport.close()  # nothing written: the peer learns nothing about us
            return
        if verdict != ADMITTED:
            logger.warning("replication: refused %s: %s", host, verdict)
            if self.ssl_context is None:  # (a TLS client could not read it)
                transport.write(b"ERROR Too many connections\n")  # type: ignore[attr-defined]
            transport.close()
            return
        self.host = host
        if self.send_buffer > 0:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        if self.ssl_context is None:
            self._hand_over(transport)
        else:
            transport.pause_reading()  # type: ignore[attr-defined]
            self.upgrade = asyncio.create_task(self._start_tls(transport))

    async def _start_tls(self, transport: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls_transport = await loop.start_tls(transport, self, self.ssl_context, server_side=True)
        except (OSError, ssl.SSLError, ConnectionError, asyncio.TimeoutError) as e:
            logger.warning("replication: TLS handshake with %s failed: %s", self.host, e)
            transport.abort()
            self._release()
            return
        if tls_transport is None or self.lost:  # the peer went away meanwhile
            self._release()
            return
        self._hand_over(tls_transport)

    def _hand_over(self, transport: asyncio.BaseTransport) -> None:
        self.inner = self.make_protocol()
        self.inner.connection_made(transport)
        early, self.early = self.early, []
        for data in early:
            self.inner.data_received(data)

    def _release(self) -> None:
        if self.host is not None:
            self.policy.release(self.host)
            self.host = None

    # -- passed through ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._release()
        if self.inner is not None:
            self.inner.connection_lost(exc)
